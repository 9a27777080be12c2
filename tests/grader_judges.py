"""Test-only judges that grader workers import by name (`GraderPool(judge=...)`): workers that misbehave.

Importing this module in a worker fails on purpose when CAPGRPO_TEST_WORKER_START is "exit" or "hang",
so that tests can make the pool's replacement workers fail to start.
"""

import os
import signal
import time

from rewards.grader import judge
from rewards.outcome import Outcome

if os.environ.get("CAPGRPO_TEST_WORKER_START") == "exit":
    os._exit(5)
if os.environ.get("CAPGRPO_TEST_WORKER_START") == "hang":
    time.sleep(3600)


def _spin(cpu_seconds: float) -> None:
    """Burn this much CPU time (not wall time): what a slow sympy computation does."""
    start = time.process_time()
    while time.process_time() - start < cpu_seconds:
        pass


def hooked_judge(answer: str, reference: str) -> Outcome:
    """Some answers make the worker misbehave; the rest are judged by grader v1."""
    if answer == "SLEEP":  # blocked, not computing: only the wall-clock backstop stops it
        time.sleep(60)
    if answer == "BLOCK":  # computing, deaf to the CPU timer like a long C-level loop: the parent kills it
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGPROF})
        _spin(60)
    if answer.startswith("SPIN:"):  # a computation of known CPU cost, then a verdict
        _spin(float(answer.removeprefix("SPIN:")))
        return Outcome.CORRECT
    if answer == "EXIT":
        os._exit(3)
    if answer == "SEGV":
        os.kill(os.getpid(), signal.SIGSEGV)
    if answer == "MEMORY":  # far beyond the pool's memory limit
        bytearray(8 << 30)
    if answer == "SWALLOWED_MEMORY":  # what math-verify does: a failed comparison reads as "not equal"
        try:
            bytearray(8 << 30)
        except Exception:
            return Outcome.WRONG
    if answer == "SWALLOWED_RECURSION":
        try:
            _recurse(0)
        except Exception:
            return Outcome.WRONG
    if answer == "RAISE":
        raise RuntimeError("grader bug")
    return judge(answer, reference)


def _recurse(depth: int) -> int:
    return _recurse(depth + 1) + 1
