"""The train stage: every arm x seed of the plan, resumable and budgeted, on one GPU; and what comes back.

Runs go `budget.parallel` at a time, a seed's pair together; a run an earlier invocation left is resumed
(`--resume`, exactly), a finished one is skipped. On a fresh start the first run goes alone until its first step
row (it fills the compile caches the others then read), and the number at a time is cut to what the GPU holds at
its measured memory. When the budget is spent every run gets SIGTERM (it ends its step, saves it and exits; the
next invocation resumes it), then SIGINT to the group (it keeps its last saved state), then SIGKILL.
`pack` writes what the repository keeps (run.json, steps.jsonl, eval rows, cards, logs, base report; never
weights or optimizer state) into <out>/<plan name>.tar.gz; `unpack` writes it into a new docs folder.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from launch.base import build_base, snapshot_path, write_tasks
from launch.plan import ROOT, Plan
from rundir import archive as rundir_archive

BASE_KEPT = ("base_manifest.json", "tiny_base.json", "base_report.json")


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


def gpu_memory_mib(pid: int) -> tuple[float, float] | None:
    """(this process's GPU memory, the GPU's total) in MiB from nvidia-smi, or None where it cannot say."""
    try:
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=30).stdout  # fmt: skip
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=30).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    used = [
        float(m) for p, m in (line.split(",") for line in apps.splitlines() if "," in line) if int(p) == pid
    ]
    return (used[0], float(total.split()[0])) if used and total.strip() else None


def fitting(parallel: int, leader_pid: int, share: float = 0.9, growth: float = 1.0) -> int:
    """At most `parallel` runs, as many as `share` of the GPU holds at the leader's measured memory times
    `growth` (the plan's budget.memory_growth: what a run holds later over what it held at its first step)."""
    memory = gpu_memory_mib(leader_pid)
    if memory is None:
        return parallel
    used, total = memory
    fit = max(1, min(parallel, int(share * total // (used * growth))))
    print(f"leader holds {used:.0f} of {total:.0f} MiB (x{growth} later): {fit} runs at a time", flush=True)
    return fit


def train(plan: Plan, work: Path, out: Path, smoke: bool, budget_s: float | None = None, gguf: Path | None = None,
          parallel: int | None = None, seeds: list[int] | None = None) -> int:  # fmt: skip
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
    budget_s = budget_s or b.get("train_s", 500)
    parallel = parallel or b.get("parallel", 2)
    grace_s, leader_s = b.get("grace_s", 75), b.get("leader_s", 240)
    steps = max_steps(plan, smoke)
    common = [*prepare(plan, work, smoke, gguf), "--max_steps", str(plan.steps), "--eval_every",
              str(plan.eval["every"]), *plan.run_args.get("smoke" if smoke else "gpu", [])]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}  # fmt: skip
    (work / "runs").mkdir(parents=True, exist_ok=True)
    # a seed's pair together: seed-major order
    order = [(name, arm, seed) for i in range(len(plan.runs(plan.arms[0]))) for arm in plan.arms
             for name, seed in [plan.runs(arm)[i]]]  # fmt: skip
    order = [(n, a, s) for n, a, s in order if seeds is None or s in seeds]
    queue = [(run_dir(work, n), a, s) for n, a, s in order if not finished(run_dir(work, n), steps)]
    fresh = not any((r / "run.json").is_file() for r, _, _ in queue)
    deadline = t0 + budget_s - grace_s
    procs: list[tuple[Path, subprocess.Popen]] = []

    def start_next() -> subprocess.Popen:
        run, arm, seed = queue.pop(0)
        cmd = [sys.executable, "-m", "trainer.train", "--config", str(ROOT / plan.recipe), "--arm", arm]
        cmd += ["--seed", str(seed)] if seed is not None else []
        cmd += ["--resume", str(run)] if (run / "run.json").is_file() else ["--output_dir", str(run)]
        log = work / "runs" / f"{run.name}.log"
        with log.open("a") as f:
            f.write(f"\n$ {' '.join(cmd + common)}\n")
        procs.append((run, subprocess.Popen(cmd + common, cwd=ROOT, env=env, stdout=log.open("a"),
                                            stderr=subprocess.STDOUT, start_new_session=True)))  # fmt: skip
        print(f"started {run.name} at {time.perf_counter() - t0:.0f} s", flush=True)
        return procs[-1][1]

    if fresh and len(queue) > 1:  # the first run alone until its first step row: generation compiled
        leader = start_next()
        first = procs[0][0] / "results/steps.jsonl"
        while not first.is_file() and leader.poll() is None and time.perf_counter() < t0 + leader_s:
            time.sleep(2)
        if leader.poll() not in (None, 0):  # the others would fail the same way
            log = (work / "runs" / f"{procs[0][0].name}.log").read_text().splitlines()
            print("\n".join(log[-25:]), file=sys.stderr)
            pack(plan, work, out)
            return 1
        parallel = fitting(parallel, leader.pid, b.get("gpu_share", 0.9), b.get("memory_growth", 1.0))
    if b.get("drop_finished_weights") and not smoke:  # weights stay on the GPU machine: its disk binds
        base = Path(common[common.index("--model_name_or_path") + 1])
        parallel = disk_fit(parallel, work, base)
    dropped: set[Path] = set()
    while time.perf_counter() < deadline:
        if b.get("drop_finished_weights") and not smoke:
            for run, p in procs:
                if run not in dropped and p.poll() == 0 and finished(run, steps):
                    drop_weights(run)
                    dropped.add(run)
        live = [p for _, p in procs if p.poll() is None]
        if not live and not queue:
            break
        while queue and len(live) < parallel:
            live.append(start_next())
        time.sleep(1 if smoke else 5)
    stops = ((signal.SIGTERM, max(grace_s - 15, 5)), (signal.SIGINT, 10), (signal.SIGKILL, 5))
    for sig, wait_s in stops:
        live = [p for _, p in procs if p.poll() is None]
        for p in live:  # SIGTERM to the trainer alone: its grader workers must finish the step's grading
            (os.kill if sig == signal.SIGTERM else os.killpg)(p.pid, sig)
        end = time.perf_counter() + wait_s
        while any(p.poll() is None for p in live) and time.perf_counter() < end:
            time.sleep(1)
    failed = 0
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


def pack(plan: Plan, work: Path, out: Path) -> Path:
    """What the repository keeps: never weights, optimizer state, snapshots or converted bases."""
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
