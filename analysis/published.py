"""Published reports and the rows they were computed from (SPEC §7: every run's run.json, steps.jsonl and
eval rows are committed beside its report), and recomputing a report's tables from those rows.

    python -m analysis.published [DOCS]    # `make check-docs`: exit 1 with one line per missing file

A published report is DOCS/experiment-*/**/report.md. Its "run directory" row records where each run was
written (a path on the machine that ran it, e.g. /tmp/R/seeds/S2-s0); the committed copy is the one folder
under the same DOCS/experiment-* whose path ends with the recorded path's last two parts (…/seeds/S2-s0).
That folder holds run.json, results/steps.jsonl and results/eval_stepNNN.jsonl for every step of the
report's "evaluated steps" row.
"""

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from data.eval_sets import HELDOUT
from rundir import archive
from rundir.files import RunFileError, eval_path


class PublishedError(ValueError):
    """A report that cannot be read or whose rows are not committed; the message names the file."""


@dataclass(frozen=True)
class Published:
    report: Path
    experiment: Path  # the DOCS/experiment-* folder it belongs to
    recorded: tuple[list[str], list[str]]  # run directories as the report records them, A and B
    steps: tuple[int, int]  # compared step of A and of B
    evaluated: tuple[list[int], list[int]]  # the steps every run of the arm evaluated
    primary: str


def published_reports(docs: Path) -> list[Path]:
    return sorted(Path(docs).glob("experiment-*/**/report.md"))


def read_report(report: Path) -> Published:
    text = Path(report).read_text()
    rows = {cells[0]: cells[1:] for cells in _rows(text)}
    for need in ("run directory", "compared step", "evaluated steps (every seed)"):
        if need not in rows or len(rows[need]) != 2:
            raise PublishedError(f"{report}: no '{need}' row with an A and a B cell")
    primary = re.search(r"\*\*Primary comparison: (\S+?),", text)
    experiment = next((p for p in Path(report).parents if p.name.startswith("experiment-")), None)
    if experiment is None:
        raise PublishedError(f"{report}: not under a docs/experiment-* folder")
    return Published(
        report=Path(report),
        experiment=experiment,
        recorded=tuple(re.findall(r"`([^`]+)`", cell) for cell in rows["run directory"]),
        steps=tuple(int(cell) for cell in rows["compared step"]),
        evaluated=tuple([int(s) for s in cell.split(", ")] for cell in rows["evaluated steps (every seed)"]),
        primary=primary[1] if primary else HELDOUT,
    )


def committed_run(experiment: Path, recorded: str) -> Path | None:
    """The folder under `experiment` whose path ends with the recorded run directory's last two parts."""
    tail = Path(recorded).parts[-2:]
    found = [p for p in archive.folders(experiment) if p.parts[-len(tail) :] == tail]
    return found[0] if len(found) == 1 else None


def missing_rows(report: Path) -> list[str]:
    """One line per file the report was computed from that is not committed beside it; [] when all are."""
    pub = read_report(report)
    missing = []
    for recorded, evaluated in zip(pub.recorded, pub.evaluated):
        for path in recorded:
            tail = "/".join(Path(path).parts[-2:])
            run = committed_run(pub.experiment, path)
            if run is None:
                missing.append(f"{report}: run {path}: no single committed folder {pub.experiment}/**/{tail}")
                continue
            needed = [run / "run.json", run / "results/steps.jsonl", *(eval_path(run, s) for s in evaluated)]
            missing += [
                f"{report}: run {path}: {f} is not committed" for f in needed if not archive.exists(f)
            ]
    return missing


def recompute(
    report: Path, out: Path, *, n_resamples: int = 100_000, seed: int = 0
) -> tuple[list[str], list[str]]:
    """(the report's table rows, the same rows recomputed by analysis.compare from the committed runs),
    each without the "run directory" row (paths of the machine that ran it)."""
    from analysis.compare import compare_runs  # loads matplotlib: only when recomputing

    if missing := missing_rows(report):
        raise PublishedError(missing[0] + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    pub = read_report(report)
    runs = [[str(committed_run(pub.experiment, p)) for p in side] for side in pub.recorded]
    c = compare_runs(
        runs[0],
        runs[1],
        out,
        step_a=pub.steps[0],
        step_b=pub.steps[1],
        primary=pub.primary,
        n_resamples=n_resamples,
        seed=seed,
    )
    return table_rows(pub.report.read_text()), table_rows(c.report.read_text())


def table_rows(text: str) -> list[str]:
    """Every markdown table row of a report but the run directories."""
    return [line for line in text.splitlines() if line.startswith("|") and "| run directory |" not in line]


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip().strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("|")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analysis.published", description=__doc__.split("\n")[0])
    parser.add_argument(
        "docs", nargs="?", type=Path, default=Path("docs"), help="the docs folder (default docs)"
    )
    args = parser.parse_args(argv)
    reports, problems = published_reports(args.docs), []
    for report in reports:
        try:
            problems += missing_rows(report)
        except (PublishedError, RunFileError) as e:  # RunFileError: a damaged rows.tar.xz, named once
            if str(e) not in problems:
                problems.append(str(e))
    for line in problems:
        print(line, file=sys.stderr)
    print(f"{len(reports)} published report(s) under {args.docs}/experiment-*: "
          f"{'every row committed' if not problems else f'{len(problems)} missing file(s)'}")  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
