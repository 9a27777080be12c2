"""`stepNNN/` checkpoints' manifest: every file of the weights hashed at save, verified wherever it is read.

```
stepNNN/manifest.json  {"format": "capgrpo.step/1", "files": [{"file", "bytes", "sha256"}, ...]}
```
It lists every file of the checkpoint but its card (`README.md`, regenerated from the run's files whenever a
card is written; and `.gitattributes`, which cards/cleanup.py removes) and is written into the save's temp dir before it is installed, so a stepNNN/ without one
did not come from a complete save. Resume, evaluation, push and pruning call `verify_step` (or
`step_verified`, which hashes each checkpoint once per process). A checkpoint saved before checkpoints were
hashed gets its manifest, once it is known good, with `python -m rundir.step --write-manifest runs/S2/step003`.
"""

import argparse
import hashlib
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from data.atomic import TEMP_FILE, sha256_file, write_atomic
from rundir.state import StateError

MANIFEST = "manifest.json"
FORMAT = "capgrpo.step/1"
UNLISTED = ("README.md", ".gitattributes")  # the card, rewritten by every card writer; the scrub's target
_WORKERS = 4


class StepError(StateError):
    """A stepNNN/ that must not be read; the message names the file and the way on."""


def _unlisted(name: str) -> bool:
    """The card, the manifest, and the temp file of a card write (one killed mid-way leaves it; the card is
    written after the checkpoint is installed, so it is no part of the weights)."""
    m = TEMP_FILE.fullmatch(name)
    return name in (*UNLISTED, MANIFEST) or bool(m and m[1] in UNLISTED)


def _files(step_dir: Path) -> list[Path]:
    return sorted(p for p in step_dir.rglob("*") if p.is_file() and not _unlisted(p.name))


def write_manifest(step_dir: Path) -> Path:
    """Hash every file of `step_dir` (but its card) into manifest.json; the save calls it before installing."""
    step_dir = Path(step_dir)
    files = _files(step_dir)
    with ThreadPoolExecutor(_WORKERS) as pool:
        digests = list(pool.map(sha256_file, files))
    entries = [{"file": p.relative_to(step_dir).as_posix(), "bytes": p.stat().st_size, "sha256": d}
               for p, d in zip(files, digests)]  # fmt: skip
    return write_atomic(
        step_dir / MANIFEST, (json.dumps({"format": FORMAT, "files": entries}, indent=1) + "\n").encode()
    )


# hashing an 18 GB checkpoint takes a while: each is hashed once per process, then known by its manifest
_verified: set[tuple[str, str]] = set()


def verify_step(step_dir: Path, *, way_on: str = "") -> None:
    """Every listed file present with its size and sha256, and no other file but the card; StepError naming
    the file (and `way_on`) otherwise. A checkpoint that passes is remembered by `step_verified`."""
    step_dir = Path(step_dir)
    on = f"; {way_on}" if way_on else ""

    def refuse(what: str) -> StepError:
        return StepError(f"{what}: checkpoint {step_dir.name}/ is broken{on}")

    path = step_dir / MANIFEST
    if not step_dir.is_dir():
        raise refuse(f"{step_dir}: missing")
    if not path.is_file():
        raise refuse(
            f"{path}: missing (a save that did not finish, or one from before checkpoints were hashed: "
            "`python -m rundir.step --write-manifest DIR` records a checkpoint known to be good)"
        )
    data = path.read_bytes()
    try:
        manifest = json.loads(data)
        entries = {e["file"]: e for e in manifest["files"]}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
        raise refuse(f"{path}: malformed ({e})") from None
    if manifest.get("format") != FORMAT:
        raise refuse(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    for p in _files(step_dir):
        if p.relative_to(step_dir).as_posix() not in entries:
            raise refuse(f"{p}: not listed in {MANIFEST}")
    for name, e in entries.items():
        p = step_dir / name
        if not p.is_file():
            raise refuse(f"{p}: missing")
        if (size := p.stat().st_size) != e.get("bytes"):
            short = " (truncated)" if isinstance(e.get("bytes"), int) and size < e["bytes"] else ""
            raise refuse(f"{p}: size {size:,} bytes, {MANIFEST} says {e.get('bytes'):,}{short}")
    names = list(entries)
    with ThreadPoolExecutor(_WORKERS) as pool:
        digests = list(pool.map(sha256_file, [step_dir / n for n in names]))
    for name, digest in zip(names, digests):
        if digest != entries[name].get("sha256"):
            raise refuse(f"{step_dir / name}: sha256 mismatch (corrupted)")
    _verified.add((str(step_dir.resolve()), hashlib.sha256(data).hexdigest()))


def _key(step_dir: Path) -> tuple[str, str]:
    return str(Path(step_dir).resolve()), hashlib.sha256((Path(step_dir) / MANIFEST).read_bytes()).hexdigest()


def mark_verified(step_dir: Path) -> None:
    """A checkpoint this process has just written and hashed: not hashed again by `step_verified`."""
    _verified.add(_key(step_dir))


def step_verified(step_dir: Path) -> bool:
    """Whether `step_dir` verifies; sizes are checked every time, the hashes once per process."""
    key = Path(step_dir).resolve()
    try:
        known = _key(key) in _verified
    except OSError:
        return False
    if known:
        try:
            return all((key / e["file"]).stat().st_size == e["bytes"]
                       for e in json.loads((key / MANIFEST).read_text())["files"])  # fmt: skip
        except (OSError, ValueError, KeyError, TypeError):
            return False
    try:
        verify_step(key)
    except StateError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rundir.step", description="Verify stepNNN/ checkpoints.")
    parser.add_argument("dirs", nargs="+", type=Path)
    parser.add_argument(
        "--write-manifest", action="store_true", help="hash a checkpoint that has no manifest"
    )
    args = parser.parse_args(argv)
    try:
        for d in args.dirs:
            if args.write_manifest and not (d / MANIFEST).exists():
                print(write_manifest(d))
            verify_step(d)
            print(f"{d}: verified")
    except (StateError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
