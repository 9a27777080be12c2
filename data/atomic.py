"""One way to write a file that readers never see half-written: temp file, fsync, os.replace.

The temp file is `.NAME.tmp-<pid>-<random>` beside NAME, so that a writer killed mid-way leaves a file whose
owner can be told dead (trainer/state_shard.py `remove_interrupted_saves` removes it)."""

import os
import re
import tempfile
from pathlib import Path

TEMP_FILE = re.compile(r"\.(.+)\.tmp-(\d+)-[^.]+")  # group 1: the file it was for, group 2: the writer's pid


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes files private; run files are shared data
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
