"""What a resume from `stateNNN/` does to the run's files: the steps past the state are redone, so their rows
(and a torn last row) leave steps.jsonl and their eval files move to `results/superseded/`, where no reader
takes them for the resumed run's (the run's file readers list `results/eval_step*.jsonl` only)."""

import json
import logging
import os
from pathlib import Path

from data.atomic import write_atomic
from rundir.files import EVAL_FILE, RunFileError, read_jsonl, steps_path

logger = logging.getLogger(__name__)
SUPERSEDED = "superseded"


def rewind(run_dir: Path | str, *, after: int) -> list[Path]:
    """Drop the rows of steps past `after` and move their eval files aside; returns the moved files' new paths."""
    run_dir = Path(run_dir)
    path = steps_path(run_dir)
    if path.exists():
        rows = read_jsonl(path, torn_tail="drop")
        if any("step" not in r for r in rows):
            raise RunFileError(f"{path}: a row has no 'step'")
        kept = [json.dumps(r) + "\n" for r in rows if r["step"] <= after]
        write_atomic(path, "".join(kept).encode())
    moved = []
    for f in sorted((run_dir / "results").glob("eval_step*.jsonl")):
        if (m := EVAL_FILE.fullmatch(f.name)) and int(m[1]) > after:
            to = _free_name(run_dir / "results" / SUPERSEDED / f.name)
            to.parent.mkdir(exist_ok=True)
            os.replace(f, to)
            moved.append(to)
            logger.warning("moved %s to %s: its step is redone by this resume from step %d", f, to, after)
    return moved


def _free_name(path: Path) -> Path:
    """`path`, or `path` with .1, .2, ... before the suffix: nothing moved aside replaces an earlier one."""
    n, candidate = 0, path
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.stem}.{n}{path.suffix}")
    return candidate


def interrupted(run_dir: Path | str) -> str:
    """The one line a Ctrl-C ends a run with: the last step logged and where a resume continues from."""
    run_dir = Path(run_dir)
    path = steps_path(run_dir)
    try:
        rows = read_jsonl(path, torn_tail="drop") if path.is_file() else []
    except RunFileError:
        rows = []
    step = max((r.get("step", 0) for r in rows), default=0)
    states = sorted(p.name for p in run_dir.glob("state[0-9][0-9][0-9]*") if p.is_dir())
    start = f"from {states[-1]}/" if states else "from step 0: no state saved yet"
    return f"interrupted at step {step}; resume with --resume {run_dir} (it continues {start})"
