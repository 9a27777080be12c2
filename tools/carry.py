"""Large files to the GPU machine: split here into per-call folders that fit beside the tree, joined and
sha256-checked there before anything uses them.

A call to the GPU machine carries at most 64 MiB: the working tree (tracked and untracked-not-ignored files)
plus the paths named in `carry`, and the machine keeps /tmp only about 30 s between calls. So a file (a GGUF,
a wheel set) travels in back-to-back calls, each carrying one folder `.carry/<name>/callNN/` of parts:

    python tools/carry.py split FILE [FILE ...] --name qwen05       # here: .carry/qwen05/call01 ... callNN
    # call k of N on the GPU machine (carry: [".carry/qwen05/callKK"]), back to back:
    python3 tools/carry.py receive .carry/qwen05/callKK             # copies the parts to /tmp/carry/qwen05
    # the last call, before the work that needs the files:
    python3 tools/carry.py join qwen05 --out /tmp/qwen05            # joins, checks every sha256, or exits 1

The per-call budget is computed from the tree's size at split time (64 MiB less the tree, less a margin), every
file counted as its 4 KiB disk blocks, the count that explains the device tool's refusals (`on_disk`).
The tree grows after that (each lease commits rows), so before a lease `fits` checks every call folder against
today's tree and exits 1 naming the first that no longer fits (then split again):

    python tools/carry.py fits qwen05 [--with PATH]                 # here, before the machine starts

Every call folder holds the manifest (names, sizes, sha256 of each file and each part), so `join` needs no
state but /tmp/carry/<name>/ and refuses, with one line naming the part or file, anything missing or altered.
Standard library only: it runs on the GPU machine's bare Python.
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

CALL_LIMIT = 64 * 2**20  # what one call carries, the tree included
MARGIN = 2 * 2**20  # for files written between split and the call (logs, a lock)
MANIFEST = "manifest.json"
# Lease 8's parts were refused with 356,072 bytes to spare by the files' bytes and lease 7's travelled with 1.37 MB:
# by 4 KiB blocks the tree of 503 files is 1.13 MB larger, which explains both.
BLOCK = 4096
LANDING = Path("/tmp/carry")


class CarryError(RuntimeError):
    """A part or file that is missing, altered or too large; the message names it."""


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def on_disk(path: Path) -> int:
    """A file's size counted as whole 4 KiB blocks, the count that explains the device tool's refusals (BLOCK)."""
    return -(-path.stat().st_size // BLOCK) * BLOCK


def tree_bytes(repo: Path) -> int:
    """Bytes of what a call sends besides `carry` (`on_disk`): tracked and untracked-not-ignored files, and shared/."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    total = sum(on_disk(repo / n.decode()) for n in names if n and (repo / n.decode()).is_file())
    shared = repo / "shared"
    if shared.is_dir():
        total += sum(on_disk(p) for p in shared.rglob("*") if p.is_file())
    return total


def split(files: list[Path], name: str, repo: Path, budget: int | None = None) -> list[Path]:
    """Cut `files` into parts of at most `budget` bytes, one call folder each, under repo/.carry/name/."""
    if budget is None and (budget := CALL_LIMIT - tree_bytes(repo) - MARGIN) < 2**20:
        raise CarryError(
            f"{repo}: the tree leaves {budget} bytes a call (under 1 MiB): carry less or shrink it"
        )
    if len({p.name for p in files}) != len(files):
        raise CarryError(f"{name}: two files with the same name; carry them under different names")
    out = repo / ".carry" / name
    if out.exists():
        raise CarryError(f"{out}: exists; remove it to split again")
    # parts in file order, packed greedily into calls: (call, part name, file, offset, length)
    plan, call, used = [], 1, 0
    for path in files:
        size, offset, k = path.stat().st_size, 0, 0
        while offset < size or (size == 0 and k == 0):
            length = min(budget - used, size - offset)
            if length <= 0 and used:
                call, used = call + 1, 0
                continue
            plan.append((call, f"{path.name}.part{k:03d}", path, offset, length))
            offset, used, k = offset + length, used + length, k + 1
            if size == 0:
                break
    manifest = {"name": name, "budget": budget, "files": [], "calls": []}
    for path in files:
        manifest["files"].append(
            {"name": path.name, "bytes": path.stat().st_size, "sha256": sha256(path), "parts": []}
        )
    entries = {e["name"]: e for e in manifest["files"]}
    for call_no, part, path, offset, length in plan:
        folder = out / f"call{call_no:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as f:
            f.seek(offset)
            chunk = f.read(length)
        (folder / part).write_bytes(chunk)
        entries[path.name]["parts"].append({"part": part, "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest["calls"] = [[p for c, p, *_ in plan if c == i] for i in range(1, call + 1)]
    folders = [out / f"call{i:02d}" for i in range(1, call + 1)]
    for folder in folders:
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    _ignore(repo)
    return folders


def fits(name: str, repo: Path, beside: tuple[Path, ...] = ()) -> int:
    """The smallest room (bytes) any call folder of .carry/<name>/ leaves beside today's tree and the paths `beside`
    (carried in the same calls); CarryError naming the first folder over the call limit (a lease's commits grow the
    tree after the split; lease 7's start call, carrying the compile caches beside a full part, was refused)."""
    folders = sorted((repo / ".carry" / name).glob("call[0-9][0-9]"))
    if not folders:
        raise CarryError(f"{repo / '.carry' / name}: no call folders (split first)")
    extra = sum(on_disk(f) for p in beside for f in ([p] if p.is_file() else p.rglob("*")) if f.is_file())
    tree, room = tree_bytes(repo), []
    for folder in folders:
        size = sum(on_disk(p) for p in folder.iterdir() if p.is_file())
        if (left := CALL_LIMIT - tree - extra - size) < 0:
            with_ = f" and {extra} of {', '.join(map(str, beside))}" if beside else ""
            raise CarryError(f"{folder}: {size} bytes beside the tree's {tree}{with_} are {-left} over a call's "
                             f"{CALL_LIMIT}: split again")  # fmt: skip
        room.append(left)
    return min(room)


def _ignore(repo: Path) -> None:
    """.carry/ must not travel as part of the tree (it is carried folder by folder)."""
    exclude = repo / ".git" / "info" / "exclude"
    if not (repo / ".git").is_dir():  # a worktree's .git is a file: its ignores live elsewhere
        return
    exclude.parent.mkdir(exist_ok=True)
    if "/.carry/" not in (exclude.read_text().split() if exclude.is_file() else []):
        with open(exclude, "a") as f:
            f.write("/.carry/\n")


def receive(folder: Path, landing: Path = LANDING) -> Path:
    """Copy one call folder's parts (checked) and its manifest to landing/<name>/."""
    manifest = json.loads((folder / MANIFEST).read_text())
    want = {p["part"]: p["sha256"] for f in manifest["files"] for p in f["parts"]}
    dest = landing / manifest["name"]
    dest.mkdir(parents=True, exist_ok=True)
    for part in sorted(p.name for p in folder.iterdir() if p.name != MANIFEST):
        if part not in want:
            raise CarryError(f"{folder / part}: not a part of {manifest['name']}'s manifest")
        if (got := sha256(folder / part)) != want[part]:
            raise CarryError(f"{folder / part}: sha256 {got}, manifest says {want[part]}")
        shutil.copyfile(folder / part, dest / part)
    shutil.copyfile(folder / MANIFEST, dest / MANIFEST)
    return dest


def join(name: str, out: Path, landing: Path = LANDING) -> list[Path]:
    """Join landing/<name>/'s parts into out/, checking every file's sha256; the parts are removed after."""
    src = landing / name
    if not (src / MANIFEST).is_file():
        raise CarryError(
            f"{src / MANIFEST}: missing (no call folder of {name} was received, or /tmp was cleared)"
        )
    manifest = json.loads((src / MANIFEST).read_text())
    missing = [p["part"] for f in manifest["files"] for p in f["parts"] if not (src / p["part"]).is_file()]
    if missing:
        calls = sorted({i for i, c in enumerate(manifest["calls"], 1) for p in missing if p in c})
        raise CarryError(
            f"{src}: {len(missing)} part(s) missing, e.g. {missing[0]} (calls {calls}): "
            "carry them again, back to back"
        )
    out.mkdir(parents=True, exist_ok=True)
    joined = []
    for f in manifest["files"]:
        target = out / f["name"]
        if target.is_file() and target.stat().st_size == f["bytes"] and sha256(target) == f["sha256"]:
            joined.append(target)
            continue
        tmp = target.with_name(target.name + ".joining")
        with open(tmp, "wb") as w:
            for p in f["parts"]:
                with open(src / p["part"], "rb") as r:
                    shutil.copyfileobj(r, w, 1 << 24)
        if (got := sha256(tmp)) != f["sha256"]:
            tmp.unlink()
            raise CarryError(f"{target}: joined sha256 {got}, manifest says {f['sha256']}")
        tmp.replace(target)
        joined.append(target)
    for f in manifest["files"]:
        for p in f["parts"]:
            (src / p["part"]).unlink()
    return joined


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/carry.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    s = sub.add_parser("split", help="here: cut files into per-call folders under .carry/NAME/")
    s.add_argument("files", nargs="+", type=Path)
    s.add_argument("--name", required=True)
    s.add_argument("--budget", type=int, help="bytes a call (default: 64 MiB less the tree and a margin)")
    r = sub.add_parser("receive", help="GPU machine: copy one call folder's parts to /tmp/carry/NAME/")
    r.add_argument("folder", type=Path)
    f = sub.add_parser(
        "fits", help="here: whether every call folder of .carry/NAME/ still fits beside the tree"
    )
    f.add_argument("name")
    f.add_argument("--with", dest="beside", type=Path, action="append", default=[],
                   help="a path carried in the same calls (e.g. .carry/caches)")  # fmt: skip
    j = sub.add_parser("join", help="GPU machine: join /tmp/carry/NAME/ into OUT, sha256-checked")
    j.add_argument("name")
    j.add_argument("--out", type=Path, required=True)
    for p in (r, j):
        p.add_argument("--landing", type=Path, default=LANDING)
    args = parser.parse_args(argv)
    repo = Path(__file__).resolve().parent.parent  # split and fits measure this checkout's tree
    try:
        if args.verb == "split":
            folders = split(args.files, args.name, repo, args.budget)
            manifest = json.loads((folders[0] / MANIFEST).read_text())
            print(f"{sum(f['bytes'] for f in manifest['files'])} bytes in {len(folders)} call(s) of at most "
                  f"{manifest['budget']} bytes (tree {tree_bytes(repo)} bytes): "
                  + ", ".join(str(f.relative_to(repo)) for f in folders))  # fmt: skip
        elif args.verb == "fits":
            room = fits(args.name, repo, tuple(repo / p for p in args.beside))
            print(f".carry/{args.name}: every call fits, {room} bytes to spare in the fullest")
        elif args.verb == "receive":
            dest = receive(args.folder, args.landing)
            print(f"{args.folder} -> {dest}")
        else:
            for path in join(args.name, args.out, args.landing):
                print(f"{path}: sha256 ok")
    except (CarryError, OSError) as e:
        print(f"carry: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
