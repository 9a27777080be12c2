"""Published rows, compressed: one `rows.tar.xz` per published folder (a launch, or an experiment's launches
merged) holds every `.jsonl` and `.log` file, every run.json and every run card (README.md beside a run.json)
under it, byte for byte, and the readers of rundir/ read them from there, or from an archive further up, as if
they were on disk.

A published experiment (docs/experiment-*/<launch>/) is run directories whose rows repeat across runs (the same
base evaluation in every seed, the same prompts): compressed together they take 1.3 MB where the plain files
took 50 MB, 3.8 MB compressed run by run and 7.3 MB file by file with gzip. xz and tar are Python's own
(lzma, tarfile): nothing to install, and `tar -xJf rows.tar.xz` gives back the files as the runs wrote them.

    python -m rundir.archive pack docs/experiment-real/launch7     # the .jsonl/.log files and run.json -> rows.tar.xz
    python -m rundir.archive unpack docs/experiment-real/launch7 DEST   # a plain copy of the folder in DEST
    python -m rundir.archive merge docs/experiment-real    # its launches' archives into one (shared rows once)

`pack` reads the archive back and compares every member with its file before it deletes a single one; a folder
that already has an archive is refused (unpack, then pack again). A path that exists both on disk and in an
archive is refused by the readers, by name: one of the two would otherwise be silently ignored.
"""

import argparse
import fnmatch
import glob as pyglob
import io
import lzma
import shutil
import sys
import tarfile
import tempfile
from functools import lru_cache
from pathlib import Path, PurePosixPath

from rundir.errors import RunFileError

ARCHIVE = "rows.tar.xz"
PACKED = (".jsonl", ".log")
PACKED_NAMES = ("run.json",)  # 86 published run.json files: 1.5 MB plain, 13 KB packed
CARD = "README.md"  # a run's card (cards/), packed where a run.json sits beside it: 53 cards, 255 KB plain


def packed(path: Path) -> bool:
    """Whether `pack` puts this file in the archive: rows, logs, run.json and run cards (not a folder's README)."""
    if path.suffix in PACKED or path.name in PACKED_NAMES:
        return True
    return path.name == CARD and (path.parent / "run.json").is_file()


class ArchiveError(RunFileError):
    """An archive we cannot read, or a path it and the disk disagree on; the message names it. A RunFileError
    (and so a ValueError): whatever refuses a damaged run file refuses a damaged archive the same way."""


def _members(archive: Path) -> dict[str, bytes]:
    stat = archive.stat()
    return _read(archive.resolve(), stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=4)  # keyed by mtime and size too: a re-packed archive is read again
def _read(archive: Path, _mtime: int, _size: int) -> dict[str, bytes]:
    members = {}
    try:
        with tarfile.open(archive, "r:xz") as tar:
            for info in tar:
                name = PurePosixPath(info.name)
                if not info.isfile() or name.is_absolute() or ".." in name.parts:
                    raise ArchiveError(f"{archive}: member {info.name!r} is not a plain relative file")
                members[str(name)] = tar.extractfile(info).read()
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError) as e:  # OSError: e.g. an unreadable file
        raise ArchiveError(f"{archive}: not a readable tar.xz ({e})") from None
    return members


@lru_cache(maxsize=64)  # names only, so every published archive fits
def _names(archive: Path, mtime: int, size: int) -> tuple[str, ...]:
    return tuple(_read(archive, mtime, size))


def _containing(path: Path) -> tuple[Path, str] | None:
    """(archive, member name) of the nearest archive above `path` that holds it, else None."""
    path = Path(path).absolute()
    for folder in path.parents:
        archive = folder / ARCHIVE
        if archive.is_file():
            name = path.relative_to(folder).as_posix()
            if name in _members(archive):
                return archive, name
    return None


def read_bytes(path: Path | str) -> bytes:
    """A file's bytes from the disk or, where it was packed, from its archive."""
    path = Path(path)
    found = _containing(path)
    if path.is_file():
        if found:
            raise ArchiveError(f"{path}: on disk and in {found[0]}; remove one of the two")
        return path.read_bytes()
    if found is None:
        raise FileNotFoundError(f"{path}: no such file (on disk or in a {ARCHIVE} above it)")
    return _members(found[0])[found[1]]


def exists(path: Path | str) -> bool:
    return Path(path).is_file() or _containing(Path(path)) is not None


def _above(folder: Path) -> list[tuple[Path, str]]:
    """(archive, the folder's prefix in it) for each archive in a folder above `folder`: one archive may hold an
    experiment's every launch, so that the rows they share (the base's, step 0's) are stored once."""
    here = Path(folder).absolute()
    return [
        (p / ARCHIVE, here.relative_to(p).as_posix() + "/") for p in here.parents if (p / ARCHIVE).is_file()
    ]


def folders(root: Path | str) -> set[Path]:
    """Every folder under `root` that holds a file, on disk or in an archive under or above it (a published run
    folder whose files are all packed exists only in its archive)."""
    root = Path(root)
    found = {p.parent for p in root.rglob("*") if p.is_file()}
    inside = [(archive, archive.parent, "") for archive in root.rglob(ARCHIVE)]
    for archive, base, prefix in inside + [(a, root, prefix) for a, prefix in _above(root)]:
        stat = archive.stat()
        for name in _names(archive.resolve(), stat.st_mtime_ns, stat.st_size):
            if name.startswith(prefix):
                rest = PurePosixPath(name[len(prefix) :])
                found |= {base / parent for parent in rest.parents if str(parent) != "."}
    return found


def glob(pattern: str) -> list[Path]:
    """Paths matching a shell pattern, on disk or as folders inside archives (a run folder whose files are all
    packed exists only there), sorted; `*` stays within one path segment, as the shell's."""
    parts = Path(pattern).parts
    fixed = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), len(parts))
    root = Path(*parts[:fixed]) if fixed else Path(".")
    on_disk = {Path(p) for p in pyglob.glob(pattern)}
    while not root.is_dir():  # a folder that exists only in an archive: its archive is further up
        if len(root.parts) <= 1:
            return sorted(on_disk)
        root = root.parent
    candidates = (f for f in folders(root) if len(f.parts) == len(parts))
    return sorted(
        on_disk | {f for f in candidates if fnmatch.fnmatchcase(f.as_posix(), Path(pattern).as_posix())}
    )


def listing(folder: Path | str, pattern: str) -> list[Path]:
    """The files of `folder` (not below it) matching `pattern`, on disk and in archives above it, sorted."""
    folder = Path(folder)
    found = {p.name: p for p in folder.glob(pattern) if p.is_file()}
    here = folder.absolute()
    for parent in [here, *here.parents]:
        archive = parent / ARCHIVE
        if not archive.is_file():
            continue
        prefix = here.relative_to(parent).as_posix()
        for name in _members(archive):
            member = PurePosixPath(name)
            if member.parent.as_posix() == prefix and member.match(pattern):
                if member.name in found:
                    raise ArchiveError(
                        f"{folder / member.name}: on disk and in {archive}; remove one of the two"
                    )
                found[member.name] = folder / member.name
    return [found[n] for n in sorted(found)]


def pack(folder: Path) -> Path:
    """Every .jsonl and .log file, run.json and run card under `folder` into folder/rows.tar.xz (same bytes; deterministic: sorted,
    no times or owners), checked by reading it back, then the plain files removed."""
    folder = Path(folder)
    archive = folder / ARCHIVE
    if archive.exists():
        raise ArchiveError(f"{archive}: exists; unpack it and pack the folder again")
    files = sorted(p for p in folder.rglob("*") if p.is_file() and packed(p))
    if not files:
        raise ArchiveError(f"{folder}: no {', '.join(PACKED + PACKED_NAMES)} files to pack")
    root = folder.resolve()
    for path in files:  # published rows are the runs' own bytes: never a file from elsewhere through a link
        if path.is_symlink() and not (target := path.resolve()).is_relative_to(root):
            raise ArchiveError(f"{path}: a symlink to {target}, outside {folder}; nothing packed")
    tmp = archive.with_name(ARCHIVE + ".tmp")
    with tarfile.open(tmp, "w:xz", preset=9 | lzma.PRESET_EXTREME, format=tarfile.PAX_FORMAT) as tar:
        for path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(path.relative_to(folder).as_posix())
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    back = _read(tmp.resolve(), tmp.stat().st_mtime_ns, tmp.stat().st_size)
    for path in files:
        if back.get(path.relative_to(folder).as_posix()) != path.read_bytes():
            tmp.unlink()
            raise ArchiveError(f"{path}: read back from {tmp} with other bytes; nothing removed")
    tmp.replace(archive)
    for path in files:
        path.unlink()
    return archive


def unpack(folder: Path, dest: Path) -> Path:
    """A plain copy of `folder` in `dest` (which must not exist): its files, and its members in every archive
    under or above it."""
    folder, dest = Path(folder), Path(dest)
    if dest.exists():
        raise ArchiveError(f"{dest}: exists; unpack into a new folder")
    shutil.copytree(folder, dest, ignore=shutil.ignore_patterns(ARCHIVE))
    inside = [(a, a.parent.relative_to(folder).as_posix() + "/", "") for a in folder.rglob(ARCHIVE)]
    for archive, into, prefix in inside + [(a, "", prefix) for a, prefix in _above(folder)]:
        for name, data in _members(archive).items():
            if not name.startswith(prefix):
                continue
            rel = PurePosixPath(into.removeprefix("./"), name[len(prefix) :])
            if (dest / rel).exists():
                raise ArchiveError(f"{folder / rel}: on disk and in {archive}; remove one of the two")
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
    return dest


def merge(folder: Path) -> Path:
    """The archives under `folder` and its packed plain files into one folder/rows.tar.xz: files that several
    launches share (the base's rows, step 0's) are then stored once. Every member is checked against what the
    readers gave before, and the new archive is in place before anything it replaces is removed."""
    folder = Path(folder)
    own = folder / ARCHIVE
    inner = [a for a in folder.rglob(ARCHIVE) if a != own]
    plain = [p for p in folder.rglob("*") if p.is_file() and packed(p)]
    if not inner and not plain:
        raise ArchiveError(f"{folder}: no archive below it and no plain rows to merge")
    archives = inner + ([own] if own.is_file() else [])
    before = {(a.parent / n).relative_to(folder).as_posix() for a in archives for n in _members(a)}
    before |= {p.relative_to(folder).as_posix() for p in plain}
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        merged = pack(unpack(folder, Path(tmp) / "copy"))
        if missing := sorted(before - set(_members(merged))):
            raise ArchiveError(f"{folder / missing[0]}: not in the merged archive; nothing changed")
        for name, data in _members(merged).items():
            if read_bytes(folder / name) != data:
                raise ArchiveError(f"{folder / name}: merged with other bytes; nothing changed")
        merged.replace(own)
    for path in inner + plain:
        path.unlink()
    return own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rundir.archive", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    sub.add_parser(
        "pack", help="FOLDER's .jsonl, .log and run.json files into FOLDER/rows.tar.xz"
    ).add_argument("folder", type=Path)
    u = sub.add_parser("unpack", help="a plain copy of FOLDER, its archive unpacked, in DEST")
    u.add_argument("folder", type=Path)
    u.add_argument("dest", type=Path)
    sub.add_parser(
        "merge", help="the archives under FOLDER and its plain rows into FOLDER/rows.tar.xz"
    ).add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.verb in ("pack", "merge"):
            archive = (pack if args.verb == "pack" else merge)(args.folder)
            print(f"{archive}: {len(_members(archive))} files, {archive.stat().st_size} bytes")
        else:
            print(unpack(args.folder, args.dest))
    except (ArchiveError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
