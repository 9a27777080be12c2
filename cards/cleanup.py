"""Checkpoint clean-up: what the seed's save copied from the base model dir leaves a checkpoint, then our card."""

import logging
from pathlib import Path

from cards.checkpoint_card import write_checkpoint_card
from rundir.files import STEP_DIR

logger = logging.getLogger(__name__)

BASE_FILES = ("README.md", ".gitattributes")  # what the seed's save copied from the base model dir


def scrub_checkpoint_dir(ckpt_dir: Path | str, base_dir: Path | str) -> Path:
    """Remove the base model's README.md/.gitattributes from a saved checkpoint, then write our card.

    The seed's save copied the base model dir's README.md and .gitattributes into step010/, so the
    checkpoint carried the base model's card. Any file byte-identical to one of those, and any
    .gitattributes at all, is removed; the checkpoint's own card is then written from the run's files.
    """
    ckpt_dir, base_dir = Path(ckpt_dir), Path(base_dir)
    if not (m := STEP_DIR.fullmatch(ckpt_dir.name)):
        raise ValueError(f"{ckpt_dir}: not a stepNNN checkpoint directory")
    base = [p.read_bytes() for p in (base_dir / f for f in BASE_FILES) if p.is_file()]
    sizes = {len(b) for b in base}
    for path in sorted(p for p in ckpt_dir.rglob("*") if p.is_file()):
        if path.name == ".gitattributes" or (path.stat().st_size in sizes and path.read_bytes() in base):
            logger.info("removing %s (copied from the base model %s)", path, base_dir)
            path.unlink()
    return write_checkpoint_card(ckpt_dir.parent, int(m[1]))
