"""Where the train stage's runs go and how many fit: the GPUs (`--gpus`, CUDA_VISIBLE_DEVICES, nvidia-smi), whole
seed pairs to each, each GPU's runs at a time by its leader's measured memory and the disk by the saves a stop
leaves, NVIDIA's MPS daemon; and `Gpu`, one GPU's share of the runs with its log (runs/gpu<i>.log)."""

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from launch.plan import LaunchError

if TYPE_CHECKING:
    from launch.watch import Timeline

Run = tuple[Path, str, int | None]  # run directory, arm, seed


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
        raise LaunchError(
            f"nvidia-cuda-mps-control -d: exit {r.returncode}: {(r.stderr or r.stdout).strip()}"
        )
    print(f"MPS daemon started (pipe {env['CUDA_MPS_PIPE_DIRECTORY']})", flush=True)
    return env


def stop_mps(env: dict) -> None:
    subprocess.run(
        ["nvidia-cuda-mps-control"], input="quit\n", env=env, capture_output=True, text=True, timeout=30
    )


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


def smi(*args: str, timeout_s: float = 30) -> str | None:
    """nvidia-smi's output for `args`, or None where it cannot say (no driver, an error, no answer in time)."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def visible_gpus() -> list[str]:
    """The GPUs the runs may use, as CUDA_VISIBLE_DEVICES names them: its own list where set, else nvidia-smi's
    indices; [] without GPUs."""
    if (listed := os.environ.get("CUDA_VISIBLE_DEVICES")) is not None:
        return [d.strip() for d in listed.split(",") if d.strip()]
    return (smi("--query-gpu=index", "--format=csv,noheader") or "").split()


def gpu_model(device: str | None) -> str | None:
    """The model of GPU `device` (nvidia-smi's index; None: the first), as each run.json's launch.device names it
    (both are the driver's name, e.g. "NVIDIA H100 80GB HBM3"); None without one. nvidia-smi, not torch: the
    launcher holds no CUDA context on the runs' GPU."""
    return (smi("--query-gpu=name", "--format=csv,noheader", "-i", device or "0") or "").strip() or None


def gpu_devices(n: int | None, smoke: bool) -> list[str | None]:
    """Each GPU's CUDA_VISIBLE_DEVICES for its runs: `n` of the visible GPUs (default all of them, one without
    any); [None] for one GPU, whose runs get the environment as it is, and for none (`budget.gpus: 0`, the CPU)."""
    if n == 0:
        return [None]
    visible = visible_gpus()
    n = (len(visible) or 1) if n is None else n
    if n < 1 or (n > max(len(visible), 1) and not smoke):  # --smoke runs on the CPU: any number of "GPUs"
        raise LaunchError(f"--gpus {n}: {len(visible)} GPUs visible")
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
    apps = smi("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
    total = smi("--query-gpu=memory.total", *which, "--format=csv,noheader,nounits")
    if apps is None or total is None:
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
    alone: bool = False  # its first run (procs[0]) runs alone until its `measure_row`-th step row
    # the row it is measured at: 1 where it evaluates step 0 itself or `memory_from` sizes it, else the row after its
    # first own evaluation (issue 62's lease 2, step 0 copied: 30.7 GiB reserved at row 1, 44.6 after step 10's)
    measure_row: int = 1
    # sized by the most this run held instead of the leader's row, on the leader's GPU: the earlier lease's run that
    # evaluated the step-0 rows its runs copy (its rows count that evaluation, the extra sets included)
    memory_from: Path | None = None
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
        """Whether its leader is still to run alone: fewer than `measure_row` step rows, still running, and before
        `until`."""
        run, leader = self.procs[0]
        return (
            len(step_rows(run)) < self.measure_row and leader.poll() is None and time.perf_counter() < until
        )

    def settle(self, share: float, growth: float) -> bool:
        """The end of its leader's time alone: False where the leader failed (the others would fail the same
        way), else `parallel` cut to what its GPU holds at the leader's memory."""
        self.alone = False
        run, leader = self.procs[0]
        if leader.poll() not in (None, 0):
            print("\n".join((run.parent / f"{run.name}.log").read_text().splitlines()[-25:]), file=sys.stderr)
            return False
        memory = row_memory(run, self.measure_row)
        if memory and self.memory_from:  # the most it held, on this GPU: the leader's row says the GPU's size
            memory = (most := peak_memory(self.memory_from)) and (most[0], memory[1])
        self.parallel = fitting(self.parallel, leader.pid, share, growth, self.device, self.note, memory)
        return True


# a CUDA context and what torch reserves outside its pool: launch 1's leader, 14.44 GiB used on the device at its
# first row against 13.6 GiB reserved by torch
CONTEXT_MIB = 850


def step_rows(run: Path) -> list[dict]:
    from rundir.files import read_jsonl, steps_path

    return read_jsonl(steps_path(run), torn_tail="drop") if steps_path(run).is_file() else []


def row_memory(run: Path, row: int = 1) -> tuple[float, float] | None:
    """(MiB a run holds, MiB of its GPU) from its `row`-th step row (its last where it has fewer): torch's peak
    reserved plus a context. Torch keeps what an evaluation reserved, so a row after one counts it."""
    rows = step_rows(run)[:row]
    return memory_of(rows[-1]) if rows else None


def peak_memory(run: Path) -> tuple[float, float] | None:
    """`row_memory` at the row where `run` held the most (issue 62's launch 1 leader: 46.9 GiB at row 1, 54.6 at
    row 9)."""
    return max(filter(None, map(memory_of, step_rows(run))), default=None)


def memory_of(row: dict) -> tuple[float, float] | None:
    memory = row.get("gpu_memory") or {}
    if "peak_reserved_gib" not in memory or "total_gib" not in memory:
        return None
    return memory["peak_reserved_gib"] * 1024 + CONTEXT_MIB, memory["total_gib"] * 1024
