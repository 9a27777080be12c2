"""What a launch shows while it runs: runs/timeline.jsonl (starts, exits, step rows, GPU samples; launch/lease.py
reads it), and a train stage detached into a session of its own (`train --detach`) followed by `watch`."""

import json
import os
import subprocess
import time
from pathlib import Path

from launch.gpus import smi
from launch.plan import ROOT, LaunchError


def step_rows(run: Path) -> int:
    """How many step rows a running run has written (a torn last row counts: it is only a progress figure)."""
    path = run / "results/steps.jsonl"
    if not path.is_file():
        return 0
    with path.open("rb") as f:
        return sum(1 for _ in f)


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
            out = smi(
                "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits", timeout_s=10
            )
            if out is None:
                return
            try:
                util = [[float(x) for x in line.split(",")] for line in out.splitlines() if "," in line]
            except ValueError:
                return
            self.event("gpu", util=[u for u, _ in util], memory_mib=[m for _, m in util], live=len(running))


def detach(work: Path, cmd: list[str]) -> int:
    """`cmd` (the train stage) in a new session, its output in <work>/launcher.log: it outlives the caller (a GPU
    machine's call ends every process of its own session). A launcher still running there is refused."""
    work.mkdir(parents=True, exist_ok=True)
    if (pid := launcher_pid(work)) is not None:
        raise LaunchError(f"{work / 'launcher.pid'}: launcher {pid} still runs; `watch` it, or stop it first")
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


def watch(work: Path, for_s: float, every_s: float = 60.0, poll_s: float = 1.0) -> int:
    """Follow a detached launcher: its progress every `every_s`, until it ends or `for_s` has passed. Its end is
    noticed within `poll_s`, not at the next line: a lease's last call ends (and stops costing) with the launcher."""
    end = time.perf_counter() + for_s
    while True:
        alive = launcher_pid(work) is not None
        print(
            f"{time.strftime('%H:%M:%S')} launcher {'runs' if alive else 'ended'}: {progress(work)}",
            flush=True,
        )
        if not alive or time.perf_counter() >= end:
            break
        line_at = min(time.perf_counter() + every_s, end)
        while launcher_pid(work) is not None and time.perf_counter() < line_at:
            time.sleep(max(min(poll_s, line_at - time.perf_counter()), 0.01))
    if not alive and (log := work / "launcher.log").is_file():
        print("\n".join(log.read_text().splitlines()[-6:]), flush=True)
    return 0
