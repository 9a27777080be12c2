"""What comes back from a launch: `pack` writes what the repository keeps of the work folder (run.json, steps.jsonl,
eval rows, cards, the runs' and GPUs' logs, base report; never weights, optimizer state or snapshots) into
<out>/<plan name>.tar.xz, `unpack` writes it into a new docs folder; and the compile caches carried from one lease
to the next with their key (`pack --with-caches`, `train --caches`)."""

import io
import json
import re
import tarfile
from pathlib import Path

from launch.plan import LaunchError, Plan
from rundir import archive as rundir_archive

BASE_KEPT = ("base_manifest.json", "tiny_base.json", "base_report.json")


def pack(plan: Plan, work: Path, out: Path) -> Path:
    """What the repository keeps, the runs' and GPUs' logs included: never weights, optimizer state, snapshots or
    converted bases. xz, not gzip: a file from $OUT may be 16 MiB, and a 1.5B lease's rows are ~8 MiB plain a run,
    mostly completions that repeat across runs (the shared step-0 rows): the 4 runs of plan-throughput3.yaml took
    4.5 MB gzipped, 1.1 MB in xz, so a lease of 8 such runs would come near the limit in gzip and not in xz."""
    out.mkdir(parents=True, exist_ok=True)
    archive = out / f"{plan.name}.tar.xz"
    with tarfile.open(archive, "w:xz", preset=6) as tar:
        for path in sorted(work.rglob("*")):
            rel = path.relative_to(work).as_posix()
            if not path.is_file() or out.resolve() in path.resolve().parents or path.suffix == ".safetensors":
                continue
            if re.search(r"/(step|state)\d+/", f"/{rel}"):
                continue  # checkpoints and optimizer state
            if rel.split("/")[0] != "runs" and "/" in rel and Path(rel).name not in BASE_KEPT:
                continue  # a converted or built base: its manifest and report only
            if rel.endswith(".tasks.json") or "tfevents" in rel:
                continue
            # read once: a run still writing (a watch call's pack) cannot cut a member short
            data = path.read_bytes()
            info = tar.gettarinfo(path, arcname=f"{plan.name}/{rel}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return archive


def unpack(plan: Plan, archive: Path, into: Path) -> int:
    """The archive `pack` wrote, into the committed layout <into>/<run>/ with its log beside it; refuses to write
    over anything already there."""
    if into.exists():
        raise LaunchError(f"{into}: exists; unpack into a new folder")
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            rel = Path(member.name).relative_to(plan.name)
            if not member.isfile() or rel.parts[0] != "runs":
                continue
            target = into / Path(*rel.parts[1:])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tar.extractfile(member).read())
    packed = rundir_archive.pack(into)  # published rows are committed compressed (docs/CONTRACTS.md)
    print(f"unpacked {archive} into {into}, rows and logs in {packed}")
    return 0


# the launch's TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and TILELANG_CACHE_DIR (fla's Hopper backward is JIT-compiled
# by TileLang: ~20 s a process that Inductor's and Triton's caches do not hold; docs/PERFORMANCE.md, ninth lease)
CACHES = ("cache/inductor", "cache/triton", "cache/tilelang")


def cache_key() -> dict:
    """What compiled kernels depend on: torch, Triton, TileLang and the GPU (a cache from another is not used)."""
    import importlib.metadata

    import torch

    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    try:  # its metadata, not an import: importing TileLang loads TVM
        tilelang_version = importlib.metadata.version("tilelang")
    except importlib.metadata.PackageNotFoundError:
        tilelang_version = None
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"torch": torch.__version__, "triton": triton_version, "tilelang": tilelang_version, "gpu": gpu,
            "cuda": torch.version.cuda}  # fmt: skip


def pack_caches(work: Path, out: Path) -> Path | None:
    """The launch's compile and autotuning caches with their key, into <out>/compile-caches.tar.gz: the next lease
    starts its runs with them (`train --caches`), compiling nothing that this one compiled."""
    present = [work / c for c in CACHES if (work / c).is_dir()]
    if not present:
        return None
    out.mkdir(parents=True, exist_ok=True)
    archive = out / "compile-caches.tar.gz"
    key = json.dumps(cache_key(), indent=1).encode()
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("key.json")
        info.size = len(key)
        tar.addfile(info, io.BytesIO(key))
        for folder in present:
            tar.add(folder, arcname=folder.relative_to(work).as_posix())
    print(f"packed {archive} ({archive.stat().st_size / 2**20:.1f} MiB)", flush=True)
    return archive


def unpack_caches(archive: Path, work: Path) -> bool:
    """An earlier lease's caches into this launch's cache folders, when built by the same torch, Triton and GPU
    and the folders are still empty; otherwise one line saying why they are not used (the runs compile anew)."""
    try:
        with tarfile.open(archive) as tar:
            theirs = json.loads(tar.extractfile("key.json").read())
            ours = cache_key()
            if theirs != ours:
                differ = ", ".join(
                    f"{k} {theirs.get(k)} there, {ours[k]} here" for k in ours if theirs.get(k) != ours[k]
                )
                print(f"compile caches {archive}: not used ({differ})", flush=True)
                return False
            if any((work / c).exists() and any((work / c).iterdir()) for c in CACHES):
                print(
                    f"compile caches {archive}: not used ({work / 'cache'} already holds caches)", flush=True
                )
                return False
            members = [m for m in tar.getmembers() if m.name != "key.json"]
            if bad := [m.name for m in members if not m.name.startswith(CACHES) or ".." in m.name
                       or not (m.isfile() or m.isdir())]:  # fmt: skip
                raise LaunchError(f"{archive}: member {bad[0]} is not a cache file")
            tar.extractall(work, members=members, filter="data")
    except (OSError, EOFError, KeyError, tarfile.TarError, json.JSONDecodeError) as e:  # EOFError: cut short
        raise LaunchError(f"{archive}: not a compile-cache archive ({e})") from None
    print(f"compile caches {archive}: {len(members)} entries into {work / 'cache'}", flush=True)
    return True
