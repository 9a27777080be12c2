"""`trainer.train.main` under `accelerate launch`, then what is still alive as the process would begin to exit,
written per rank as JSON (tests/test_distributed.py). Usage: exit_probe.py RESULT_PREFIX TRAIN_ARGS..."""

import gc
import json
import os
import sys
import weakref

import torch.distributed as dist

from trainer.train import main

groups: list[weakref.ref] = []  # the default process group, from the moment accelerate creates it
_init = dist.init_process_group


def init_and_watch(*args, **kwargs):
    _init(*args, **kwargs)
    groups.append(weakref.ref(dist.group.WORLD))


def alive() -> list[str]:
    """Objects of a multi-process run that hold gloo's process group (and its worker threads), and the group."""
    ddp = [type(o).__name__ for o in gc.get_objects() if type(o).__name__ == "DistributedDataParallel"]
    return ddp + [type(g()).__name__ for g in groups if g() is not None]


if __name__ == "__main__":
    prefix, argv = sys.argv[1], sys.argv[2:]
    dist.init_process_group = init_and_watch
    main(argv)
    with open(f"{prefix}{os.environ['RANK']}.json", "w") as f:
        # the threads are a figure for docs/gpu.md, not asserted: their number depends on the libraries loaded
        json.dump(
            {"alive": alive(), "watched": len(groups), "threads": len(os.listdir("/proc/self/task"))}, f
        )
