"""`python -m trainer.train ARGS` with every write under --output_dir recorded, per process.

    PYTHONPATH=REPO accelerate launch ... tests/multinode_audit.py AUDIT_DIR ARGS...

Used by tests/test_multinode.py. A Python audit hook (sys.addaudithook) sees each open for writing, mkdir,
rename, remove and rmtree made from Python in this process; each one under output_dir is appended to
AUDIT_DIR/rank<global rank>.jsonl as {"event", "path"} (relative to output_dir). Writes from native code
(safetensors' writer) are not seen, but they land in a temp directory whose mkdir and rename are.
"""

import json
import os
import sys
from pathlib import Path

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
EVENTS = {"os.mkdir": 1, "os.rename": 2, "os.remove": 1, "os.rmdir": 1, "shutil.rmtree": 1, "os.link": 2}


def _writes(event: str, args: tuple) -> list:
    if event == "open":
        path, mode, flags = args
        writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & WRITE_FLAGS)
        return [path] if writing and isinstance(path, str | bytes | os.PathLike) else []
    return list(args[: EVENTS.get(event, 0)])


def install(audit_dir: Path, output_dir: Path) -> None:
    root = os.path.realpath(output_dir)
    rank = os.environ.get("RANK", "0")
    fd = os.open(audit_dir / f"rank{rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def hook(event, args):
        for path in _writes(event, args):
            if isinstance(path, int):
                continue
            full = os.path.realpath(os.fsdecode(path))
            if full == root or full.startswith(root + os.sep):
                rel = os.path.relpath(full, root)
                os.write(
                    fd, (json.dumps({"event": event, "path": rel}) + "\n").encode()
                )  # os.write: unaudited

    sys.addaudithook(hook)


def main() -> None:
    audit_dir, argv = Path(sys.argv[1]), sys.argv[2:]
    install(audit_dir, Path(argv[argv.index("--output_dir") + 1]))
    from trainer.train import main as train_main

    train_main(argv)


if __name__ == "__main__":
    main()
