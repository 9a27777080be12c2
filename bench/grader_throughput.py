"""Grader throughput on the 500 MATH500 answers, against plain math-verify, and latency on hostile text.

    .venv/bin/python -m bench.grader_throughput [--data ../shared/data/math500.jsonl] [--timeout 5]

Every item reaches math-verify: "self" grades each reference answer, boxed in a one-line completion,
against itself (all correct); "swapped" grades the next problem's answer against it (all but a few
wrong). Each is timed cold (a fresh pool, or for plain math-verify the first pass in this process)
and warm (the same pool or process again). Plain is `math_verify.verify(parse(gold), parse(answer))`
with math-verify's defaults, in this process: no isolation, no limits. Then each hostile completion
alone through a warm 2-worker pool with the default wall-clock backstop (2 x timeout + 1 s).
`--load-check` instead times two slow sympy comparisons on one core, alone and beside three busy processes.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections import Counter
from importlib.metadata import version
from pathlib import Path

import math_verify

from rewards.grader import GraderPool, grade

ROOT = Path(__file__).resolve().parents[1]


def math500_items(path: Path) -> dict[str, tuple[list[str], list[str]]]:
    answers = [json.loads(line)["answer"] for line in path.read_text().splitlines()]
    swapped = [answers[(i + 1) % len(answers)] for i in range(len(answers))]
    return {"self": (answers, answers), "swapped": (swapped, answers)}


def _completion(answer: str) -> str:
    return f"So the final answer is $\\boxed{{{answer}}}$."


def hostile_completions() -> dict[str, str]:
    shell = "__import__('os').system('touch /tmp/capgrpo-bench-pwned')"
    return {
        "1.9 MB of text, box at the end": "blah { \\frac{1}{2} " * 100_000 + "\\boxed{1}",
        "50 MB of text": "blah { " * 7_500_000 + "\\boxed{1}",
        "10 MB box": "\\boxed{" + "1+" * 5_000_000 + "1}",
        "900 nested braces": "\\boxed{" + "{" * 900 + "1" + "}" * 900 + "}",
        "200 nested fractions": "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}",
        "9^9^9^9^9": "\\boxed{9^9^9^9^9}",
        "9^{9^{9^{9^{9}}}}": "\\boxed{9^{9^{9^{9^{9}}}}}",
        "10^{10^{10}}": "\\boxed{10^{10^{10}}}",
        "2^{2^{32}} (512 MB integer)": "\\boxed{2^{2^{32}}}",
        "1+1+...+1 (900 terms)": "\\boxed{" + "1+" * 900 + "1}",
        "NUL bytes": "\x00\\boxed{1\x002}\x00",
        "python in the box": f"\\boxed{{{shell}}}",
    }


def _line(label: str, n: int, seconds: float, mix: Counter) -> None:
    print(f"  {label:34} {n / seconds:8.1f} items/s  ({n} in {seconds:5.2f} s)  {dict(sorted(mix.items()))}")


def plain(pairs: tuple[list[str], list[str]]) -> Counter:
    mix = Counter()
    for answer, reference in zip(*pairs):
        mix[
            math_verify.verify(
                math_verify.parse(_completion(reference)), math_verify.parse(_completion(answer))
            )
        ] += 1
    return mix


def load_check(timeout: float) -> None:
    """Wall and CPU time of slow sympy comparisons on one core, alone and shared with three busy processes."""
    items = [("(x+1)^{24}-(x-1)^{24}", "(1+x)^{24}-(x-1)^{24}+1"), ("\\sin(x)^{20}", "\\cos(x)^{20}")]
    affinity = os.sched_getaffinity(0)
    cpu = min(affinity)
    os.sched_setaffinity(0, {cpu})  # the workers inherit the one core
    try:
        for hogs in (0, 3):
            procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
            try:
                for answer, reference in items:  # a fresh worker each: no item finds another's caches warm
                    with GraderPool(workers=1, timeout_s=timeout, wall_timeout_s=20 * timeout) as pool:
                        pool.grade_batch(["\\boxed{1}"], ["1"], [False])
                        [g] = pool.grade_batch([_completion(answer)], [reference], [False])
                    r = pool.last_report
                    print(
                        f"  {hogs} hogs  {answer:24} {g.outcome.value:13} wall {r.seconds:5.2f} s  "
                        f"CPU {r.cpu_seconds:5.2f} s"
                    )
            finally:
                for proc in procs:
                    proc.kill()
                    proc.wait()
    finally:
        os.sched_setaffinity(0, affinity)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "math500.jsonl")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-item CPU timeout of the pools (s)")
    parser.add_argument("--skip-hostile", action="store_true")
    parser.add_argument(
        "--load-check",
        action="store_true",
        help="only: slow sympy items quiet and under 3 CPU hogs on one core",
    )
    args = parser.parse_args()
    print(
        f"{platform.node()}  {platform.processor() or platform.machine()}  {os.cpu_count()} CPUs  "
        f"python {platform.python_version()}  math-verify {version('math-verify')}"
    )
    print(f"load average at start: {os.getloadavg()}")
    if args.load_check:
        load_check(args.timeout)
        return
    sets = math500_items(args.data)

    for name, (answers, references) in sets.items():
        print(f"{name}: {len(answers)} MATH500 answers, every one judged by math-verify")
        for run in ("cold", "warm"):
            start = time.perf_counter()
            mix = plain((answers, references))
            _line(f"plain math_verify.verify, {run}", len(answers), time.perf_counter() - start, mix)
        for run in ("cold", "warm"):
            start = time.perf_counter()
            grades = [grade(_completion(a), r, False) for a, r in zip(answers, references)]
            seconds = time.perf_counter() - start
            _line(
                f"in-process grade(), {run}", len(answers), seconds, Counter(g.outcome.value for g in grades)
            )
        for workers in (1, 2):
            start = time.perf_counter()
            with GraderPool(workers=workers, timeout_s=args.timeout) as pool:
                print(f"  pool start, {workers} worker(s): {time.perf_counter() - start:.2f} s")
                for run in ("cold", "warm"):
                    start = time.perf_counter()
                    grades = pool.grade_batch(
                        [_completion(a) for a in answers], references, [False] * len(answers)
                    )
                    seconds = time.perf_counter() - start
                    mix = Counter(g.outcome.value for g in grades)
                    _line(f"GraderPool({workers} workers), {run}", len(answers), seconds, mix)
    print(f"load average after throughput: {os.getloadavg()}")
    if args.skip_hostile:
        return

    print(
        f"hostile completions, one per batch, 2 warm workers, CPU timeout {args.timeout:g} s, wall backstop default:"
    )
    with GraderPool(workers=2, timeout_s=args.timeout) as pool:
        worst = 0.0
        for name, completion in hostile_completions().items():
            pool.grade_batch(["\\boxed{1}"] * 2, ["1"] * 2, [False] * 2)  # replacement workers are up
            start = time.perf_counter()
            [g] = pool.grade_batch([completion], ["1"], [False])
            latency = time.perf_counter() - start
            worst = max(worst, latency)
            report = pool.last_report
            why = [k for k in ("timeouts", "resource_failures", "crashes", "oversize") if getattr(report, k)]
            print(f"  {name:32} {g.outcome.value:15} {latency:6.2f} s  {' '.join(why)}")
        print(f"  worst-case latency: {worst:.2f} s; load average now {os.getloadavg()}")


if __name__ == "__main__":
    main()
