"""A read-only filesystem below one folder, for tests that may run as root (a chmod 0o555 folder stops nobody
there) and need no mount rights: every call that would write below the folder raises OSError(EROFS) naming the
path, as the kernel does on a read-only mount. Reading is untouched."""

import builtins
import errno
import io
import os

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
GUARDED = ("replace", "rename", "unlink", "remove", "rmdir", "symlink", "link", "chmod", "truncate", "utime")


def read_only(monkeypatch, root, errno_: int = errno.EROFS) -> None:
    """Below `root` (itself included) nothing can be created, changed or removed: OSError(errno_)."""
    root = os.path.realpath(root)
    real_open, real_os_open, real_mkdir = builtins.open, os.open, os.mkdir

    def below(path) -> bool:
        if not isinstance(path, str | bytes | os.PathLike):  # a file descriptor
            return False
        p = os.path.realpath(os.fsdecode(path))
        return p == root or p.startswith(root + os.sep)

    def refuse(path):
        raise OSError(errno_, os.strerror(errno_), os.fsdecode(path))

    def os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & WRITE_FLAGS and below(path):
            refuse(path)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    def open_(file, mode="r", *args, **kwargs):
        if set(mode) & set("wax+") and below(file):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def mkdir(path, mode=0o777, *, dir_fd=None):
        if below(
            path
        ):  # the kernel's order: an existing name, then a missing parent, then the read-only disk
            if os.path.lexists(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), os.fsdecode(path))
            if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(path))
            refuse(path)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    def guard(real):
        def call(*args, **kwargs):
            for path in args[:2]:
                if below(path):
                    refuse(path)
            return real(*args, **kwargs)

        return call

    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", open_)
    monkeypatch.setattr(io, "open", open_)
    monkeypatch.setattr(os, "mkdir", mkdir)
    for name in GUARDED:
        monkeypatch.setattr(os, name, guard(getattr(os, name)))


def tree(root) -> dict:
    """Every path below `root` and its bytes (None for a folder): what "nothing written" compares."""
    out = {}
    for parent, dirs, files in os.walk(root):
        for d in dirs:
            out[os.path.join(parent, d)] = None
        for f in files:
            with open(os.path.join(parent, f), "rb") as fh:
                out[os.path.join(parent, f)] = fh.read()
    return out
