"""One way to write a file that readers never see half-written: temp file, fsync, os.replace; and the one
disk-full message of a run.

The temp file is `.NAME.tmp-<pid>-<random>` beside NAME, so that a writer killed mid-way leaves a file whose
owner can be told dead (rundir/state.py `remove_interrupted_saves` removes it). A write that does not fit
raises `DiskFullError` naming the path, the bytes needed and the bytes free, after removing its temp file."""

import errno
import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

TEMP_FILE = re.compile(r"\.(.+)\.tmp-(\d+)-[^.]+")  # group 1: the file it was for, group 2: the writer's pid
FILE_MODE = 0o644  # every file of a run, weights included: run files are shared data (mkstemp makes 0600)


class DiskFullError(OSError):
    """A write that did not fit; the message names the path, the bytes needed and the bytes free."""

    def __str__(self) -> str:  # a sentence, not "[Errno 28] ..."
        return self.strerror


def disk_full(target: Path, needed: int) -> DiskFullError:
    target = Path(target)
    free = shutil.disk_usage(target.parent if target.parent.exists() else Path.cwd()).free
    return DiskFullError(
        errno.ENOSPC,
        f"{target}: not saved, the disk is full: it needs {needed:,} bytes and {free:,} are free in "
        f"{target.parent} (free some space, then resume)",
    )


def is_disk_full(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)


# what the OS answers a write it refuses: a read-only mount, no permission, a full disk or quota
REFUSED_WRITE = (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EDQUOT)


def refused_write(e: BaseException) -> str | None:
    """The one line a command ends with when the disk refused it (read-only, no permission, full), naming the
    path the OS named; None for any other error, whose traceback stays (it is a bug to fix, not a refusal)."""
    if not isinstance(e, OSError) or e.errno not in REFUSED_WRITE:
        return None
    if isinstance(e, DiskFullError):
        return str(e)
    if is_disk_full(e):  # a write to an open file names none
        return f"{e.filename or 'a file'}: not written, the disk is full (free some space, then run it again)"
    if e.filename is None:  # EPERM/EACCES with no path (a signal, a device): not the disk, keep the traceback
        return None
    return f"{e.filename}: {e.strerror}"


def sha256_file(path: str | os.PathLike) -> str:
    """A file's sha256, read in 16 MiB blocks (weights and state shards do not fit memory twice)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 * 2**20):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.tmp-{os.getpid()}-")
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path, len(data)) from None
        # name the file, not its temp (the same OSError subclass: the constructor picks it by errno)
        if e.filename and Path(e.filename).name.startswith(f".{path.name}.tmp-"):
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        full = disk_full(path, len(data)) if is_disk_full(e) else None  # free space before the temp goes
        Path(tmp).unlink(missing_ok=True)
        if full:
            raise full from None
        raise
    return path


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append one line and fsync it: a crash leaves at most this line torn (without its newline)."""
    path, data = Path(path), (line + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if is_disk_full(e):
            raise disk_full(path, len(data)) from None
        raise
