"""Evaluation sets (SPEC §5): a held-out set never trained on and a fixed set drawn from the training pool.

The set names `fixed32` and `heldout300` are the user's and stay the same when a small snapshot needs
smaller sets; the size of a set is the length of its id list. The choice depends only on the seed, the
sizes and the set of ids (not their order), so the same snapshot gives the same sets on any machine.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

FIXED = "fixed32"
HELDOUT = "heldout300"


@dataclass(frozen=True)
class EvalSets:
    heldout: tuple[str, ...]
    fixed: tuple[str, ...]
    train_pool: tuple[str, ...]

    @property
    def sizes(self) -> dict[str, int]:
        return {FIXED: len(self.fixed), HELDOUT: len(self.heldout)}

    def to_json(self) -> dict[str, list[str]]:
        """The `eval_sets` object of run.json."""
        return {FIXED: list(self.fixed), HELDOUT: list(self.heldout)}

    @classmethod
    def from_json(cls, data: Mapping, task_ids: Sequence[str]) -> EvalSets:
        """Rebuild recorded sets against the snapshot's ids, refusing sets that do not fit the snapshot."""
        ids = _unique(task_ids)
        sets = {}
        for name in (FIXED, HELDOUT):
            if not isinstance(data.get(name), list) or not all(isinstance(i, str) for i in data[name]):
                raise ValueError(f"eval sets: {name!r} must be a list of task ids")
            sets[name] = tuple(data[name])
            if len(set(sets[name])) != len(sets[name]):
                raise ValueError(f"eval sets: {name!r} lists a task id more than once")
            unknown = sorted(set(sets[name]) - set(ids))
            if unknown:
                raise ValueError(
                    f"eval sets: {name!r} has {len(unknown)} ids not in the snapshot, e.g. {unknown[0]!r}"
                )
        overlap = sorted(set(sets[FIXED]) & set(sets[HELDOUT]))
        if overlap:
            raise ValueError(f"eval sets: {FIXED!r} and {HELDOUT!r} share ids, e.g. {overlap[0]!r}")
        heldout = set(sets[HELDOUT])
        return cls(sets[HELDOUT], sets[FIXED], tuple(i for i in ids if i not in heldout))


def _unique(task_ids: Sequence[str]) -> list[str]:
    ids = list(task_ids)
    seen = set()
    for task_id in ids:
        if task_id in seen:
            raise ValueError(f"eval sets: task id {task_id!r} appears more than once")
        seen.add(task_id)
    return ids


def choose_eval_sets(
    task_ids: Sequence[str],
    *,
    seed: int,
    heldout_size: int = 300,
    fixed_size: int = 32,
    heldout_pool: Sequence[str] | None = None,
) -> EvalSets:
    """Held-out and fixed sets chosen by a seeded shuffle of the sorted ids; the rest is the training pool.

    With `heldout_pool` (the tasks of whole held-out templates, or a second evaluation set such as MATH500:
    `heldout_pool_of`), heldout300 is drawn from it alone and none of it is ever in the training pool."""
    ids = _unique(task_ids)
    if heldout_size < 0 or fixed_size < 0:
        raise ValueError(f"eval sets: sizes must be >= 0, got heldout={heldout_size}, fixed={fixed_size}")
    if heldout_pool is not None:
        pool = set(heldout_pool)
        if unknown := sorted(pool - set(ids)):
            raise ValueError(f"eval sets: the held-out pool has ids not in the snapshot, e.g. {unknown[0]!r}")
        if len(pool) < heldout_size:
            raise ValueError(
                f"eval sets: the held-out pool has {len(pool)} tasks, fewer than {HELDOUT} of {heldout_size}; "
                "choose a smaller heldout_size"
            )
        heldout = sorted(pool)
        random.Random(seed).shuffle(heldout)
        trainable = sorted(i for i in ids if i not in pool)
        if len(trainable) < max(fixed_size, 1):
            raise ValueError(
                f"eval sets: {len(trainable)} tasks outside the held-out pool, but {FIXED} of {fixed_size} and "
                "the training pool need at least " + str(max(fixed_size, 1))
            )
        random.Random(seed).shuffle(trainable)
        fixed = tuple(sorted(trainable[:fixed_size]))
        return EvalSets(tuple(sorted(heldout[:heldout_size])), fixed, tuple(i for i in ids if i not in pool))
    # The training pool must keep at least one problem even when the fixed set is empty.
    needed = heldout_size + max(fixed_size, 1)
    if len(ids) < needed:
        raise ValueError(
            f"eval sets: the snapshot has {len(ids)} tasks, but {HELDOUT} of {heldout_size} and {FIXED} of "
            f"{fixed_size} need at least {needed}; choose smaller heldout_size / fixed_size"
        )
    shuffled = sorted(ids)
    random.Random(seed).shuffle(shuffled)
    heldout = tuple(sorted(shuffled[:heldout_size]))
    fixed = tuple(sorted(shuffled[heldout_size : heldout_size + fixed_size]))
    held = set(heldout)
    return EvalSets(heldout, fixed, tuple(i for i in ids if i not in held))


def heldout_pool_of(tasks: Iterable[Mapping], subject: str) -> list[str] | None:
    """Ids of the tasks whose subject starts with `subject` (None for ""): the snapshot's own marking of what is
    held out, e.g. "gsm_symbolic/heldout" (whole templates) or "math500/" (data/gsm_symbolic.py)."""
    if not subject:
        return None
    ids = [t["id"] for t in tasks if (t.get("subject") or "").startswith(subject)]
    if not ids:
        raise ValueError(f"eval sets: heldout_subject {subject!r}: no task of the snapshot has that subject")
    return ids


def extra_evals_by_cap(entries) -> dict[int, list[str]]:
    """A config's `extra_evals` (SET@CAP strings, checked when the config is built) as {cap: [set names]}."""
    by_cap: dict[int, list[str]] = {}
    for entry in entries:
        name, _, cap = str(entry).rpartition("@")
        by_cap.setdefault(int(cap), []).append(name)
    return by_cap
