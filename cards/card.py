"""Model cards for checkpoints (`stepNNN/README.md`) and runs (`README.md`), built from the run's own files.

Cards never load weights: everything comes from run.json, results/*.jsonl, the checkpoint's config.json and
the list of stepNNN/ and stateNNN/ directories (docs/CONTRACTS.md, read through rundir.files). The parts:
`cards.policy_text` (the policy in words), `cards.metadata` (Hub metadata, rendering), `cards.checkpoint_card`,
`cards.run_card`, `cards.cleanup` (base-model files out of a checkpoint). This module writes them all:

    python -m cards.card runs/S2 [--control runs/S0] [--steps 10,20]
"""

import argparse
import os
import sys
from pathlib import Path

from analysis.pairing import CompareError
from cards.checkpoint_card import build_checkpoint_card
from cards.metadata import save_card
from cards.run_card import build_run_card
from data.atomic import refused_write
from rundir.files import Run, RunFileError, step_dir


def write_cards(
    run_dir: Path | str,
    control: Path | str | None = None,
    *,
    steps: list[int] | None = None,
    repo_id: str | None = None,
) -> list[Path]:
    """Every checkpoint card (or those of `steps`) and the run card, from one reading of the run's files."""
    run = Run(run_dir)
    cards = [
        (step_dir(run.dir, s) / "README.md", build_checkpoint_card(run, s, repo_id))
        for s in steps or run.saved
    ]
    cards.append((run.dir / "README.md", build_run_card(run, control, repo_id)))
    for path, card in cards:
        save_card(card, path)
    return [path for path, _ in cards]


def parse_steps(text: str | None) -> list[int] | None:
    """`10,20` → [10, 20] (the CLI and `make` form of a step list)."""
    if not text:
        return None
    try:
        return sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"--steps: expected comma-separated step numbers like 10,20, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the checkpoint cards and the run card of a run.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--control", type=Path, help="control run (e.g. runs/S0) for the paired comparison")
    parser.add_argument("--steps", help="only these checkpoints, e.g. 10,20 (default: every stepNNN/)")
    args = parser.parse_args(argv)
    try:
        paths = write_cards(args.run_dir, args.control, steps=parse_steps(args.steps))
    except (RunFileError, CompareError, FileNotFoundError, ValueError, OSError) as e:
        if os.environ.get("CAPGRPO_DEBUG", "") not in ("", "0"):
            raise
        if isinstance(e, OSError) and not isinstance(e, FileNotFoundError):
            if (refused := refused_write(e)) is None:  # not the disk refusing a card: a bug, its traceback
                raise
            e = refused  # a read-only run directory: the card's path
        print(
            f"error: {e}", file=sys.stderr
        )  # one line, as the other commands; CAPGRPO_DEBUG=1 for the traceback
        sys.exit(1)
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()
