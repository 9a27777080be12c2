"""Grader throughput on MATH500-style completions, and worst-case latency on hostile ones.

    .venv/bin/python bench/grader_throughput.py [--data ../shared/data/math500.jsonl] [--timeout 5]

Completions are built from the MATH500 solutions: the solution itself (its last box is the reference:
correct), the solution with its last box swapped for the next problem's answer (mostly wrong), and the
solution with every \\boxed removed (format_rejected). Prints items/s for in-process grading and for the
pool with 1 and 2 workers, then each hostile completion's latency through a 2-worker pool.
"""

import argparse
import json
import platform
import time
from collections import Counter
from pathlib import Path

from rewards.boxed import last_boxed
from rewards.grader import GraderPool, grade

ROOT = Path(__file__).resolve().parents[1]


def math500_completions(path: Path) -> tuple[list[str], list[str]]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    completions, references = [], []
    for i, row in enumerate(rows):
        solution, answer = row["solution"], row["answer"]
        box = "\\boxed{" + (last_boxed(solution) or "") + "}"
        wrong = rows[(i + 1) % len(rows)]["answer"]
        head, _, tail = solution.rpartition(box)
        completions += [solution, head + "\\boxed{" + wrong + "}" + tail, solution.replace("\\boxed", "")]
        references += [answer] * 3
    return completions, references


def hostile_completions() -> dict[str, str]:
    shell = "__import__('os').system('touch /tmp/capgrpo-bench-pwned')"
    return {
        "5 MB of text": "blah { \\frac{1}{2} " * 250_000 + "\\boxed{1}",
        "5000 nested braces": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
        "3000 nested fractions": "\\boxed{" + "\\frac{1}{" * 3000 + "2" + "}" * 3000 + "}",
        "tower 9^9^9^9^9": "\\boxed{9^9^9^9^9}",
        "tower 9^{9^{9^{9^{9}}}}": "\\boxed{9^{9^{9^{9^{9}}}}}",
        "10^{10^{10}}": "\\boxed{10^{10^{10}}}",
        "1+1+...+1 (100k terms)": "\\boxed{" + "1+" * 100_000 + "1}",
        "NUL bytes": "\x00\\boxed{1\x002}\x00",
        "python in the box": f"\\boxed{{{shell}}}",
    }


def throughput(label: str, fn, completions, references) -> None:
    start = time.perf_counter()
    grades = fn(completions, references, [False] * len(completions))
    seconds = time.perf_counter() - start
    mix = Counter(g.outcome.value for g in grades)
    print(f"{label:28} {len(grades) / seconds:8.1f} items/s  ({len(grades)} in {seconds:.1f} s)  {dict(mix)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "math500.jsonl")
    parser.add_argument("--timeout", type=float, default=5.0, help="per-item timeout of the pools (s)")
    args = parser.parse_args()
    print(
        f"{platform.node()}  {platform.processor() or platform.machine()}  python {platform.python_version()}"
    )
    completions, references = math500_completions(args.data)

    def in_process(completions, references, truncated):
        return [grade(*item) for item in zip(completions, references, truncated)]

    throughput("in-process", in_process, completions, references)
    for workers in (1, 2):
        start = time.perf_counter()
        with GraderPool(workers=workers, timeout_s=args.timeout) as pool:
            print(f"pool start, {workers} worker(s): {time.perf_counter() - start:.1f} s")
            throughput(f"pool, {workers} worker(s)", pool.grade_batch, completions, references)

    print(f"hostile completions, one per batch, 2 warm workers, timeout {args.timeout:g} s:")
    with GraderPool(workers=2, timeout_s=args.timeout) as pool:
        worst = 0.0
        for name, completion in hostile_completions().items():
            pool.grade_batch(["\\boxed{1}"] * 2, ["1"] * 2, [False] * 2)  # restarts any killed worker
            start = time.perf_counter()
            [g] = pool.grade_batch([completion], ["1"], [False])
            latency = time.perf_counter() - start
            worst = max(worst, latency)
            print(f"  {name:28} {g.outcome.value:15} {latency:6.2f} s")
        print(f"  worst-case latency: {worst:.2f} s")


if __name__ == "__main__":
    main()
