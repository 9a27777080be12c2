"""One writer per run directory: an exclusive `flock` on `<run_dir>/.lock`, held for the life of the run.

The lock is taken before anything else is written (a fresh run's empty-directory check and run.json's write
happen under it), and refused in one line naming the holder's pid. A lock file left by a process that died
(SIGKILL, a lost node) holds no lock, since the kernel drops a flock with its holder: the next run takes it
over and says whose it was. On release the file is removed (and the directory, if the lock made it and it is
still empty), so a refused launch leaves the run directory as it found it.

Several processes: only the global main process (rank 0) takes the lock and writes the run directory, so
every other process, on whichever node, must read and resume from that same directory. `require_shared`
checks it, each process reading the lock file rank 0 holds: a node with a disk of its own sees none (or
another run's) and the launch is refused in one line. Writing a copy per node (`save_on_each_node`) is not
supported (docs/gpu.md).
"""

import fcntl
import logging
import os
import secrets
import socket
import time
from pathlib import Path

LOCK_FILE = ".lock"
logger = logging.getLogger(__name__)


class RunLockedError(Exception):
    """Another live process holds the run directory; the message names its pid and the way on."""


class RunDirNotSharedError(RunLockedError):
    """A process of a multi-process launch does not see the run directory the main process holds."""


class RunLock:
    """`with RunLock(run_dir):` ... the run's writes ...; `RunLockedError` when another process holds it."""

    def __init__(self, run_dir: Path | str):
        self.dir = Path(run_dir)
        self.path = self.dir / LOCK_FILE
        self._fd: int | None = None
        self._made_dir = False
        # in the file after the pid: what tells this holder from any other, on any host
        self.token = f"{socket.gethostname()}:{secrets.token_hex(8)}"

    def acquire(self) -> "RunLock":
        if self.dir.exists() and not self.dir.is_dir():
            raise RunLockedError(f"output_dir {self.dir}: exists and is not a directory")
        self._made_dir = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError:  # a read-only or full disk: the caller names the path; leave no directory behind
                self._remove_made_dir()
                raise
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder_pid(fd)
                os.close(fd)
                self._remove_made_dir()
                raise RunLockedError(
                    f"{self.dir} is in use by another process (pid {holder or '?'}, holding {self.path}): "
                    "wait for it to finish or stop it, then resume"
                ) from None
            # A holder that released (and removed the file) between our open and flock: lock the new file.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        # nothing but our lock file inside: this launch's directory to clean up, whoever made it (of two launches
        # racing on a new directory, the one that made it may lose the lock, and then cannot remove it)
        self._made_dir = self._made_dir or all(p.name == LOCK_FILE for p in self.dir.iterdir())
        if (previous := _read_pid(fd)) and previous != os.getpid():
            logger.warning(
                "%s: taking over the lock left by pid %d, which is no longer running", self.dir, previous
            )
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {self.token}\n".encode(), 0)
        os.fsync(fd)  # other nodes read it (require_shared)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)  # before unlocking: a waiter that opened it re-checks the inode
        os.close(self._fd)
        self._fd = None
        self._remove_made_dir()

    def _remove_made_dir(self) -> None:
        if self._made_dir:
            try:
                self.dir.rmdir()  # only if empty: a refused fresh run leaves no directory behind
            except OSError:
                pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc_info) -> None:
        self.release()


def _holder_pid(fd: int, wait_s: float = 1.0) -> int | None:
    """The holder's pid, waiting a moment for it: a holder writes it right after its flock, so a refusal read in
    between finds no pid ("pid ?") or, where the holder took over a dead run's lock, the dead pid still in the
    file. A pid of this host that no longer runs is that stale line: read again until the live holder's is
    there (another host's pids cannot be checked from here, and are taken as read)."""
    deadline = time.monotonic() + wait_s
    while True:
        pid, host = _read_holder(fd)
        live = pid is not None and (host not in (None, socket.gethostname()) or _running(pid))
        if live or time.monotonic() >= deadline:
            return pid if live else None
        time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing sent, only whether the pid exists
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _read_holder(fd: int) -> tuple[int | None, str | None]:
    """(pid, host) of the line `pid host:token`; (None, None) where it is empty or unreadable."""
    try:
        fields = os.pread(fd, 128, 0).decode().split()
        return int(fields[0]) or None, fields[1].rpartition(":")[0] if len(fields) > 1 else None
    except (OSError, ValueError, IndexError):
        return None, None


def _read_pid(fd: int) -> int | None:
    return _read_holder(fd)[0]


def require_shared(run_dir: Path | str) -> None:
    """Collective, after rank 0 took the lock: every process reads `run_dir/.lock` and all must read rank
    0's holder line; `RunDirNotSharedError` on every process otherwise (so none waits on the others)."""
    from accelerate import PartialState
    from accelerate.utils import gather_object

    path = Path(run_dir) / LOCK_FILE
    PartialState().wait_for_everyone()  # rank 0 holds the lock by now
    try:
        seen = path.read_text().strip() or None
    except OSError:
        seen = None
    held = gather_object([(socket.gethostname(), seen)])  # in process order
    main = held[0][1]
    blind = [f"process {i} on {host}" for i, (host, line) in enumerate(held) if line != main or not main]
    if blind:
        raise RunDirNotSharedError(
            f"output_dir {run_dir}: {', '.join(blind)} does not see the lock file process 0 holds there "
            f"({path}): every node must write one output_dir on a filesystem they all share "
            "(save_on_each_node is not supported; docs/gpu.md)"
        )
