"""One step's global selection under `accelerate launch` (1 or 2 CPU processes, gloo), written as JSON.

Used by tests/test_distributed.py: groups and their outcomes are global, so the qualified groups,
advantages, loss masks and token normaliser must not depend on the number of processes.
"""

import json
import sys
from pathlib import Path

from scripted import generate, make_trainer, tiny_random_model

SCRIPT = {f"p{i}": s for i, s in enumerate(["CWTX", "CWWW", "CFWW", "WWWW", "CTCT", "CCCC", "TTCW", "CWFW"])}


class Patch:
    """pytest's monkeypatch.setattr, outside pytest."""

    def setattr(self, obj, name, value):
        setattr(obj, name, value)


def main(out_dir: str, result: str, patch=None) -> None:
    """`patch`: pytest's monkeypatch when the one-process case runs inside the test process."""
    trainer = make_trainer(
        tiny_random_model(),
        Path(out_dir),
        patch or Patch(),
        "S2",
        SCRIPT,
        groups_per_step=4,
        problems_per_round=2,
        max_sampling_rounds=4,
        per_device_train_batch_size=4,
    )
    out = generate(trainer)
    acc = trainer.accelerator
    advantages = acc.gather(out["advantages"]).tolist()
    active = acc.gather(out["tool_mask"].amax(dim=1)).tolist()
    if acc.is_main_process:
        record = {
            k: getattr(trainer.step_record, k) for k in ("groups", "task_ids_trained", "outcomes_sampled")
        }
        record.update(
            processes=acc.num_processes,
            advantages=advantages,
            active=active,
            num_items_in_batch=int(out["num_items_in_batch"]),
        )
        Path(result).write_text(json.dumps(record))
    # Leave together: a process exiting while the other still holds the gloo group can abort it at exit.
    acc.wait_for_everyone()
    acc.end_training()


if __name__ == "__main__":
    main(*sys.argv[1:])
