"""Re-grade a run's evaluation files with another grader version, into new files.

    python -m rundir.regrade runs/S2 --grader v2      (make regrade RUN=runs/S2 GRADER=v2)

Reads every `results/eval_stepNNN[_capCCCC].jsonl`, grades each row's stored completion against its
reference with the chosen grader (a row whose outcome is `truncated` stays truncated: that is decided
by the tokens, not the grader), and writes `results/regrade-<grader>/` with the same file names plus
`summary.json`. The pool uses the run's own grader limits (workers, timeout, memory from run.json), so
that only the grader version differs. Nothing existing is overwritten: if that directory exists the command refuses. Prints
how many outcomes changed (old -> new) and how accuracy (correct / non-indeterminate) moves per set
and step, so a researcher can see whether a conclusion depends on the grader.
"""

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from data.atomic import refused_write, write_atomic
from rewards.grader import GraderPool
from rewards.outcome import Outcome, grader_version
from rundir import archive
from rundir.files import EVAL_FILE, read_jsonl


def _accuracy(outcomes: list[str]) -> float | None:
    gradeable = [o for o in outcomes if o != Outcome.INDETERMINATE]
    return sum(o == Outcome.CORRECT for o in gradeable) / len(gradeable) if gradeable else None


def _read_rows(path: Path) -> list[dict]:
    """The rows (rundir's reader: a torn or malformed row is refused by line) with what re-grading needs."""
    rows = read_jsonl(path)
    for number, row in enumerate(rows, 1):
        if missing := [k for k in ("set", "step", "outcome", "reference", "completion") if k not in row]:
            raise ValueError(f"{path}: row {number} lacks {', '.join(missing)}")
    return rows


def _run_limits(run_dir: Path) -> dict:
    """The run's own grader limits (run.json's resolved config), so that only the grader version changes."""
    run_file = run_dir / "run.json"
    config = json.loads(run_file.read_text()).get("config", {}) if run_file.is_file() else {}
    names = {"grader_workers": "workers", "grader_timeout_s": "timeout_s", "grader_memory_mb": "memory_mb"}
    return {arg: config[field] for field, arg in names.items() if field in config}


def regrade(run_dir: Path, grader: str, pool: GraderPool | None = None) -> dict:
    """Write `results/regrade-<grader>/` and return its summary (also written as summary.json)."""
    version = grader_version(grader)
    results = Path(run_dir) / "results"
    files = [p for p in archive.listing(results, "eval_step*.jsonl") if EVAL_FILE.fullmatch(p.name)]
    if not files:
        raise FileNotFoundError(f"{results}: no eval_stepNNN.jsonl files to re-grade")
    out_dir = results / f"regrade-{grader}"
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; not overwriting it (move it away to re-grade again)")
    own = pool is None
    limits = _run_limits(Path(run_dir)) if own else {}
    pool = pool or GraderPool(grader=grader, **limits)
    changes: Counter = Counter()
    accuracy: list[dict] = []
    written: dict[Path, bytes] = {}
    try:
        for path in files:
            rows = _read_rows(path)
            grades = pool.grade_batch(
                [r["completion"] for r in rows],
                [r["reference"] for r in rows],
                [r["outcome"] == Outcome.TRUNCATED for r in rows],
            )
            new_rows = []
            for row, g in zip(rows, grades, strict=True):
                changes[(row["outcome"], g.outcome.value)] += 1
                new_rows.append(
                    {**row, "outcome": g.outcome.value, "answer": g.answer, "grader_version": version}
                )
            for set_name in sorted({r["set"] for r in rows}):
                old = [r["outcome"] for r in rows if r["set"] == set_name]
                new = [r["outcome"] for r in new_rows if r["set"] == set_name]
                accuracy.append(
                    {
                        "file": path.name,
                        "step": rows[0]["step"],
                        "set": set_name,
                        "n": len(old),
                        "old": _accuracy(old),
                        "new": _accuracy(new),
                        "changed": sum(a != b for a, b in zip(old, new)),
                    }
                )
            data = "".join(json.dumps(r, allow_nan=False) + "\n" for r in new_rows)  # ASCII, as write_eval
            written[out_dir / path.name] = data.encode()
    finally:
        if own:
            pool.close()
    summary = {
        "run": str(run_dir),
        "grader_version": version,
        "limits": limits,
        "files": [p.name for p in files],
        "rows": sum(changes.values()),
        "changed": sum(n for (a, b), n in changes.items() if a != b),
        "transitions": [{"old": a, "new": b, "n": n} for (a, b), n in sorted(changes.items()) if a != b],
        "accuracy": accuracy,
    }
    out_dir.mkdir(parents=True)  # only now: a failed re-grade leaves nothing behind
    for path, data in written.items():
        write_atomic(path, data)
    write_atomic(out_dir / "summary.json", (json.dumps(summary, indent=2) + "\n").encode())
    return summary


def _fmt(accuracy: float | None) -> str:
    return "-" if accuracy is None else f"{accuracy:.3f}"


def format_summary(summary: dict) -> str:
    lines = [
        f"re-graded {summary['rows']} rows of {len(summary['files'])} eval files with {summary['grader_version']}"
        + (
            f" ({', '.join(f'{k}={v}' for k, v in summary['limits'].items())}: the run's)"
            if summary["limits"]
            else ""
        ),
        f"outcomes changed: {summary['changed']} of {summary['rows']}",
    ]
    if summary["transitions"]:
        lines += ["", "| old | new | rows |", "|---|---|---|"]
        lines += [f"| {t['old']} | {t['new']} | {t['n']} |" for t in summary["transitions"]]
    lines += [
        "",
        "| step | set | n | accuracy old | accuracy new | change | rows changed |",
        "|---|---|---|---|---|---|---|",
    ]
    for a in summary["accuracy"]:
        delta = "-" if None in (a["old"], a["new"]) else f"{a['new'] - a['old']:+.3f}"
        step = a["file"].removeprefix("eval_step").removesuffix(".jsonl")
        lines.append(
            f"| {step} | {a['set']} | {a['n']} | {_fmt(a['old'])} | {_fmt(a['new'])} | {delta} | {a['changed']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rundir.regrade", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--grader", default="v2", help="grader version to re-grade with: v1 or v2 (default v2)"
    )
    args = parser.parse_args(argv)
    try:
        summary = regrade(args.run_dir, args.grader)
    except (OSError, ValueError) as exc:
        print(f"regrade: {refused_write(exc) or exc}", file=sys.stderr)  # a read-only disk: path and reason
        return 2
    print(format_summary(summary))
    print(f"\nwritten: {args.run_dir / 'results' / f'regrade-{args.grader}'}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
