"""A run's tasks: its snapshot (checked against the expected sha256), the evaluation sets chosen from it, and
the sampler over the training pool that remains (SPEC §5). One call, `run_tasks`, for the trainer's setup."""

from collections.abc import Mapping
from dataclasses import dataclass

from data.eval_sets import FIXED, HELDOUT, EvalSets, choose_eval_sets, heldout_pool_of
from data.sampler import TaskSampler
from data.snapshot import load_snapshot, snapshot_sha256


@dataclass(frozen=True)
class RunTasks:
    snapshot: dict  # run.json's {"path", "sha256"}
    tasks: Mapping[str, dict]  # every task of the snapshot, by id
    eval_sets: EvalSets
    sampler: TaskSampler  # over the training pool, seeded by task_seed

    def training_pool(self) -> dict[str, dict]:
        return {t: self.tasks[t] for t in self.eval_sets.train_pool}

    def eval_tasks(self) -> dict[str, list[dict]]:
        return {
            FIXED: [self.tasks[t] for t in self.eval_sets.fixed],
            HELDOUT: [self.tasks[t] for t in self.eval_sets.heldout],
        }


def run_tasks(args) -> RunTasks:
    """From a config's snapshot_path, snapshot_sha256, eval_set_seed, heldout_size, fixed_size, heldout_subject
    and task_seed."""
    sha = snapshot_sha256(args.snapshot_path)
    tasks = {
        row["id"]: row for row in load_snapshot(args.snapshot_path, expected_sha256=args.snapshot_sha256)
    }
    eval_sets = choose_eval_sets(
        list(tasks),
        seed=args.eval_set_seed,
        heldout_size=args.heldout_size,
        fixed_size=args.fixed_size,
        heldout_pool=heldout_pool_of(tasks.values(), args.heldout_subject),
    )
    sampler = TaskSampler(list(eval_sets.train_pool), seed=args.task_seed)
    return RunTasks({"path": str(args.snapshot_path), "sha256": sha}, tasks, eval_sets, sampler)
