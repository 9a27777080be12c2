"""A run's tasks: its snapshot (checked against the expected sha256), the evaluation sets chosen from it, and
the sampler over the training pool that remains (SPEC §5). One call, `run_tasks`, for the trainer's setup."""

from collections.abc import Mapping
from dataclasses import dataclass

from data.eval_sets import FIXED, HELDOUT, EvalSets, choose_eval_sets, heldout_pool_of
from data.sampler import TaskSampler
from data.snapshot import load_snapshot, read_math_jsonl, snapshot_sha256


@dataclass(frozen=True)
class RunTasks:
    snapshot: dict  # run.json's {"path", "sha256"}
    tasks: Mapping[str, dict]  # every task of the snapshot, by id
    eval_sets: EvalSets
    sampler: TaskSampler  # over the training pool, seeded by task_seed
    extra_sets: Mapping[str, list[dict]]  # eval_set_files' sets, by name: every problem of each file
    extra_files: Mapping[str, dict]  # run.json's {name: {"path", "sha256", "tasks"}} of those files

    def training_pool(self) -> dict[str, dict]:
        return {t: self.tasks[t] for t in self.eval_sets.train_pool}

    def eval_tasks(self) -> dict[str, list[dict]]:
        return {
            FIXED: [self.tasks[t] for t in self.eval_sets.fixed],
            HELDOUT: [self.tasks[t] for t in self.eval_sets.heldout],
        }


def eval_set_file(path) -> list[dict]:
    """An evaluation set's file (eval_set_files): a *.tasks.json snapshot or MATH-format JSONL, every task, by id."""
    rows = load_snapshot(path) if str(path).endswith(".tasks.json") else read_math_jsonl(path)
    return sorted((dict(r) for r in rows), key=lambda t: t["id"])


def run_tasks(args) -> RunTasks:
    """From a config's snapshot_path, snapshot_sha256, eval_set_seed, heldout_size, fixed_size, heldout_subject,
    task_seed and eval_set_files."""
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
    extra_sets, extra_files = {}, {}
    for name, path in sorted((args.eval_set_files or {}).items()):
        extra_sets[name] = eval_set_file(path)
        extra_files[name] = {
            "path": str(path),
            "sha256": snapshot_sha256(path),
            "tasks": len(extra_sets[name]),
        }
    snapshot = {"path": str(args.snapshot_path), "sha256": sha}
    return RunTasks(snapshot, tasks, eval_sets, sampler, extra_sets, extra_files)
