"""One outcome per rollout (SPEC §2), computed in isolated worker processes.

Order of the rules: truncated > format_rejected > correct / wrong; `indeterminate` when the grader
itself fails (CPU time, memory, recursion depth, crash, exception, a length cap, the batch deadline).
The final answer is the content of the last complete `\\boxed{...}` (`rewards.boxed`); equivalence
with the reference is math-verify's (grader v1) or math-verify's after the normalisations of
`rewards.v2` (grader v2), on both answers re-wrapped as `\\boxed{...}`. Nothing from a completion is
ever executed: only `last_boxed` and math-verify's LaTeX parser read it, in a worker.

Failures are never verdicts:
- math-verify's own timeouts are off (it reports them as `[]` / False, i.e. format_rejected / wrong);
  the worker arms a CPU-time timer whose exception is a BaseException that math-verify's
  `except Exception` clauses cannot swallow.
- math-verify and sympy also swallow MemoryError and RecursionError into "not equal"; the worker
  takes both out from under `Exception` (`_escape_except_exception`), so they reach the worker loop.
- The limit is CPU time, not wall time, so a loaded machine grades slower but gives the same verdicts;
  the parent kills a worker past `timeout_s + 0.5 s` of CPU (a C-level loop the timer cannot reach)
  or past the wall-clock backstop `wall_timeout_s` (a worker that is blocked rather than computing).
- The caller only measures lengths: the scan for the last box runs in the worker, under the timer.
"""

import atexit
import ctypes
import functools
import importlib
import json
import logging
import math
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from multiprocessing.connection import wait

import math_verify
from math_verify import LatexExtractionConfig

from rewards.boxed import last_boxed
from rewards.outcome import GRADER_VERSION, Outcome, grader_version

logger = logging.getLogger(__name__)

_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0),)
_CPU_GRACE_S = 0.5  # CPU time past timeout_s after which the parent kills a worker the timer did not stop
_POLL_S = 0.05  # how often the parent looks at the CPU time of workers that have run for timeout_s
_JUDGES = {"v1": "rewards.grader:judge", "v2": "rewards.v2:judge_v2"}

Judge = Callable[[str, str], Outcome]


@dataclass(frozen=True)
class Grade:
    outcome: Outcome
    answer: str | None  # the last complete box's content (its first max_answer_chars), None if no box
    grader_version: str = GRADER_VERSION


@dataclass
class BatchReport:
    """What one `grade_batch` cost and where the grader failed; `to_log()` gives flat trainer-log keys."""

    items: int = 0
    sent: int = 0  # items sent to a worker
    indeterminate: int = 0
    timeouts: int = 0  # CPU limit in the worker, or killed by the parent's CPU or wall backstop
    resource_failures: int = 0  # MemoryError or RecursionError while grading
    crashes: int = 0  # the worker died or answered garbage mid-item
    errors: int = 0  # any other exception while grading
    oversize: int = 0  # completion longer than max_completion_chars or box longer than max_answer_chars
    deadline: int = 0  # not graded before the batch deadline
    start_failures: int = 0  # replacement workers that did not come up (their items: indeterminate)
    recycled: int = 0  # workers retired after recycle_after items or after a timeout / failure
    seconds: float = 0.0  # wall time of the batch
    seconds_lost: float = 0.0  # wall time workers spent on items that then timed out or hit the deadline
    cpu_seconds: float = 0.0  # CPU time workers spent on the finished items (what batch_cpu_s bounds)

    def to_log(self, prefix: str = "grader/") -> dict[str, float]:
        return {prefix + f.name: getattr(self, f.name) for f in fields(self)}


def parse_boxed(content: str) -> list:
    """math-verify's parse of `content` as the content of a box, without its own timeout (shared by v1 and v2)."""
    return math_verify.parse(
        "\\boxed{" + content + "}", extraction_config=_EXTRACTION, parsing_timeout=None, raise_on_error=True
    )


@functools.lru_cache(maxsize=1024)
def parse_reference(reference: str) -> tuple:
    # The G rollouts of a problem share its reference: parse it once per worker, not G times.
    return tuple(parse_boxed(reference))


def judge(answer: str, reference: str) -> Outcome:
    """Grader v1: compare an extracted, non-empty answer with the reference. No limits of its own."""
    target = parse_boxed(answer)
    if not target:
        return Outcome.FORMAT_REJECTED  # the last box cannot be parsed
    gold = list(parse_reference(reference))
    if not gold:
        raise ValueError("the reference answer cannot be parsed")
    equal = math_verify.verify(gold, target, timeout_seconds=None, raise_on_error=True)
    return Outcome.CORRECT if equal else Outcome.WRONG


def _judge_fn(name: str) -> Judge:
    module, _, attr = name.partition(":")
    return getattr(importlib.import_module(module), attr)


def _decide_early(answer: str | None, truncated: bool, max_answer_chars: int) -> tuple[Outcome | None, str]:
    """(outcome, cause) for what needs no math-verify; (None, "") when the answer must be judged."""
    if truncated:
        return Outcome.TRUNCATED, ""
    if answer is None or not answer.strip():
        return Outcome.FORMAT_REJECTED, ""
    if len(answer) > max_answer_chars:
        return Outcome.INDETERMINATE, "oversize"  # a length cap is a grader limit, not a verdict
    return None, ""


def grade(
    completion: str, reference: str, truncated: bool, grader: str = "v1", max_answer_chars: int = 2000
) -> Grade:
    """Grade one completion in this process, with no time or memory limit: use GraderPool for model text."""
    judge_fn = _judge_fn(_JUDGES[grader]) if grader in _JUDGES else None
    version = grader_version(grader)
    answer = last_boxed(completion)
    outcome, _ = _decide_early(answer, truncated, max_answer_chars)
    if outcome is None:
        try:
            outcome = judge_fn(answer, reference)
        except Exception as exc:  # any grader failure is indeterminate, by definition
            logger.warning("grading failed (%s): outcome indeterminate", type(exc).__name__)
            outcome = Outcome.INDETERMINATE
    return Grade(outcome, answer, version)


# --- worker ----------------------------------------------------------------------------------------
class _WorkerTimeout(BaseException):
    """Raised by the worker's CPU timer; not an Exception, so math-verify's handlers let it through."""


def _on_timer(signum, frame):
    raise _WorkerTimeout


def _escape_except_exception(exc_type: type[BaseException]) -> None:
    """Make `except Exception` (and `except RuntimeError` ...) blind to `exc_type`, in this process only.

    math-verify and sympy wrap comparisons in `except Exception: return False`, which turns running out
    of memory or stack into "not equal". `except` matches by the class's MRO, so the worker rewrites the
    MRO of these two built-in classes to (cls, BaseException, object): no handler between them and
    BaseException matches any more, `except MemoryError` still does. CPython keeps a built-in type's MRO
    in `tp_mro`, which Python cannot assign; ctypes swaps the pointer, then the type's caches are reset.
    """
    new = (exc_type, BaseException, object)
    slots = (ctypes.c_void_p * 64).from_address(id(exc_type))  # the PyTypeObject, as pointer-sized words
    where = [i for i in range(64) if slots[i] == id(exc_type.__mro__)]
    if len(where) != 1:
        raise RuntimeError(f"cannot find the MRO slot of {exc_type.__name__} in this interpreter")
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(new))  # owned by the type from now on
    slots[where[0]] = id(new)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(exc_type))
    if issubclass(exc_type, Exception):
        raise RuntimeError(f"{exc_type.__name__} is still an Exception")


def _send(protocol, message) -> None:
    protocol.write(json.dumps(message).encode() + b"\n")
    protocol.flush()


def _worker_main(memory_mb: str, timeout_s: str, max_answer_chars: str, judge_name: str) -> None:
    """Worker loop: one JSON line in (completion, reference, truncated), two out: [answer] as soon as the
    scan has found it (so that the caller has it even if judging then kills the worker), then
    [outcome, cause]. `cause` is "" for a verdict, otherwise why the item is indeterminate: timeout,
    memory, recursion, error, oversize. After a timeout, memory or recursion the parent replaces the worker.
    """
    signal.signal(
        signal.SIGINT, signal.SIG_IGN
    )  # Ctrl-C is the trainer's to report; we leave at end of input
    protocol = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print() from a library must not corrupt the protocol stream
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # its "timeout disabled" warning is expected
    cap = int(max_answer_chars)
    _escape_except_exception(MemoryError)
    _escape_except_exception(RecursionError)
    # Python's 4300-digit limit on int <-> str conversion is a denial-of-service guard that raises
    # ValueError, which math-verify would swallow into a verdict; the CPU timer is the guard here.
    sys.set_int_max_str_digits(0)
    judge("1", "1")  # import the LaTeX parser now: not under the memory limit, not on the first item's clock
    judge_fn = _judge_fn(judge_name)
    # The limit is headroom above what the interpreter and its imports already map, so it means the same
    # whatever the platform's baseline.
    with open("/proc/self/statm") as statm:
        mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    limit = mapped + int(memory_mb) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGPROF, _on_timer)
    protocol.write(b'"ready"\n')
    protocol.flush()
    for line in sys.stdin.buffer:
        completion, reference, truncated = json.loads(line)
        answer, cause = None, ""
        try:
            # ITIMER_PROF counts this process's CPU time (user + system): load slows it, never trips it.
            signal.setitimer(signal.ITIMER_PROF, float(timeout_s))
            try:
                answer = last_boxed(completion)
                _send(protocol, [None if answer is None else answer[:cap]])
                outcome, cause = _decide_early(answer, truncated, cap)
                if outcome is None:
                    outcome = judge_fn(answer, reference)
            finally:
                signal.setitimer(signal.ITIMER_PROF, 0)
        except _WorkerTimeout:
            outcome, cause = Outcome.INDETERMINATE, "timeout"
        except MemoryError:  # not an Exception here (see _escape_except_exception)
            outcome, cause = Outcome.INDETERMINATE, "memory"
        except RecursionError:
            outcome, cause = Outcome.INDETERMINATE, "recursion"
        except Exception:  # as in grade()
            outcome, cause = Outcome.INDETERMINATE, "error"
        if truncated:
            outcome = Outcome.TRUNCATED  # decided by the tokens, whatever happened to the scan
        if answer is None and cause:
            _send(protocol, [None])  # the scan itself failed: the parent still waits for an answer line
        del completion, line, answer  # a large text must not stay mapped while the next item is read
        _send(protocol, [outcome.value, cause])
    os._exit(0)  # end of input: the pool is closing; skip the slow teardown of sympy's caches


# A fresh interpreter that imports only the grader: never a fork of the trainer (torch threads, CUDA),
# and no re-import of the caller's __main__ as multiprocessing's spawn and forkserver would do.
_WORKER_CODE = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "from rewards.grader import _worker_main; _worker_main(*sys.argv[2:])"
)
_CLOCK_TICK = os.sysconf("SC_CLK_TCK")


class _Worker:
    def __init__(self, argv: list[str]):
        # A fixed hash seed keeps sympy's set/dict iteration order, hence outcomes, the same in every worker.
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        self.started = time.monotonic()
        self.ready = False
        self._pending = b""  # bytes after the last complete line read from the worker
        self.items_done = 0
        self.item = -1  # index of the item being graded
        self.sent_at = 0.0
        self.cpu_at_send = 0.0

    def cpu_seconds(self) -> float:
        """User + system CPU time of the worker so far (0 if it is gone: its end of file says the rest)."""
        try:
            with open(f"/proc/{self.process.pid}/stat", "rb") as stat:
                after_name = stat.read().rsplit(b")", 1)[1].split()
            return (int(after_name[11]) + int(after_name[12])) / _CLOCK_TICK  # utime, stime
        except (OSError, IndexError, ValueError):
            return 0.0

    def send(self, completion: str, reference: str, truncated: bool) -> None:
        self.process.stdin.write(json.dumps([completion, reference, truncated]).encode() + b"\n")
        self.process.stdin.flush()

    def receive(self) -> list:
        """The complete messages that have arrived: call when its stdout is readable (then it never blocks).

        Raw reads with our own line buffer: a buffered readline could hold a second message where the
        `wait` on the pipe no longer sees it. EOFError when the worker is gone.
        """
        chunk = os.read(self.process.stdout.fileno(), 1 << 16)
        if not chunk:
            raise EOFError
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        return [json.loads(line) for line in lines]

    dying: list[subprocess.Popen] = []  # killed, not yet reaped: tearing down a large process takes a while

    def kill(self) -> None:
        """SIGKILL without waiting for the exit: the caller's batch must not wait on the kernel's teardown."""
        self.process.kill()
        if self.process.poll() is None:
            _Worker.dying.append(self.process)
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                pipe.close()
            except OSError:  # a flush into a dead worker's pipe
                pass

    @staticmethod
    def reap(block: bool = False) -> None:
        _Worker.dying = [p for p in _Worker.dying if (p.wait() if block else p.poll()) is None]

    def stop(self) -> None:
        """Wait for the worker to leave after `self.process.stdin` was closed (end of input ends its loop)."""
        try:
            self.process.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process.stdout.close()


class GraderPool:
    """Worker processes that grade untrusted completions under CPU, memory, length and batch limits.

    - `timeout_s`: CPU seconds per item (the verdict-deciding limit; machine load does not change it).
    - `wall_timeout_s`: wall-clock backstop per item (default 2 × timeout_s + 1): the longest one item
      can hold a worker, whatever it does.
    - `batch_cpu_s`: CPU seconds the workers may spend on one `grade_batch` (a flood of slow items
      stops there; ordinary items cost milliseconds); `batch_timeout_s`: a wall-clock deadline of one
      `grade_batch`, a last resort for a stalled machine. Items not graded by either are indeterminate
      and counted in `last_report.deadline` (None: no such limit).
    - `max_completion_chars`: longer completions are indeterminate without being sent anywhere;
      `max_answer_chars`: a longer last box is indeterminate without being parsed.
    - `recycle_after`: a worker is replaced after this many items, and after any timeout, crash or
      resource failure, so that no item is graded by a process an earlier item left in a bad state.
    - A replacement that does not start within `startup_timeout_s` is a warning and its items are
      indeterminate; only the constructor raises when its workers cannot start.

    `grader` is "v1" (math-verify's verdicts) or "v2" (`rewards.v2`). `judge` replaces the in-worker
    comparison; it exists for tests and must be a module-level function (the worker imports it by name).
    Outcomes do not depend on the number of workers. `last_report` describes the last batch.
    """

    def __init__(
        self,
        workers: int = 2,
        timeout_s: float = 5.0,
        memory_mb: int = 1024,
        judge: Judge | None = None,
        *,
        grader: str = "v1",
        wall_timeout_s: float | None = None,
        batch_cpu_s: float | None = 120.0,
        batch_timeout_s: float | None = 1800.0,
        max_completion_chars: int = 2_000_000,
        max_answer_chars: int = 2000,
        recycle_after: int = 1000,
        startup_timeout_s: float = 120.0,
    ):
        wall_timeout_s = 2 * timeout_s + 1 if wall_timeout_s is None else wall_timeout_s
        if workers < 1 or timeout_s <= 0 or memory_mb < 256 or wall_timeout_s < timeout_s:
            raise ValueError(
                f"GraderPool needs workers >= 1, timeout_s > 0, memory_mb >= 256 and wall_timeout_s >= "
                f"timeout_s, got workers={workers}, timeout_s={timeout_s}, memory_mb={memory_mb}, "
                f"wall_timeout_s={wall_timeout_s}"
            )
        for name, value in (("batch_cpu_s", batch_cpu_s), ("batch_timeout_s", batch_timeout_s)):
            if value is not None and value <= 0:
                raise ValueError(f"GraderPool {name} must be > 0 or None, got {value}")
        if min(max_completion_chars, max_answer_chars, recycle_after) < 1 or startup_timeout_s <= 0:
            raise ValueError(
                "GraderPool max_completion_chars, max_answer_chars, recycle_after and startup_timeout_s "
                "must be positive"
            )
        if judge is not None and not judge.__qualname__.isidentifier():
            raise ValueError(f"GraderPool judge must be a module-level function, got {judge.__qualname__}")
        self.grader_version = grader_version(grader)  # refuses an unknown grader
        judge_name = f"{judge.__module__}:{judge.__qualname__}" if judge else _JUDGES[grader]
        self._argv = [
            sys.executable,
            "-c",
            _WORKER_CODE,
            json.dumps(sys.path),
            str(memory_mb),
            str(timeout_s),
            str(max_answer_chars),
            judge_name,
        ]
        self._timeout_s, self._wall_timeout_s = timeout_s, wall_timeout_s
        self._batch_cpu_s = math.inf if batch_cpu_s is None else batch_cpu_s
        self._batch_timeout_s = math.inf if batch_timeout_s is None else batch_timeout_s
        self._max_completion_chars, self._recycle_after = max_completion_chars, recycle_after
        self._startup_timeout_s = startup_timeout_s
        self.last_report = BatchReport()
        self._lock = threading.Lock()
        self._workers: list[_Worker | None] = []
        try:
            self._workers = [_Worker(self._argv) for _ in range(workers)]
            for worker in self._workers:
                if not self._wait_ready(worker, startup_timeout_s):
                    raise RuntimeError(
                        f"grader worker (pid {worker.process.pid}) failed to start within "
                        f"{startup_timeout_s:g} s; see its stderr above"
                    )
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
                try:
                    worker.process.stdin.close()
                except OSError:
                    pass
            for worker in workers:
                worker.stop()
            self._workers = []
            _Worker.reap(block=True)

    # --- workers -----------------------------------------------------------------------------------
    @staticmethod
    def _wait_ready(worker: _Worker, timeout: float) -> bool:
        """Whether the worker said "ready" within `timeout` seconds (blocking)."""
        until = time.monotonic() + timeout
        try:
            while wait([worker.process.stdout], max(0.0, until - time.monotonic())):
                messages = worker.receive()
                if messages:
                    worker.ready = messages == ["ready"]
                    return worker.ready
        except (OSError, ValueError, EOFError):
            pass
        return False

    def _start(self, slot: int, report: BatchReport) -> None:
        _Worker.reap(block=True)  # the worker it replaces is gone first: never more processes than `workers`
        try:
            self._workers[slot] = _Worker(self._argv)
        except OSError as exc:  # fork refused: out of processes or memory
            report.start_failures += 1
            logger.warning("grader worker could not be started (%s)", exc)
            self._workers[slot] = None

    def _retire(self, slot: int, report: BatchReport) -> None:
        """Kill the worker in `slot`; a replacement starts when an item needs one (not on the caller's clock)."""
        if self._workers[slot] is None:
            return
        self._workers[slot].kill()
        self._workers[slot] = None
        report.recycled += 1

    # --- grading -----------------------------------------------------------------------------------
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
        _Worker.reap()
        start = time.monotonic()
        report = BatchReport(items=len(completions))
        outcomes: list[Outcome | None] = [None] * len(completions)
        answers: list[str | None] = [None] * len(completions)
        todo: deque[int] = deque()
        for i, (completion, cut) in enumerate(zip(completions, truncated)):
            if len(completion) > self._max_completion_chars:  # never scanned, never sent
                outcomes[i] = Outcome.TRUNCATED if cut else Outcome.INDETERMINATE
                report.oversize += not cut
            else:
                todo.append(i)
        items = (completions, references, [bool(t) for t in truncated])
        with self._lock:
            if not self._workers:
                raise RuntimeError("grade_batch on a closed GraderPool")
            busy: dict = {}  # worker stdout -> slot, for the items in flight
            try:
                self._run(todo, busy, items, outcomes, answers, report, start)
            except Exception:  # a bug here must not end the caller's step: the rest is indeterminate
                logger.exception("grader pool failed; the batch's unfinished items are indeterminate")
                report.errors += sum(o is None for o in outcomes)
                for slot in list(busy.values()):
                    self._retire(slot, report)
            except BaseException:  # e.g. KeyboardInterrupt: never leave a late answer in a pipe
                for slot in busy.values():
                    self._retire(slot, report)
                raise
        # truncation is decided by the tokens: whatever happened to the item's scan, it stays truncated
        outcomes = [
            Outcome.TRUNCATED if cut else o if o is not None else Outcome.INDETERMINATE
            for o, cut in zip(outcomes, items[2])
        ]
        report.indeterminate = sum(o is Outcome.INDETERMINATE for o in outcomes)
        report.seconds = time.monotonic() - start
        self.last_report = report
        failed = report.indeterminate
        if failed:
            logger.warning(
                "grader: %d of %d items indeterminate (%s); %.1f s lost to timeouts and the deadline",
                failed,
                report.items,
                ", ".join(
                    f"{k} {v}"
                    for k, v in asdict(report).items()
                    if k in ("timeouts", "resource_failures", "crashes", "errors", "oversize", "deadline")
                    and v
                ),
                report.seconds_lost,
            )
        return [Grade(o, a, self.grader_version) for o, a in zip(outcomes, answers)]

    def _run(self, todo: deque[int], busy: dict, items, outcomes: list, answers: list, report, start) -> None:
        completions, references, truncated = items
        deadline = start + self._batch_timeout_s
        failed_start: set[int] = set()  # slots whose replacement did not come up during this batch
        while todo or busy:
            now = time.monotonic()
            if now >= deadline or report.cpu_seconds >= self._batch_cpu_s:
                break
            for slot, worker in enumerate(self._workers):
                if worker is None and slot not in failed_start and todo:
                    self._start(slot, report)  # starts in the background; its "ready" is awaited below
                    if self._workers[slot] is None:
                        failed_start.add(slot)
                elif worker is not None and worker.ready and slot not in busy.values():
                    if (code := worker.process.poll()) is not None and todo:  # died between items
                        logger.warning(
                            "grader worker (pid %d) exited while idle (%s); starting a replacement",
                            worker.process.pid,
                            f"killed by signal {-code}" if code < 0 else f"exit status {code}",
                        )
                        worker.kill()
                        self._start(slot, report)
            busy_slots = set(busy.values())
            for slot, worker in enumerate(self._workers):
                if not todo:
                    break
                if worker is None or not worker.ready or slot in busy_slots:
                    continue
                i = todo.popleft()
                worker.item, worker.sent_at, worker.cpu_at_send = i, time.monotonic(), worker.cpu_seconds()
                try:
                    worker.send(completions[i], references[i], truncated[i])
                except OSError:  # it died while reading the item
                    outcomes[i] = Outcome.INDETERMINATE
                    report.crashes += 1
                    self._retire(slot, report)
                    continue
                report.sent += 1
                busy[worker.process.stdout] = slot
            starting = {
                w.process.stdout: slot
                for slot, w in enumerate(self._workers)
                if w is not None and not w.ready
            }
            if not busy and not starting:
                if todo:
                    logger.warning("grader: no worker could be started; %d items indeterminate", len(todo))
                    report.errors += len(todo)
                    todo.clear()
                break
            wake = [deadline]
            wake += [
                w.started + self._startup_timeout_s for w in map(self._workers.__getitem__, starting.values())
            ]
            for slot in busy.values():
                worker = self._workers[slot]
                wake.append(worker.sent_at + self._wall_timeout_s)
                # CPU time cannot outrun wall time in a single-threaded worker: look only once it could
                first_check = worker.sent_at + self._timeout_s + _CPU_GRACE_S
                wake.append(max(first_check, now + _POLL_S))
            for stdout in wait([*busy, *starting], timeout=max(0.0, min(wake) - time.monotonic())):
                if stdout in starting:
                    self._on_ready(starting[stdout], report, failed_start)
                elif self._on_answer(busy[stdout], outcomes, answers, report):
                    del busy[stdout]
            self._enforce_limits(busy, starting, outcomes, report, failed_start)
        # The batch's CPU budget or deadline: what is in flight or still waiting is not graded.
        now = time.monotonic()
        for stdout, slot in list(busy.items()):
            worker = self._workers[slot]
            outcomes[worker.item] = Outcome.TRUNCATED if truncated[worker.item] else Outcome.INDETERMINATE
            report.deadline += not truncated[worker.item]
            report.seconds_lost += now - worker.sent_at
            del busy[stdout]
            self._retire(slot, report)
        for i in todo:
            outcomes[i] = Outcome.TRUNCATED if truncated[i] else Outcome.INDETERMINATE
            report.deadline += not truncated[i]
        todo.clear()

    def _on_ready(self, slot: int, report: BatchReport, failed_start: set[int]) -> None:
        worker = self._workers[slot]
        if not self._wait_ready(worker, 0):
            try:  # a worker's end of file comes just before its exit: reap it, so the warning says how it ended
                worker.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                pass
            self._start_failed(slot, report, failed_start)

    def _start_failed(self, slot: int, report: BatchReport, failed_start: set[int]) -> None:
        worker = self._workers[slot]
        if (code := worker.process.poll()) is None:
            what = f"did not start within {self._startup_timeout_s:g} s"
        else:  # killed from outside, or it failed on the way up (its stderr is above)
            how = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
            what = f"exited ({how}) {time.monotonic() - worker.started:.1f} s after it was started, before it was ready"
        logger.warning(
            "grader worker (pid %d) %s; its items are indeterminate until a replacement starts",
            worker.process.pid,
            what,
        )
        worker.kill()
        self._workers[slot] = None
        report.start_failures += 1
        failed_start.add(slot)

    def _on_answer(self, slot: int, outcomes: list, answers: list, report: BatchReport) -> bool:
        """Read what the worker in `slot` sent; True once its item is finished."""
        worker = self._workers[slot]
        i = worker.item
        try:
            for message in worker.receive():
                if len(message) == 1:  # the scan's answer; the verdict follows
                    answers[i] = message[0]
                    continue
                value, cause = message
                outcomes[i] = Outcome(value)
                break
            else:
                return False
        except (OSError, ValueError, TypeError, EOFError):  # died: segfault, os._exit, the OOM killer
            outcomes[i], cause = Outcome.INDETERMINATE, "crash"
        worker.items_done += 1
        report.cpu_seconds += max(0.0, worker.cpu_seconds() - worker.cpu_at_send)
        if cause == "timeout":
            report.timeouts += 1
            report.seconds_lost += time.monotonic() - worker.sent_at
        elif cause in ("memory", "recursion"):
            report.resource_failures += 1
        elif cause == "crash":
            report.crashes += 1
        elif cause == "error":
            report.errors += 1
        elif cause == "oversize":
            report.oversize += 1
        if cause in ("timeout", "memory", "recursion", "crash") or worker.items_done >= self._recycle_after:
            self._retire(slot, report)
        return True

    def _enforce_limits(self, busy: dict, starting: dict, outcomes: list, report, failed_start) -> None:
        now = time.monotonic()
        for stdout, slot in list(busy.items()):
            worker = self._workers[slot]
            elapsed = now - worker.sent_at
            if elapsed >= self._wall_timeout_s or (
                elapsed >= self._timeout_s + _CPU_GRACE_S
                and worker.cpu_seconds() - worker.cpu_at_send >= self._timeout_s + _CPU_GRACE_S
            ):  # stuck where the in-worker timer cannot reach, or blocked without computing
                del busy[stdout]
                outcomes[worker.item] = Outcome.INDETERMINATE
                report.timeouts += 1
                report.seconds_lost += elapsed
                report.cpu_seconds += max(0.0, worker.cpu_seconds() - worker.cpu_at_send)
                self._retire(slot, report)
        for slot in starting.values():
            worker = self._workers[slot]
            if worker is not None and not worker.ready and now >= worker.started + self._startup_timeout_s:
                self._start_failed(slot, report, failed_start)


_default_pools: dict[str, GraderPool] = {}
_default_lock = threading.Lock()


def default_pool(grader: str = "v1") -> GraderPool:
    """A process-wide pool per grader version with the default settings, created on first use, closed at exit."""
    with _default_lock:
        if grader not in _default_pools:
            _default_pools[grader] = pool = GraderPool(grader=grader)
            atexit.register(pool.close)
        return _default_pools[grader]


def grade_batch(
    completions: Sequence[str], references: Sequence[str], truncated: Sequence[bool], grader: str = "v1"
) -> list[Grade]:
    """GraderPool.grade_batch on the default pool of `grader`."""
    return default_pool(grader).grade_batch(completions, references, truncated)
