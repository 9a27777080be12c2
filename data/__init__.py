"""Task data: snapshots, the prompt, evaluation sets and the task sampler.

Exports load lazily (PEP 562): `python -m data.snapshot` would otherwise find its module already
imported by the package, and importing `data.prompt` need not pull in `datasets`.
"""

import importlib

_EXPORTS = {
    "FIXED": "data.eval_sets",
    "HELDOUT": "data.eval_sets",
    "EvalSets": "data.eval_sets",
    "choose_eval_sets": "data.eval_sets",
    "RunTasks": "data.run_tasks",
    "run_tasks": "data.run_tasks",
    "TaskSampler": "data.sampler",
    "pool_fingerprint": "data.sampler",
    "SnapshotError": "data.snapshot",
    "convert_math_jsonl": "data.snapshot",
    "load_snapshot": "data.snapshot",
    "math_task_id": "data.snapshot",
    "snapshot_sha256": "data.snapshot",
    "snapshot_to_math_jsonl": "data.snapshot",
    "write_snapshot": "data.snapshot",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'data' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
