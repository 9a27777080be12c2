"""The train stage: every arm x seed of the plan, resumable and budgeted, on each GPU of the machine; and what
comes back.

Whole seed pairs go to the GPUs round-robin (`--gpus`, default all visible), each run with CUDA_VISIBLE_DEVICES
set to its GPU (one GPU: the environment as it is). On each GPU runs go `budget.parallel` at a time, a seed's pair
together; a run an earlier invocation left is resumed (`--resume`, exactly), a finished one is skipped. On a fresh
start each GPU's first run goes alone until its first step row (it fills the compile caches the others then
read), and that GPU's number at a time is cut to what it holds at the leader's measured memory; the disk, shared,
bounds the runs of all GPUs together. When the budget is spent every run gets SIGTERM (it ends its step, saves it
and exits; the next invocation resumes it), then SIGINT to the group (it keeps its last saved state), then SIGKILL.
Each GPU's starts, exits and memory fit go to runs/gpu<i>.log. `pack` writes what the repository keeps (run.json,
steps.jsonl, eval rows, cards, the runs' and GPUs' logs, base report; never weights or optimizer state) into
<out>/<plan name>.tar.gz; `unpack` writes it into a new docs folder.
"""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from launch.base import build_base, snapshot_path, write_tasks
from launch.plan import ROOT, Plan
from rundir import archive as rundir_archive
from rundir.run_json import read_run_json

BASE_KEPT = ("base_manifest.json", "tiny_base.json", "base_report.json")
Run = tuple[Path, str, int | None]  # run directory, arm, seed


def run_dir(work: Path, name: str) -> Path:
    return work / "runs" / name


def max_steps(plan: Plan, smoke: bool) -> int:
    args = plan.run_args.get("smoke", []) if smoke else []
    return int(args[args.index("--max_steps") + 1]) if "--max_steps" in args else plan.steps


def finished(run: Path, steps: int) -> bool:
    from rundir.files import read_jsonl, steps_path

    if not steps_path(run).is_file():
        return False
    return (
        any(r.get("step") == steps for r in read_jsonl(steps_path(run), torn_tail="drop"))
        and (run / f"results/eval_step{steps:03d}.jsonl").is_file()
    )


def prepare(plan: Plan, work: Path, smoke: bool, gguf: Path | None) -> list[str]:
    """The trainer arguments every run shares: the base, and the base report's choice (this work folder's, or
    the committed one under the plan's results, its snapshot rewritten and checked against its sha256)."""
    work.mkdir(parents=True, exist_ok=True)
    if plan.base_report is None:  # the recipe's own snapshot, temperature and cap; the base built by `base`
        base = build_base(plan, work, None, smoke, gguf) if smoke else work / "base"
        if not smoke and not (base / "tiny_base.json").is_file():
            raise SystemExit(f"error: {base}: no complete build; run the base stage first, on the same machine "
                             "(the weights do not come back)")  # fmt: skip
        return ["--model_name_or_path", str(base)]
    if not (work / "choice.json").is_file():
        committed = ROOT / plan.results / "base/base_report.json"
        if not committed.is_file():
            raise SystemExit(
                f"error: {work / 'choice.json'}: missing and {committed} too; run the base stage first"
            )
        choice = json.loads(committed.read_text())["choice"]
        choice.setdefault("tasks", choice.get("family"))
        if (sha := write_tasks(plan, work, choice["tasks"])) != choice["snapshot_sha256"]:
            raise SystemExit(f"error: {snapshot_path(work, choice['tasks'])}: sha256 {sha}, the base report chose "
                             f"{choice['snapshot_sha256']}")  # fmt: skip
        (work / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    choice = json.loads((work / "choice.json").read_text())
    base = build_base(plan, work, choice.get("model"), smoke, gguf)
    return ["--model_name_or_path", str(base), "--snapshot_path", str(snapshot_path(work, choice["tasks"])),
            "--snapshot_sha256", choice["snapshot_sha256"], "--temperature", str(choice["temperature"]),
            "--max_completion_length", str(choice["cap"])]  # fmt: skip


def step_rows(run: Path) -> int:
    """How many step rows a running run has written (a torn last row counts: it is only a progress figure)."""
    path = run / "results/steps.jsonl"
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


def eval_args(plan: Plan, steps: int) -> list[str]:
    """The trainer's evaluation cadence: the plan's `eval.steps` alone (the steps its report reads), else every
    `eval.every` steps."""
    if listed := plan.eval.get("steps"):
        return ["--eval_every", "1", "--eval_at_steps", *(str(s) for s in listed if s <= steps)]
    return ["--eval_every", str(plan.eval["every"])]


def shared_step0(work: Path) -> Path | None:
    """A run of this launch that evaluated the base itself (not a copy): its step-0 rows, else None."""
    for rows in sorted((work / "runs").glob("*/results/eval_step000.jsonl")):
        if not read_run_json(rows.parent.parent).get("config", {}).get("step0_eval_from"):
            return rows
    return None


class Timeline:
    """runs/timeline.jsonl: what the launcher saw, with wall-clock times: each run's start and exit, each new
    step row (and how many runs were going then), and the GPU's utilisation; the report's lease accounting
    (launch/lease.py) reads it."""

    def __init__(self, path: Path, gpu: bool, every_s: float = 15.0):
        self.path, self.gpu, self.every_s = path, gpu, every_s
        self.rows: dict[str, int] = {}
        self.last_gpu = 0.0

    def event(self, kind: str, **fields) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"t": round(time.time(), 1), "event": kind, **fields}) + "\n")

    def poll(self, running: list[tuple[Path, subprocess.Popen]]) -> None:
        for run, _ in running:
            if (n := step_rows(run)) > self.rows.get(run.name, 0):
                self.rows[run.name] = n
                self.event("step", run=run.name, rows=n, live=len(running))
        if self.gpu and time.time() - self.last_gpu >= self.every_s:
            self.last_gpu = time.time()
            try:
                smi = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=10)  # fmt: skip
                util = [
                    [float(x) for x in line.split(",")] for line in smi.stdout.splitlines() if "," in line
                ]
            except (OSError, subprocess.TimeoutExpired, ValueError):
                return
            self.event("gpu", util=[u for u, _ in util], memory_mib=[m for _, m in util], live=len(running))


def start_mps(work: Path) -> dict:
    """NVIDIA's MPS daemon for this launch's runs (kernels of several processes on the GPU at once instead of
    time slices; issue 60 measured it): its pipe and log folders under the work folder; the runs' environment."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(work / "mps/pipe"), "CUDA_MPS_LOG_DIRECTORY": str(work / "mps/log")}
    for d in env.values():
        Path(d).mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        ["nvidia-cuda-mps-control", "-d"], env={**os.environ, **env}, capture_output=True, text=True
    )
    if r.returncode != 0:
        raise SystemExit(
            f"error: nvidia-cuda-mps-control -d: exit {r.returncode}: {(r.stderr or r.stdout).strip()}"
        )
    print(f"MPS daemon started (pipe {env['CUDA_MPS_PIPE_DIRECTORY']})", flush=True)
    return env


def stop_mps(env: dict) -> None:
    subprocess.run(
        ["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True, text=True, timeout=30
    )


def drop_weights(run: Path) -> None:
    """A finished run's stepNNN/ and stateNNN/ on the GPU machine (the plan's budget.drop_finished_weights):
    they never come back, and sixteen 0.5B runs' 7.6 GB each would fill its disk before the last one saved."""
    dropped = [d for d in sorted(run.iterdir()) if d.is_dir() and re.fullmatch(r"(step|state)\d+", d.name)]
    for d in dropped:
        shutil.rmtree(d)
    print(f"{run.name}: finished; dropped {', '.join(d.name for d in dropped) or 'nothing'} (weights never leave the GPU machine)",
          flush=True)  # fmt: skip


def disk_fit(parallel: int, work: Path, base: Path) -> int:
    """At most `parallel` runs, as many as the disk holds when each stops and saves at the call's end: the save
    (bf16 weights and fp32 weights with AdamW's two moments, 14 bytes a parameter: 3.5x the float32 base's
    safetensors) in the free space. A run's earlier save is no credit: it is removed only after the new one is
    written (launch 1 of docs/experiment-qwen counted it, and two saves found the disk full)."""
    per_run = 3.5 * sum(f.stat().st_size for f in base.glob("*.safetensors"))
    if not per_run:
        return parallel
    free = shutil.disk_usage(work).free - 4 * 2**30
    fit = max(1, min(parallel, int(free // per_run)))
    print(
        f"disk: {free / 2**30:.0f} GiB free for saves of {per_run / 2**30:.1f} GiB: {fit} runs at a time",
        flush=True,
    )
    return fit


def visible_gpus() -> list[str]:
    """The GPUs the runs may use, as CUDA_VISIBLE_DEVICES names them: its own list where set, else nvidia-smi's
    indices; [] without GPUs."""
    if (listed := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return []
    return smi.stdout.split() if smi.returncode == 0 else []


def gpu_devices(n: int | None, smoke: bool) -> list[str | None]:
    """Each GPU's CUDA_VISIBLE_DEVICES for its runs: `n` of the visible GPUs (default all of them, one without
    any); [None] for one GPU, whose runs get the environment as it is."""
    visible = visible_gpus()
    n = (len(visible) or 1) if n is None else n
    if n < 1 or (n > max(len(visible), 1) and not smoke):  # --smoke runs on the CPU: any number of "GPUs"
        raise SystemExit(f"error: --gpus {n}: {len(visible)} GPUs visible")
    return [None] if n == 1 else [visible[i] if i < len(visible) else str(i) for i in range(n)]


def assign(runs: list[Run], n: int) -> list[list[Run]]:
    """The runs (seed-major) over `n` GPUs, whole seeds round-robin: a seed's pair shares one GPU (started
    together, the same neighbours), and no GPU holds more than one seed more than another."""
    seeds = list(dict.fromkeys(seed for _, _, seed in runs))
    return [[r for r in runs if seeds.index(r[2]) % n == i] for i in range(n)]


def gpu_memory_mib(pid: int, gpu: str | None = None) -> tuple[float, float] | None:
    """(this process's GPU memory, its GPU's total) in MiB from nvidia-smi, or None where it cannot say; `gpu`
    the GPU by nvidia-smi index or UUID (None: the first, the one-GPU launch)."""
    which = [] if gpu is None else [f"--id={gpu}"]
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", *which, "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [
        float(m) for p, m in (line.split(",") for line in apps.splitlines() if "," in line) if int(p) == pid
    ]
    return (used[0], float(total.split()[0])) if used and total.strip() else None


def fitting(parallel: int, leader_pid: int, share: float = 0.9, growth: float = 1.0, gpu: str | None = None,
            say=print, row_memory: tuple[float, float] | None = None) -> int:  # fmt: skip
    """At most `parallel` runs, as many as `share` of the leader's GPU (`gpu`, as gpu_memory_mib names it) holds
    at the leader's measured memory times `growth` (the plan's budget.memory_growth: what a run holds later over
    what it held at its first step). The leader's memory is its first step row's where given (under MPS nvidia-smi
    lists the MPS server, not its clients), else nvidia-smi's."""
    memory = row_memory or gpu_memory_mib(leader_pid, gpu)
    if memory is None:
        return parallel
    used, total = memory
    fit = max(1, min(parallel, int(share * total // (used * growth))))
    say(f"leader holds {used:.0f} of {total:.0f} MiB (x{growth} later): {fit} runs at a time")
    return fit


@dataclass
class Gpu:
    """One GPU's share of the runs and what it started, under its own leader and `parallel`; its log (gpu<i>.log
    beside the runs' logs, packed with them) says what started and ended when, and the memory fit."""

    index: int
    device: str | None  # its runs' CUDA_VISIBLE_DEVICES; None: the environment's (one GPU)
    queue: list[Run]
    parallel: int
    log: Path
    t0: float
    procs: list[tuple[Path, subprocess.Popen]] = field(default_factory=list)
    running: list[tuple[Path, subprocess.Popen]] = field(default_factory=list)
    alone: bool = False  # its first run (procs[0]) runs alone until its first step row
    timeline: "Timeline | None" = None

    def note(self, text: str) -> None:
        line = f"gpu{self.index} +{time.perf_counter() - self.t0:.0f} s: {text}"
        with self.log.open("a") as f:
            f.write(f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} {line}\n")
        print(line, flush=True)

    def live(self) -> int:
        """How many of its runs still run; each that ended since the last call is noted with its exit status."""
        for run, p in [(run, p) for run, p in self.running if p.poll() is not None]:
            self.note(f"{run.name} exited {p.returncode}")
            if self.timeline is not None:
                self.timeline.event("exit", run=run.name, code=p.returncode)
            self.running.remove((run, p))
        return len(self.running)

    def has_room(self) -> bool:
        return not self.alone and bool(self.queue) and len(self.running) < self.parallel

    def waits(self, until: float) -> bool:
        """Whether its leader is still to run alone: no step row yet, still running, and before `until`."""
        run, leader = self.procs[0]
        return (
            not (run / "results/steps.jsonl").is_file()
            and leader.poll() is None
            and time.perf_counter() < until
        )

    def settle(self, share: float, growth: float) -> bool:
        """The end of its leader's time alone: False where the leader failed (the others would fail the same
        way), else `parallel` cut to what its GPU holds at the leader's memory."""
        self.alone = False
        run, leader = self.procs[0]
        if leader.poll() not in (None, 0):
            print("\n".join((run.parent / f"{run.name}.log").read_text().splitlines()[-25:]), file=sys.stderr)
            return False
        self.parallel = fitting(
            self.parallel, leader.pid, share, growth, self.device, self.note, row_memory(run)
        )
        return True


# a CUDA context and what torch reserves outside its pool: launch 1's leader, 14.44 GiB used on the device at its
# first row against 13.6 GiB reserved by torch
CONTEXT_MIB = 850


def row_memory(run: Path) -> tuple[float, float] | None:
    """(MiB a run holds, MiB of its GPU) from its first step row: torch's peak reserved plus a context."""
    from rundir.files import read_jsonl, steps_path

    rows = read_jsonl(steps_path(run), torn_tail="drop") if steps_path(run).is_file() else []
    memory = (rows[0].get("gpu_memory") or {}) if rows else {}
    if "peak_reserved_gib" not in memory or "total_gib" not in memory:
        return None
    return memory["peak_reserved_gib"] * 1024 + CONTEXT_MIB, memory["total_gib"] * 1024


def stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM (each run ends its step, saves it and exits), then SIGINT to the group, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, max(grace_s - 15, 5)), (signal.SIGINT, 10), (signal.SIGKILL, 5)):
        live = [p for p in procs if p.poll() is None]
        for p in live:  # SIGTERM to the trainer alone: its grader workers must finish the step's grading
            (os.kill if sig == signal.SIGTERM else os.killpg)(p.pid, sig)
        end = time.perf_counter() + wait_s
        while any(p.poll() is None for p in live) and time.perf_counter() < end:
            time.sleep(1)


def train(plan: Plan, work: Path, out: Path, smoke: bool, budget_s: float | None = None, gguf: Path | None = None,
          parallel: int | None = None, seeds: list[int] | None = None, gpus: int | None = None,
          caches: Path | None = None) -> int:  # fmt: skip
    if seeds is not None and (plan.seeds is None or not set(seeds) <= set(plan.seeds)):
        print(f"error: --seeds {seeds}: not among {plan.path}'s seeds {plan.seeds}", file=sys.stderr)
        return 1
    if plan.status == "draft" and not smoke:
        print(
            f"error: {plan.path}: status draft; the lead commits the final plan before any run",
            file=sys.stderr,
        )
        return 1
    t0 = time.perf_counter()
    b = plan.budget
    devices = gpu_devices(gpus or b.get("gpus"), smoke)  # before the base is built: a refusal costs nothing
    budget_s = budget_s or b.get("train_s", 500)
    parallel = parallel or b.get("parallel", 2)
    grace_s, leader_s = b.get("grace_s", 75), b.get("leader_s", 240)
    steps = max_steps(plan, smoke)
    if caches is not None:
        unpack_caches(caches, work)
    common = [*prepare(plan, work, smoke, gguf), "--max_steps", str(plan.steps), *eval_args(plan, steps),
              *plan.run_args.get("smoke" if smoke else "gpu", [])]  # fmt: skip
    if b.get("drop_finished_weights") and not smoke:  # its save would be dropped unread
        common += ["--save_last_step", "false"]
    if b.get("gpu_memory_share") and not smoke:  # each run sized for its share, not for the whole GPU
        common += ["--gpu_memory_share", str(b["gpu_memory_share"])]
    # one compile cache for every run of the launch: the leader compiles, the others read (issue 60)
    cache_dirs = dict(zip(("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"), (str(work / c) for c in CACHES)))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", **cache_dirs}  # fmt: skip
    mps = bool(b.get("mps")) and not smoke
    if mps:
        env.update(start_mps(work))
    (work / "runs").mkdir(parents=True, exist_ok=True)
    # a seed's pair together: seed-major order
    order = [(name, arm, seed) for i in range(len(plan.runs(plan.arms[0]))) for arm in plan.arms
             for name, seed in [plan.runs(arm)[i]]]  # fmt: skip
    order = [(n, a, s) for n, a, s in order if seeds is None or s in seeds]
    queue = [(run_dir(work, n), a, s) for n, a, s in order if not finished(run_dir(work, n), steps)]
    shares = assign(queue, len(devices))
    slots = [Gpu(i, dev, share, parallel, work / "runs" / f"gpu{i}.log", t0)
             for i, (dev, share) in enumerate(zip(devices, shares))]  # fmt: skip
    deadline = t0 + budget_s - grace_s
    timeline = Timeline(work / "runs" / "timeline.jsonl", gpu=not smoke)
    timeline.event("launcher", budget_s=budget_s, parallel=parallel, mps=mps, gpus=len(devices))
    for gpu in slots:
        gpu.timeline = timeline

    def start(gpu: Gpu) -> None:
        run, arm, seed = gpu.queue.pop(0)
        cmd = [sys.executable, "-m", "trainer.train", "--config", str(ROOT / plan.recipe), "--arm", arm]
        cmd += ["--seed", str(seed)] if seed is not None else []
        cmd += ["--resume", str(run)] if (run / "run.json").is_file() else ["--output_dir", str(run)]
        if b.get("share_step0") and not (run / "run.json").is_file() and (rows := shared_step0(work)):
            cmd += ["--step0_eval_from", str(rows)]  # the base's evaluation, done once per launch
        # nvidia-smi's numbering (PCI order), which `fitting` reads the GPU's memory by
        where = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpu.device} if gpu.device else {}
        log = work / "runs" / f"{run.name}.log"
        with log.open("a") as f:
            f.write(f"\n$ {' '.join([*(f'{k}={v}' for k, v in where.items()), *cmd, *common])}\n")
        p = subprocess.Popen(cmd + common, cwd=ROOT, env={**env, **where}, stdout=log.open("a"),
                             stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        gpu.procs.append((run, p))
        gpu.running.append((run, p))
        gpu.note(f"started {run.name}" + (f" (CUDA_VISIBLE_DEVICES={gpu.device})" if gpu.device else ""))
        timeline.event("start", run=run.name, gpu=gpu.index)

    for gpu in slots:
        names = ", ".join(r.name for r, _, _ in gpu.queue)
        gpu.note(f"{len(gpu.queue)} runs to go, up to {parallel} at a time: {names or 'none'}")
        if len(gpu.queue) > 1 and not any((r / "run.json").is_file() for r, _, _ in gpu.queue):
            start(gpu)  # fresh: the first run alone until its first step row (generation compiled)
            gpu.alone = True
    disk = float("inf")  # runs at a time over all GPUs: they share one disk
    if b.get("drop_finished_weights") and not smoke:  # weights stay on the GPU machine: its disk binds
        base = Path(common[common.index("--model_name_or_path") + 1])
        disk = disk_fit(len(slots) * parallel, work, base)
    dropped: set[Path] = set()
    leader_failed = False
    while time.perf_counter() < deadline:
        timeline.poll([x for gpu in slots for x in gpu.running])
        if b.get("drop_finished_weights") and not smoke:
            for run, p in [x for gpu in slots for x in gpu.procs]:
                if run not in dropped and p.poll() == 0 and finished(run, steps):
                    drop_weights(run)
                    dropped.add(run)
        running = sum(gpu.live() for gpu in slots)
        if not running and not any(gpu.queue for gpu in slots):
            break
        settled = [gpu.settle(b.get("gpu_share", 0.9), b.get("memory_growth", 1.0))
                   for gpu in slots if gpu.alone and not gpu.waits(t0 + leader_s)]  # fmt: skip
        if not all(settled):
            leader_failed = True
            break
        while running < disk and (room := [g for g in slots if g.has_room()]):
            start(min(room, key=lambda g: len(g.running)))  # the least busy GPU first: the disk's cap evenly
            running += 1
        time.sleep(1 if smoke else 5)
    procs = [x for gpu in slots for x in gpu.procs]
    stop([p for _, p in procs], grace_s)
    timeline.poll([x for gpu in slots for x in gpu.running])
    if mps:
        stop_mps(env)
    failed = int(leader_failed)
    for gpu in slots:
        gpu.live()
    for run, p in procs:
        p.wait()
        failed += p.returncode not in (0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL)
        print(f"{run.name}: exit {p.returncode}, finished={finished(run, steps)}", flush=True)
    done = sum(finished(run_dir(work, n), steps) for n, _, _ in order)
    print(
        f"train wall {time.perf_counter() - t0:.0f} s; {done} of {len(order)} runs at step {steps}",
        flush=True,
    )
    pack(plan, work, out)
    return 1 if failed else 0


CACHES = ("cache/inductor", "cache/triton")  # the launch's TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR


def cache_key() -> dict:
    """What compiled kernels depend on: torch, Triton and the GPU (a cache from another is not used)."""
    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "triton": triton_version, "gpu": gpu, "cuda": torch.version.cuda}


def pack_caches(work: Path, out: Path) -> Path | None:
    """The launch's compile and autotuning caches with their key, into <out>/compile-caches.tar.gz: the next lease
    starts its runs with them (`train --caches`), compiling nothing that this one compiled."""
    present = [work / c for c in CACHES if (work / c).is_dir()]
    if not present:
        return None
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "compile-caches.tar.gz"
    key = json.dumps(cache_key(), indent=1).encode()
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("key.json")
        info.size = len(key)
        tar.addfile(info, io.BytesIO(key))
        for folder in present:
            tar.add(folder, arcname=folder.relative_to(work).as_posix())
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return archive


def unpack_caches(archive: Path, work: Path) -> bool:
    """An earlier lease's caches into this launch's cache folders, when built by the same torch, Triton and GPU
    and the folders are still empty; otherwise one line saying why they are not used (the runs compile anew)."""
    try:
        with tarfile.open(archive) as tar:
            theirs = json.loads(tar.extractfile("key.json").read())
            ours = cache_key()
            if theirs != ours:
                differ = ", ".join(
                    f"{k} {theirs.get(k)} there, {ours[k]} here" for k in ours if theirs.get(k) != ours[k]
                )
                print(f"compile caches {archive}: not used ({differ})", flush=True)
                return False
            if any((work / c).exists() and any((work / c).iterdir()) for c in CACHES):
                print(
                    f"compile caches {archive}: not used ({work / 'cache'} already holds caches)", flush=True
                )
                return False
            members = [m for m in tar.getmembers() if m.name != "key.json"]
            if bad := [m.name for m in members if not m.name.startswith(CACHES) or ".." in m.name
                       or not (m.isfile() or m.isdir())]:  # fmt: skip
                raise SystemExit(f"error: {archive}: member {bad[0]} is not a cache file")
            tar.extractall(work, members=members, filter="data")
    except (OSError, EOFError, KeyError, tarfile.TarError, json.JSONDecodeError) as e:  # EOFError: cut short
        raise SystemExit(f"error: {archive}: not a compile-cache archive ({e})") from None
    print(f"compile caches {archive}: {len(members)} entries into {work / 'cache'}", flush=True)
    return True


def detach(work: Path, cmd: list[str]) -> int:
    """`cmd` (the train stage) in a new session, its output in <work>/launcher.log: it outlives the caller (a GPU
    machine's call ends every process of its own session). A launcher still running there is refused."""
    work.mkdir(parents=True, exist_ok=True)
    if (pid := launcher_pid(work)) is not None:
        print(
            f"error: {work / 'launcher.pid'}: launcher {pid} still runs; `watch` it, or stop it first",
            file=sys.stderr,
        )
        return 1
    with (work / "launcher.log").open("a") as log:
        p = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True)  # fmt: skip
    (work / "launcher.pid").write_text(f"{p.pid}\n")
    print(f"launcher {p.pid} detached; its log {work / 'launcher.log'}", flush=True)
    return 0


def launcher_pid(work: Path) -> int | None:
    """The detached launcher's pid while it runs, else None."""
    try:
        pid = int((work / "launcher.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    try:  # a zombie (our own child, exited) counts as ended
        return None if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z" else pid
    except OSError:
        return pid


def progress(work: Path) -> str:
    """Each run's last step row, in one line."""
    steps = []
    for run in sorted(p for p in (work / "runs").glob("*") if p.is_dir()):
        steps.append(f"{run.name} {step_rows(run)}")
    return ", ".join(steps) or "no runs yet"


def watch(work: Path, for_s: float, every_s: float = 60.0) -> int:
    """Follow a detached launcher: its progress every `every_s`, until it ends or `for_s` has passed."""
    end = time.perf_counter() + for_s
    while True:
        alive = launcher_pid(work) is not None
        print(
            f"{time.strftime('%H:%M:%S')} launcher {'runs' if alive else 'ended'}: {progress(work)}",
            flush=True,
        )
        if not alive or time.perf_counter() >= end:
            break
        time.sleep(min(every_s, max(end - time.perf_counter(), 0.1)))
    if not alive and (log := work / "launcher.log").is_file():
        print("\n".join(log.read_text().splitlines()[-6:]), flush=True)
    return 0


def pack(plan: Plan, work: Path, out: Path) -> Path:
    """What the repository keeps, the runs' and GPUs' logs included: never weights, optimizer state, snapshots or
    converted bases."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{plan.name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(work.rglob("*")):
            rel = path.relative_to(work).as_posix()
            if not path.is_file() or out.resolve() in path.resolve().parents or path.suffix == ".safetensors":
                continue
            if re.search(r"/(step|state)\d+/", f"/{rel}"):
                continue  # checkpoints and optimizer state
            if rel.split("/")[0] != "runs" and "/" in rel and Path(rel).name not in BASE_KEPT:
                continue  # a converted or built base: its manifest and report only
            if rel.endswith(".tasks.json") or "tfevents" in rel:
                continue
            tar.add(path, arcname=f"{plan.name}/{rel}")
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return archive


def unpack(plan: Plan, archive: Path, into: Path) -> int:
    """The archive `pack` wrote, into the committed layout <into>/<run>/ with its log beside it; refuses to write
    over anything already there."""
    if into.exists():
        print(f"error: {into}: exists; unpack into a new folder", file=sys.stderr)
        return 1
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            rel = Path(member.name).relative_to(plan.name)
            if not member.isfile() or rel.parts[0] != "runs":
                continue
            target = into / Path(*rel.parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
    packed = rundir_archive.pack(into)  # published rows are committed compressed (docs/CONTRACTS.md)
    print(f"unpacked {archive} into {into}, rows and logs in {packed}")
    return 0
