"""`trainer.train.main` under `accelerate launch`, then what is still alive as the process would begin to exit,
written per rank as JSON (tests/test_distributed.py). Usage: exit_probe.py RESULT_PREFIX TRAIN_ARGS..."""

import gc
import json
import os
import sys

from trainer.train import main


def alive() -> list[str]:
    """Objects of a multi-process run that hold gloo's process group (and its worker threads)."""
    return [type(o).__name__ for o in gc.get_objects() if type(o).__name__ == "DistributedDataParallel"]


if __name__ == "__main__":
    prefix, argv = sys.argv[1], sys.argv[2:]
    main(argv)
    with open(f"{prefix}{os.environ['RANK']}.json", "w") as f:
        # the threads are a figure for docs/gpu.md, not asserted: their number depends on the libraries loaded
        json.dump({"alive": alive(), "threads": len(os.listdir("/proc/self/task"))}, f)
