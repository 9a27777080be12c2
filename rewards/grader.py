"""Grader v1 (SPEC §2): one outcome per rollout, computed in isolated worker processes.

Order of the rules: truncated > format_rejected > correct / wrong; `indeterminate` when the grader
itself fails (timeout, crash, exception). The final answer is the content of the last complete
`\\boxed{...}` (`rewards.boxed`); equivalence with the reference is math-verify's, on both answers
re-wrapped as `\\boxed{...}` so that its LaTeX parser (and its plain-string fallback for text answers)
is used. Nothing from a completion is ever executed: the only thing that reads it is math-verify's
LaTeX parser, run in a worker under a time and an address-space limit.

math-verify's own timeouts are switched off: it reports them by returning `[]` / False, which would
turn a timeout into format_rejected / wrong. The worker instead arms its own timer whose exception is
a BaseException that math-verify's `except Exception` clauses cannot swallow, and the parent kills a
worker that does not answer shortly after (a C-level loop ignores the timer).
"""

import atexit
import functools
import importlib
import json
import logging
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait

import math_verify
from math_verify import LatexExtractionConfig

from rewards.boxed import last_boxed
from rewards.outcome import GRADER_VERSION, Outcome

logger = logging.getLogger(__name__)

_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0),)
_KILL_GRACE_S = 0.5  # after the in-worker timer, how long the parent waits before killing the worker
_STARTUP_TIMEOUT_S = 120.0  # generous: a cold start imports sympy on a busy machine

Judge = Callable[[str, str], Outcome]


@dataclass(frozen=True)
class Grade:
    outcome: Outcome
    answer: str | None  # the last complete box's content, None when there is no complete box
    grader_version: str = GRADER_VERSION


def _parse_boxed(content: str) -> list:
    return math_verify.parse(
        "\\boxed{" + content + "}", extraction_config=_EXTRACTION, parsing_timeout=None, raise_on_error=True
    )


@functools.lru_cache(maxsize=1024)
def _parse_reference(reference: str) -> tuple:
    # The G rollouts of a problem share its reference: parse it once per worker, not G times.
    return tuple(_parse_boxed(reference))


def judge(answer: str, reference: str) -> Outcome:
    """Compare an extracted, non-empty answer with the reference answer. No time limit of its own."""
    target = _parse_boxed(answer)
    if not target:
        return Outcome.FORMAT_REJECTED  # the last box cannot be parsed
    gold = list(_parse_reference(reference))
    if not gold:
        raise ValueError("the reference answer cannot be parsed")
    equal = math_verify.verify(gold, target, timeout_seconds=None, raise_on_error=True)
    return Outcome.CORRECT if equal else Outcome.WRONG


def _decide_early(answer: str | None, truncated: bool) -> Outcome | None:
    """The outcomes that need no math-verify: decided in the caller, without a worker round trip."""
    if truncated:
        return Outcome.TRUNCATED
    if answer is None or not answer.strip():
        return Outcome.FORMAT_REJECTED
    return None


def grade(completion: str, reference: str, truncated: bool) -> Grade:
    """Grade one completion in this process, with no time or memory limit: use GraderPool for model text."""
    answer = last_boxed(completion)
    outcome = _decide_early(answer, truncated)
    if outcome is None:
        try:
            outcome = judge(answer, reference)
        except Exception as exc:  # any grader failure is indeterminate, by definition
            logger.warning("grading failed (%s): outcome indeterminate", type(exc).__name__)
            outcome = Outcome.INDETERMINATE
    return Grade(outcome, answer)


class _WorkerTimeout(BaseException):
    """Raised by the worker's timer; not an Exception, so math-verify's handlers let it through."""


def _on_alarm(signum, frame):
    raise _WorkerTimeout


def _worker_main(memory_mb: str, timeout_s: str, judge_name: str) -> None:
    """Worker loop: one JSON line in (answer, reference), one JSON line out (outcome, healthy)."""
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print() from a library must not corrupt the protocol stream
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" warning is expected
    judge("1", "1")  # import the LaTeX parser now: not under the memory limit, not on the first item's clock
    judge_fn = judge
    if judge_name:
        module, _, name = judge_name.partition(":")
        judge_fn = getattr(importlib.import_module(module), name)
    # The limit is headroom above what the interpreter and its imports already map, so it means the same
    # whatever the platform's baseline; math-verify swallows a MemoryError it meets into "not equal", so
    # the headroom must stay far above what a real answer needs.
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = mapped + int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    protocol.write(b'"ready"\n')
    protocol.flush()
    for line in sys.stdin.buffer:
        answer, reference = json.loads(line)
        healthy = True
        try:
            signal.setitimer(signal.ITIMER_REAL, float(timeout_s))
            try:
                outcome = judge_fn(answer, reference)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except _WorkerTimeout:
            outcome = Outcome.INDETERMINATE
        except Exception as exc:  # as in grade()
            outcome = Outcome.INDETERMINATE
            healthy = not isinstance(exc, MemoryError)  # a process that ran out of memory is not reused
        protocol.write(json.dumps([outcome.value, healthy]).encode() + b"\n")
        protocol.flush()
    os._exit(0)  # end of input: the pool is closing; skip the slow teardown of sympy's caches


# A fresh interpreter that imports only the grader: never a fork of the trainer (torch threads, CUDA),
# and no re-import of the caller's __main__ as multiprocessing's spawn and forkserver would do.
_WORKER_CODE = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from rewards.grader import _worker_main; _worker_main(*sys.argv[2:])"
)


class _Worker:
    def __init__(self, memory_mb: int, timeout_s: float, judge_name: str):
        argv = [
            sys.executable,
            "-c",
            _WORKER_CODE,
            json.dumps(sys.path),
            str(memory_mb),
            str(timeout_s),
            judge_name,
        ]
        # A fixed hash seed keeps sympy's set/dict iteration order, hence outcomes, the same in every worker.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.item = -1  # index of the item being graded
        self.deadline = 0.0

    def wait_ready(self) -> None:
        try:
            ready = bool(wait([self.process.stdout], _STARTUP_TIMEOUT_S)) and self.receive() == "ready"
        except (OSError, ValueError):
            ready = False
        if not ready:
            self.kill()
            raise RuntimeError(
                f"grader worker (pid {self.process.pid}) failed to start; see its stderr above"
            )

    def send(self, answer: str, reference: str) -> None:
        self.process.stdin.write(json.dumps([answer, reference]).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self):
        return json.loads(self.process.stdout.readline())

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        self.process.stdin.close()
        self.process.stdout.close()

    def stop(self) -> None:
        """Wait for the worker to leave after `self.process.stdin` was closed (end of input ends its loop)."""
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class GraderPool:
    """Worker processes that grade untrusted completions under a per-item timeout and a memory limit.

    A worker that times out, crashes or runs out of memory is replaced; its item is `indeterminate` and
    every other item is still graded. Outcomes do not depend on the number of workers.
    `judge` replaces the in-worker comparison; it exists for tests and must be a module-level function
    (the worker imports it by name).
    """

    def __init__(
        self, workers: int = 2, timeout_s: float = 5.0, memory_mb: int = 1024, judge: Judge | None = None
    ):
        if workers < 1 or timeout_s <= 0 or memory_mb < 256:
            raise ValueError(
                f"GraderPool needs workers >= 1, timeout_s > 0 and memory_mb >= 256, "
                f"got workers={workers}, timeout_s={timeout_s}, memory_mb={memory_mb}"
            )
        if judge is not None and not judge.__qualname__.isidentifier():
            raise ValueError(f"GraderPool judge must be a module-level function, got {judge.__qualname__}")
        judge_name = f"{judge.__module__}:{judge.__qualname__}" if judge else ""
        self._args = (memory_mb, timeout_s, judge_name)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._workers: list[_Worker | None] = [_Worker(*self._args) for _ in range(workers)]
        try:
            for worker in self._workers:
                worker.wait_ready()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> "GraderPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            workers = [w for w in self._workers if w is not None]
            for worker in workers:  # all of them first, so that they leave in parallel
                worker.process.stdin.close()
            for worker in workers:
                worker.stop()
            self._workers = []

    def grade_batch(
        self, completions: Sequence[str], references: Sequence[str], truncated: Sequence[bool]
    ) -> list[Grade]:
        if not (len(completions) == len(references) == len(truncated)):
            raise ValueError(
                f"grade_batch: completions, references and truncated differ in length "
                f"({len(completions)}, {len(references)}, {len(truncated)})"
            )
        for field, values in (("completions", completions), ("references", references)):
            bad = next((i for i, v in enumerate(values) if not isinstance(v, str)), None)
            if bad is not None:
                raise TypeError(f"grade_batch: {field}[{bad}] is {type(values[bad]).__name__}, expected str")
        answers = [last_boxed(c) for c in completions]
        outcomes = [_decide_early(a, t) for a, t in zip(answers, truncated)]
        todo = deque(i for i, outcome in enumerate(outcomes) if outcome is None)
        with self._lock:
            if not self._workers:
                raise RuntimeError("grade_batch on a closed GraderPool")
            busy: dict = {}  # worker stdout -> slot, for the items in flight
            try:
                self._run(todo, busy, answers, references, outcomes)
            except (
                BaseException
            ):  # e.g. KeyboardInterrupt: never leave a late answer in a pipe for the next batch
                for slot in busy.values():
                    self._discard(slot)
                raise
        return [Grade(outcome, answer) for outcome, answer in zip(outcomes, answers)]

    def _worker_at(self, slot: int) -> _Worker:
        """The worker in this slot, started afresh if it was discarded or has died since its last item."""
        worker = self._workers[slot]
        if worker is None or worker.process.poll() is not None:
            if worker is not None:
                worker.kill()
            worker = self._workers[slot] = _Worker(*self._args)
            worker.wait_ready()
        return worker

    def _discard(self, slot: int) -> None:
        # Replaced lazily, when the next item needs it, so that a batch never waits for a start it won't use.
        self._workers[slot].kill()
        self._workers[slot] = None

    def _run(
        self, todo: deque[int], busy: dict, answers: list, references: Sequence[str], outcomes: list
    ) -> None:
        idle = list(range(len(self._workers)))  # worker slots
        while todo or busy:
            while todo and idle:
                slot = idle.pop()
                worker = self._worker_at(slot)
                worker.item = todo.popleft()
                worker.deadline = time.monotonic() + self._timeout_s + _KILL_GRACE_S
                try:
                    worker.send(answers[worker.item], references[worker.item])
                except OSError:  # it died while reading the item
                    outcomes[worker.item] = Outcome.INDETERMINATE
                    self._discard(slot)
                    idle.append(slot)
                    continue
                busy[worker.process.stdout] = slot
            if not busy:
                continue
            next_deadline = min(self._workers[slot].deadline for slot in busy.values())
            for stdout in wait(list(busy), timeout=max(0.0, next_deadline - time.monotonic())):
                slot = busy.pop(stdout)
                worker = self._workers[slot]
                try:
                    value, healthy = worker.receive()
                    outcomes[worker.item] = Outcome(value)
                except (OSError, ValueError):  # it died: segfault, os._exit, killed by the OOM killer
                    outcomes[worker.item] = Outcome.INDETERMINATE
                    healthy = False
                if not healthy:
                    self._discard(slot)
                idle.append(slot)
            now = time.monotonic()
            for stdout, slot in list(busy.items()):
                if now >= self._workers[slot].deadline:  # stuck where the in-worker timer cannot reach
                    del busy[stdout]
                    outcomes[self._workers[slot].item] = Outcome.INDETERMINATE
                    self._discard(slot)
                    idle.append(slot)


_default_pool: GraderPool | None = None
_default_lock = threading.Lock()


def default_pool() -> GraderPool:
    """A process-wide pool with the default settings, created on first use and closed at exit."""
    global _default_pool
    with _default_lock:
        if _default_pool is None:
            _default_pool = GraderPool()
            atexit.register(_default_pool.close)
        return _default_pool


def grade_batch(
    completions: Sequence[str], references: Sequence[str], truncated: Sequence[bool]
) -> list[Grade]:
    """GraderPool.grade_batch on the default pool."""
    return default_pool().grade_batch(completions, references, truncated)
