"""Evaluation sets (SPEC §5): a held-out set never trained on and a fixed set drawn from the training pool.

The set names `fixed32` and `heldout300` are the user's and stay the same when a small snapshot needs
smaller sets; the size of a set is the length of its id list. The choice depends only on the seed, the
sizes and the set of ids (not their order), so the same snapshot gives the same sets on any machine.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
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
    task_ids: Sequence[str], *, seed: int, heldout_size: int = 300, fixed_size: int = 32
) -> EvalSets:
    """Held-out and fixed sets chosen by a seeded shuffle of the sorted ids; the rest is the training pool."""
    ids = _unique(task_ids)
    if heldout_size < 0 or fixed_size < 0:
        raise ValueError(f"eval sets: sizes must be >= 0, got heldout={heldout_size}, fixed={fixed_size}")
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
