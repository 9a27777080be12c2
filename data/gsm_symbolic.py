"""GSM-Symbolic tasks from reasoning-gym as a pinned snapshot, with whole templates held out (issue 45).

reasoning-gym 0.1.25 (PyPI, Apache-2.0; the `tasks` extra) generates `gsm_symbolic` problems from 85 templates
of GSM8K problems with fresh numbers. A problem of a template the policy trained on says little about
generalisation, so the held-out set is whole templates: a seeded choice of `heldout_templates` of them, their
tasks marked subject `gsm_symbolic/heldout`, the others `gsm_symbolic/train`. A recipe with
`heldout_subject: gsm_symbolic/heldout` draws heldout300 from those alone and never trains on any of them
(data/eval_sets.py). `--heldout math500` selects MATH500 instead, read from its JSONL (never copied): its tasks
join the snapshot with subject `math500/<subject>` (`heldout_subject: math500/`), and the held-out templates
stay out of the file, so the training pool is the same for both choices.

    python -m data.gsm_symbolic --size 4000 --seed 0 --heldout-templates 12 --out gsm_symbolic.tasks.json
    python -m data.gsm_symbolic ... --heldout math500 --math500 ../shared/data/math500.jsonl --out FILE

Answers are numbers (reasoning-gym's `answer_value`; a float that is whole is written as an integer), ids are
`gsm-` + 12 hex digits of sha256(problem); a problem generated twice is kept once.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from data.snapshot import SnapshotError, read_math_jsonl, write_snapshot

DATASET = "gsm_symbolic"
TRAIN, HELDOUT = "gsm_symbolic/train", "gsm_symbolic/heldout"
MATH500 = "math500/"


def numeric_answer(value: object, where: str) -> str:
    """The reference as grader v1 reads it: an integer, or a finite decimal."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SnapshotError(f"{where}: answer_value must be a finite number, got {value!r}")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def heldout_templates(templates: Iterable[int], k: int, seed: int) -> frozenset[int]:
    """A seeded choice of `k` templates (depends only on the set of templates, the count and the seed)."""
    pool = sorted(set(templates))
    if not 0 < k < len(pool):
        raise SnapshotError(f"heldout_templates: must be between 1 and {len(pool) - 1}, got {k}")
    return frozenset(random.Random(seed).sample(pool, k))


def tasks_of(entries: Iterable[tuple[int, Mapping]], held: frozenset[int], seed: int) -> list[dict]:
    """Snapshot tasks from (template, reasoning-gym entry) pairs, in generation order; repeats dropped."""
    tasks, seen = [], set()
    for index, (template, entry) in enumerate(entries):
        problem = entry["question"]
        task_id = "gsm-" + hashlib.sha256(problem.encode("utf-8")).hexdigest()[:12]
        if task_id in seen:
            continue
        seen.add(task_id)
        meta = entry["metadata"]
        tasks.append(
            {
                "id": task_id,
                "problem": problem,
                "answer": numeric_answer(meta["answer_value"], f"{DATASET} seed {seed} index {index}"),
                "subject": HELDOUT if template in held else TRAIN,
                "level": None,
                "solution": meta.get("answer_cot"),
                "source_id": f"{DATASET}:seed{seed}:index{index}:template{template}",
            }
        )
    return tasks


def generate(size: int, seed: int) -> tuple[list[tuple[int, Mapping]], list[int]]:
    """(template, entry) pairs from reasoning-gym, and every template it draws from."""
    try:
        import reasoning_gym
        from reasoning_gym.arithmetic.gsm_symbolic.gsm_symbolic import tasks_ok
    except ImportError as e:
        raise SnapshotError(f"{DATASET}: needs reasoning-gym ({e}); pip install -e '.[tasks]'") from e
    dataset = reasoning_gym.create_dataset(DATASET, size=size, seed=seed)
    # the template of entry i: the dataset draws it before generating (GSMSymbolicDataset.task_indices)
    return [(dataset.task_indices[i], dataset[i]) for i in range(size)], list(tasks_ok)


def build(
    size: int, seed: int, n_heldout: int, heldout: str = "templates", math500: str | None = None
) -> list[dict]:
    entries, templates = generate(size, seed)
    held = heldout_templates(templates, n_heldout, seed)
    tasks = tasks_of(entries, held, seed)
    if heldout == "math500":
        if math500 is None:
            raise SnapshotError("--heldout math500: give --math500 PATH (MATH500's JSONL)")
        tasks = [t for t in tasks if t["subject"] == TRAIN]
        tasks += [t | {"subject": MATH500 + (t["subject"] or "")} for t in read_math_jsonl(math500)]
    return tasks


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m data.gsm_symbolic", description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, required=True, help="problems reasoning-gym generates")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--heldout-templates", type=int, default=12, help="templates held out whole")
    ap.add_argument("--heldout", choices=("templates", "math500"), default="templates")
    ap.add_argument("--math500", help="MATH500's JSONL (read, not copied), for --heldout math500")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if Path(args.out).exists():  # a pinned snapshot is never replaced
        print(f"error: {args.out}: exists (remove it or pick another --out)", file=sys.stderr)
        return 1
    try:
        tasks = build(args.size, args.seed, args.heldout_templates, args.heldout, args.math500)
        digest = write_snapshot(tasks, args.out)
    except (SnapshotError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    counts = {s: sum(t["subject"].startswith(s) for t in tasks) for s in (TRAIN, HELDOUT, MATH500)}
    print(f"{args.out}: {len(tasks)} tasks {counts}, sha256 {digest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
