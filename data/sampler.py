"""The seeded, resumable task sampler over the training pool (SPEC §3).

Epoch e visits every problem once, in the order of `random.Random(f"{seed}:{e}")` shuffling the sorted
ids, so the sequence depends only on the seed and the set of ids. The whole state is (epoch, position),
which makes a resumed sampler continue exactly where the interrupted one stopped.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence


def pool_fingerprint(task_ids: Sequence[str]) -> str:
    """sha256 of the sorted ids, one per line: identifies the pool a sampler state belongs to."""
    return hashlib.sha256("\n".join(sorted(task_ids)).encode("utf-8")).hexdigest()


class TaskSampler:
    def __init__(self, task_ids: Sequence[str], seed: int):
        ids = sorted(task_ids)
        if not ids:
            raise ValueError("task sampler: the training pool is empty")
        duplicates = sorted({a for a, b in zip(ids, ids[1:]) if a == b})
        if duplicates:
            raise ValueError(f"task sampler: task id {duplicates[0]!r} appears more than once in the pool")
        self._ids = tuple(ids)
        self._seed = seed
        self._fingerprint = pool_fingerprint(ids)
        self._move_to(0, 0)

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def position(self) -> int:
        """How many problems of the current epoch have been taken."""
        return self._position

    @property
    def pool_size(self) -> int:
        return len(self._ids)

    def _move_to(self, epoch: int, position: int) -> None:
        self._epoch, self._position = epoch, position
        self._order = list(self._ids)
        random.Random(f"{self._seed}:{epoch}").shuffle(self._order)

    def take(self, n: int) -> list[str]:
        """The next n problems; crosses into the next epoch when this one runs out."""
        if n < 0:
            raise ValueError(f"task sampler: cannot take {n} problems")
        taken: list[str] = []
        while len(taken) < n:
            end = min(self._position + n - len(taken), len(self._order))
            taken.extend(self._order[self._position : end])
            self._position = end
            # Roll over eagerly so that a state never records position == pool size.
            if self._position == len(self._order):
                self._move_to(self._epoch + 1, 0)
        return taken

    def state_dict(self) -> dict:
        return {
            "seed": self._seed,
            "epoch": self._epoch,
            "position": self._position,
            "pool_size": len(self._ids),
            "pool_sha256": self._fingerprint,
        }

    def load_state_dict(self, state: Mapping) -> None:
        """Continue from a saved state; refuses a state saved with another seed or over another pool."""
        for key in ("seed", "epoch", "position", "pool_sha256"):
            if key not in state:
                raise ValueError(f"task sampler state: missing field {key!r}")
        if state["pool_sha256"] != self._fingerprint:
            raise ValueError(
                f"task sampler state: saved over a different training pool (pool_sha256 {state['pool_sha256']}, "
                f"{state.get('pool_size', '?')} tasks) than this one (pool_sha256 {self._fingerprint}, "
                f"{len(self._ids)} tasks); resume with the same snapshot and eval sets"
            )
        if state["seed"] != self._seed:
            raise ValueError(
                f"task sampler state: saved with seed {state['seed']}, this sampler has {self._seed}"
            )
        epoch, position = state["epoch"], state["position"]
        for key, value in (("epoch", epoch), ("position", position)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(
                    f"task sampler state: field {key!r} must be a non-negative integer, got {value!r}"
                )
        if position >= len(self._ids):
            raise ValueError(
                f"task sampler state: field 'position' is {position}, the pool has {len(self._ids)} tasks"
            )
        self._move_to(epoch, position)
