"""The train stage: every arm x seed of the plan, resumable and budgeted, on each GPU of the machine (or on the CPU:
`budget.gpus: 0`).

Whole seed pairs go to the GPUs round-robin (launch/gpus.py), each run with CUDA_VISIBLE_DEVICES set to its GPU (one
GPU: the environment as it is). On each GPU runs go `budget.parallel` at a time, in seed order; a run an earlier
invocation left is resumed (`--resume`, exactly), a finished one is skipped, and so is one an earlier lease
committed (`--committed-in`). On a fresh start each GPU's first run goes alone until its first step row (it fills
the compile caches the others then read), and that GPU's number at a time is cut to what it holds at the leader's
measured memory; the disk, shared, bounds the runs of all GPUs together. Once a run has finished, a new run starts
only while the slowest finished run's time still fits the budget: a run the budget would cut is left for the next
lease (a pair's runs may span two leases on one GPU model). When the budget is spent every run gets SIGTERM (it ends
its step, saves it and exits; the next invocation resumes it), then SIGINT to the group (it keeps its last saved
state), then SIGKILL. Each run's
settings come from launch/settings.py; what comes back is packed by launch/pack.py.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from launch.gpus import Gpu, assign, disk_fit, gpu_devices, gpu_model, peak_memory, start_mps, stop_mps
from launch.pack import CACHES, pack, unpack_caches
from launch.plan import ROOT, LaunchError, Plan
from launch.settings import argv, base_settings, first_evaluated_step, max_steps, run_settings
from launch.watch import Timeline
from rundir import archive
from rundir.files import read_jsonl, steps_path
from rundir.run_json import read_run_json


def run_dir(work: Path, name: str) -> Path:
    return work / "runs" / name


def finished(run: Path, steps: int) -> bool:
    if not steps_path(run).is_file():
        return False
    return (
        any(r.get("step") == steps for r in read_jsonl(steps_path(run), torn_tail="drop"))
        and (run / f"results/eval_step{steps:03d}.jsonl").is_file()
    )


def shared_step0(work: Path) -> Path | None:
    """A run of this launch that evaluated the base itself (not a copy): its step-0 rows, else None."""
    for rows in sorted((work / "runs").glob("*/results/eval_step000.jsonl")):
        if evaluated_step0(rows.parent.parent):
            return rows
    return None


def evaluated_step0(run: Path) -> bool:
    """Whether `run` evaluated its base at step 0 itself rather than copying another run's rows."""
    return not read_run_json(run).get("config", {}).get("step0_eval_from")


def size_by_step0(gpu: Gpu, step0_rows: Path, own_evaluation_row: int) -> None:
    """A leader given another run's step-0 rows has no evaluation in its first row, which so understates what it
    holds (issue 62's lease 2). Its GPU is sized by the most that the rows' own run held, where that run evaluated
    step 0 itself and recorded its memory; else at the leader's row after its first own evaluation."""
    source = step0_rows.parent.parent
    if evaluated_step0(source) and peak_memory(source):
        gpu.memory_from = source
    else:
        gpu.measure_row = own_evaluation_row


def cannot_finish(started: bool, took: list[float], left: float) -> bool:
    """Whether a run would begin now (not `started`, in this launch or an earlier one) with fewer seconds `left`
    than the slowest run this launch finished `took` (before it finished one, earlier leases' runs on its GPU model).
    A run the budget cuts leaves its pair out, rerun under a new seed (issue 62's rule 4), so it is not started: it
    goes first in the next lease, and its pair spans the two (amendment 4; lease 5 ended with 609 s, one run's time,
    left unused under the rule of a whole pair)."""
    return not started and bool(took) and max(took) > left


def committed_took(where: Path, model: str | None, copied: bool) -> list[float]:
    """Start-to-exit seconds of the runs earlier leases committed under `where` on the GPU model `model` (each
    run.json's launch.device), from each launch's timeline.jsonl (a run started again after a crash: the attempt
    that finished). Until a launch finishes a run of its own, `cannot_finish` takes these: a lease's first run cut
    by the budget would leave its pair out as surely as a later one (issue 62's rule 4). Only runs that did step 0
    as this launch's first run will, copied its rows (`copied`) or evaluated them: lease 11's first launcher measured
    a run that copies step 0 (295-476 s on an H100) by launch1's leader, which evaluated it (596 s)."""
    if model is None:
        return []
    took = []
    for folder in committed_launches(where):
        if not archive.exists(folder / "timeline.jsonl"):
            continue
        began: dict[str, float] = {}
        for e in read_jsonl(folder / "timeline.jsonl", torn_tail="drop"):
            if e.get("event") == "start":
                began[e["run"]] = e["t"]
            elif e.get("event") == "exit" and e.get("code") == 0 and e["run"] in began:
                ran = folder / e["run"] / "run.json"
                if not archive.exists(ran):
                    continue
                meta = json.loads(archive.read_bytes(ran))
                same_step0 = bool(meta["config"].get("step0_eval_from")) == copied
                if meta["launch"]["device"] == model and same_step0:
                    took.append(e["t"] - began[e["run"]])
    return took


def committed_launches(where: Path) -> list[Path]:
    """The launch folders earlier leases committed under `where` (none for an experiment's first lease)."""
    return sorted(p for p in where.glob("launch*") if p.is_dir())


def committed_runs(names: list[str], where: Path) -> list[str]:
    """Those of `names` that an earlier lease committed under `where` (a run.json in a launch* folder, on disk or in
    rows.tar.xz): a run belongs to one launch, so they are not run again."""
    folders = committed_launches(where)
    return [n for n in names if any(archive.exists(f / n / "run.json") for f in folders)]


def drop_weights(run: Path) -> None:
    """A finished run's stepNNN/ and stateNNN/ on the GPU machine (the plan's budget.drop_finished_weights):
    they never come back, and sixteen 0.5B runs' 7.6 GB each would fill its disk before the last one saved."""
    dropped = [d for d in sorted(run.iterdir()) if d.is_dir() and re.fullmatch(r"(step|state)\d+", d.name)]
    for d in dropped:
        shutil.rmtree(d)
    print(f"{run.name}: finished; dropped {', '.join(d.name for d in dropped) or 'nothing'} (weights never leave the GPU machine)",
          flush=True)  # fmt: skip


def stop(procs: list[subprocess.Popen], grace_s: float) -> None:
    """SIGTERM (each run ends its step, saves it and exits), then SIGINT to the group, then SIGKILL."""
    for sig, wait_s in ((signal.SIGTERM, max(grace_s - 15, 5)), (signal.SIGINT, 10), (signal.SIGKILL, 5)):
        live = [p for p in procs if p.poll() is None]
        for p in live:  # SIGTERM to the trainer alone: its grader workers must finish the step's grading
            (os.kill if sig == signal.SIGTERM else os.killpg)(p.pid, sig)
        end = time.perf_counter() + wait_s
        while any(p.poll() is None for p in live) and time.perf_counter() < end:
            time.sleep(1)


def cache_env(work: Path) -> dict[str, str]:
    """One compile cache for every run of the launch: the leader compiles, the others read (issue 60), and `pack
    --with-caches` carries it to the next lease. Triton (>= 3.4) also keeps its autotuners' choices there
    (TRITON_CACHE_AUTOTUNING; fla's and our Triton kernels): every run then times no config another timed, and
    all of them run the same configs. TileLang's kernels (fla's on Hopper) are cached there too."""
    names = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR")
    dirs = dict(zip(names, (str(work / c) for c in CACHES), strict=True))
    return {**dirs, "TRITON_CACHE_AUTOTUNING": "1"}


def train(plan: Plan, work: Path, out: Path, smoke: bool, budget_s: float | None = None, gguf: Path | None = None,
          parallel: int | None = None, seeds: list[int] | None = None, gpus: int | None = None,
          caches: Path | None = None, arms: list[str] | None = None, step0_from: Path | None = None,
          committed_in: Path | None = None) -> int:  # fmt: skip
    """Start or resume every unfinished run until all are finished or the budget is spent, then pack; 1 where a
    run failed (each named with its log), else 0. `step0_from`: an earlier lease's step-0 rows of the same plan,
    copied by every new run (each trainer checks they are its own) instead of evaluating the base again;
    `committed_in`: the experiment folder whose committed launches' runs are not run again."""
    if seeds is not None and (plan.seeds is None or not set(seeds) <= set(plan.seeds)):
        raise LaunchError(f"--seeds {seeds}: not among {plan.path}'s seeds {plan.seeds}")
    if arms is not None and not set(arms) <= set(plan.arms):
        raise LaunchError(f"--arms {','.join(arms)}: not among {plan.path}'s arms {', '.join(plan.arms)}")
    step0_from = step0_from and Path(step0_from).resolve()  # the trainers run from the repo root
    if step0_from and not step0_from.is_file():
        raise LaunchError(
            f"--step0-from {step0_from}: no such file (an earlier run's results/eval_step000.jsonl)"
        )
    if committed_in is not None and not Path(committed_in).is_dir():
        raise LaunchError(
            f"--committed-in {committed_in}: no such folder (an experiment's, holding launch*/)"
        )
    if plan.status == "draft" and not smoke:
        raise LaunchError(f"{plan.path}: status draft; the lead commits the final plan before any run")
    t0 = time.perf_counter()
    b = plan.budget
    cpu = gpus == 0 or (gpus is None and b.get("gpus") == 0)  # no GPU: no leader alone, no nvidia-smi
    devices = gpu_devices(
        gpus if gpus is not None else b.get("gpus"), smoke
    )  # before any build: costs nothing
    budget_s = budget_s or b.get("train_s", 500)
    parallel = parallel or b.get("parallel", 2)
    grace_s, leader_s = b.get("grace_s", 75), b.get("leader_s", 240)
    steps = max_steps(plan, smoke)
    # seed-major order: a seed's runs one after the other, its partner first in the next lease if the budget parts them
    order = [(name, arm, seed) for i in range(len(plan.runs(plan.arms[0]))) for arm in plan.arms
             for name, seed in [plan.runs(arm)[i]]]  # fmt: skip
    order = [(n, a, s) for n, a, s in order if (seeds is None or s in seeds) and (arms is None or a in arms)]
    if committed_in is not None:
        done = committed_runs([n for n, _, _ in order], Path(committed_in))
        for name in done:
            print(f"{name}: committed in an earlier lease under {committed_in}; not run again", flush=True)
        order = [x for x in order if x[0] not in done]
    earlier = (
        committed_took(Path(committed_in), gpu_model(devices[0]), bool(step0_from))
        if committed_in is not None
        else []
    )
    if earlier:
        how = "copied" if step0_from else "evaluated"
        print(f"earlier leases' runs on this GPU model that {how} step 0: {len(earlier)}, the slowest "
              f"{max(earlier):.0f} s", flush=True)  # fmt: skip
    for name, _, _ in order:  # refused before anything starts: a run folder is resumed, or new and empty
        run = run_dir(work, name)
        if run.is_dir() and any(run.iterdir()) and not (run / "run.json").is_file():
            raise LaunchError(
                f"{run}: not empty and no run to resume (no run.json); remove it or use another --work"
            )
    if caches is not None:
        unpack_caches(caches, work)
    base = base_settings(plan, work, smoke, gguf)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "OMP_NUM_THREADS": "1", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", **cache_env(work)}  # fmt: skip
    mps = bool(b.get("mps")) and not smoke
    if mps:
        env.update(start_mps(work))
    (work / "runs").mkdir(parents=True, exist_ok=True)
    queue = [(run_dir(work, n), a, s) for n, a, s in order if not finished(run_dir(work, n), steps)]
    shares = assign(queue, len(devices))
    slots = [Gpu(i, dev, share, parallel, work / "runs" / f"gpu{i}.log", t0)
             for i, (dev, share) in enumerate(zip(devices, shares))]  # fmt: skip
    deadline = t0 + budget_s - grace_s
    timeline = Timeline(work / "runs" / "timeline.jsonl", gpu=not smoke and not cpu)
    timeline.event("launcher", budget_s=budget_s, parallel=parallel, mps=mps, gpus=len(devices))
    for gpu in slots:
        gpu.timeline = timeline

    began: dict[Path, float] = {}  # when each run started, and how long each that finished took
    took: dict[Path, float] = {}

    def start(gpu: Gpu) -> None:
        run, arm, seed = gpu.queue.pop(0)
        began[run] = time.perf_counter()
        shared = (
            None
            if (run / "run.json").is_file()
            else step0_from or (shared_step0(work) if b.get("share_step0") else None)
        )
        cmd = argv(run_settings(plan, base, run, arm, seed, smoke, parallel, shared))
        # nvidia-smi's numbering (PCI order), which `fitting` reads the GPU's memory by
        where = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": gpu.device} if gpu.device else {}
        log = work / "runs" / f"{run.name}.log"
        with log.open("a") as f:
            f.write(f"\n$ {' '.join([*(f'{k}={v}' for k, v in where.items()), *cmd])}\n")
        p = subprocess.Popen(cmd, cwd=ROOT, env={**env, **where}, stdout=log.open("a"), stderr=subprocess.STDOUT,
                             start_new_session=True)  # fmt: skip
        gpu.procs.append((run, p))
        gpu.running.append((run, p))
        gpu.note(f"started {run.name}" + (f" (CUDA_VISIBLE_DEVICES={gpu.device})" if gpu.device else ""))
        timeline.event("start", run=run.name, gpu=gpu.index)

    def cut(gpu: Gpu) -> bool:
        """Whether the GPU's next run is one the budget would cut: then it is left for the next lease, named."""
        run, _, seed = gpu.queue[0]
        left = deadline - time.perf_counter()
        if not cannot_finish((run / "run.json").is_file(), list(took.values()) or earlier, left):
            return False
        gpu.queue.pop(0)
        slowest = f"the slowest finished run took {max(took.values()):.0f} s" if took else (
            f"the slowest run an earlier lease committed on this GPU model took {max(earlier):.0f} s")  # fmt: skip
        gpu.note(f"{run.name} not started: {slowest}, {left:.0f} s are left")
        timeline.event("skip", run=run.name, seed=seed, left_s=round(left))
        return True

    for gpu in slots:
        names = ", ".join(r.name for r, _, _ in gpu.queue)
        gpu.note(f"{len(gpu.queue)} runs to go, up to {parallel} at a time: {names or 'none'}")
        fresh = not any((r / "run.json").is_file() for r, _, _ in gpu.queue)
        if not cpu and len(gpu.queue) > 1 and fresh and not cut(gpu):
            start(gpu)  # fresh: the first run alone until its first step row (generation compiled)
            gpu.alone = True
            if step0_from:
                size_by_step0(gpu, step0_from, first_evaluated_step(plan, steps) + 1)
    disk = float("inf")  # runs at a time over all GPUs: they share one disk
    if b.get("drop_finished_weights") and not smoke:  # weights stay on the GPU machine: its disk binds
        disk = disk_fit(len(slots) * parallel, work, Path(base["model_name_or_path"]))
    while time.perf_counter() < deadline:
        timeline.poll([x for gpu in slots for x in gpu.running])
        for run, p in [x for gpu in slots for x in gpu.procs]:  # each run that finished, once
            if run not in took and p.poll() == 0 and finished(run, steps):
                took[run] = time.perf_counter() - began[run]
                if b.get("drop_finished_weights") and not smoke:
                    drop_weights(run)
        running = sum(gpu.live() for gpu in slots)
        if not running and not any(gpu.queue for gpu in slots):
            break
        settled = [gpu.settle(b.get("gpu_share", 0.9), b.get("memory_growth", 1.0))
                   for gpu in slots if gpu.alone and not gpu.waits(t0 + leader_s)]  # fmt: skip
        if not all(settled):
            break
        while running < disk and (room := [g for g in slots if g.has_room()]):
            gpu = min(room, key=lambda g: len(g.running))  # the least busy GPU first: the disk's cap evenly
            # a run.json in $W: an earlier launcher of this lease began it, so it is resumed whatever is left
            if cut(gpu):
                continue
            start(gpu)
            running += 1
        time.sleep(1 if smoke or cpu else 5)
    procs = [x for gpu in slots for x in gpu.procs]
    stop([p for _, p in procs], grace_s)
    timeline.poll([x for gpu in slots for x in gpu.running])
    if mps:
        stop_mps(env)
    for gpu in slots:
        gpu.live()
    failed = []  # a leader that failed is one of them: the others were not started
    for run, p in procs:
        p.wait()
        print(f"{run.name}: exit {p.returncode}, finished={finished(run, steps)}", flush=True)
        if p.returncode not in (0, -signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL):
            failed.append(f"{run.name} failed (exit {p.returncode}; see {run.parent / f'{run.name}.log'})")
    done = sum(finished(run_dir(work, n), steps) for n, _, _ in order)
    print(
        f"train wall {time.perf_counter() - t0:.0f} s; {done} of {len(order)} runs at step {steps}",
        flush=True,
    )
    pack(plan, work, out)
    if failed:
        raise LaunchError("training " + "; ".join(failed))
    return 0
