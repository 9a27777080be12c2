"""The `stateNNN/` exact-resume format (SPEC §6): safetensors shards, JSON files, a descriptor, a seal.

```
stateNNN/shard-00000-of-00003.safetensors ...   ~shard_bytes each; tensors packed in sorted-name order
stateNNN/meta.json         the caller's meta (step, RNG, sampler, scheduler, ...)
stateNNN/trainer_state.json ...                 more JSON files (extra_json)
stateNNN/descriptor.json   {"format", "total_bytes", "shards": [{"file", "bytes", "sha256", "tensors"}],
                            "files": [{"file", "bytes", "sha256"}],   (meta.json and every extra file)
                            "tensors": {name: {"dtype", "shape", "parts": [key, ...]}}}
stateNNN/descriptor.sha256 sha256 of descriptor.json's bytes; written last: the state's seal
```
Every file of a state is covered: the seal covers descriptor.json, which covers every other file, and no
file outside that list may be in the directory. A state without its seal is not a state.

A tensor that does not fit the current shard is split: its flat pieces are stored 1-D under the keys
"<name>@<first element>" in consecutive shards (so shards stay ~256 MB even for a 2.5 GB embedding);
a tensor held whole is stored under its own name and shape. No pickle: safetensors and JSON only.

Writes are atomic: everything goes to `.stateNNN.tmp-<pid>/` beside the target, is fsynced, then
renamed into place and the parent fsynced (`install_dir`). A failed save removes its temp dir; a killed
one's is removed by `remove_interrupted_saves` (every save and every start of training call it).
`load_state` verifies every byte before loading anything and names the file it refuses.
"""

import base64
import hashlib
import json
import math
import os
import random
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from data.atomic import FILE_MODE, TEMP_FILE, disk_full, is_disk_full, sha256_file

FORMAT = "capgrpo.state/2"
SEAL = "descriptor.sha256"
SHARD_BYTES = 256 * 2**20
_STATE_DIR = re.compile(r"state(\d{3,})")
_INTERRUPTED = re.compile(r"\.((?:state|step)\d{3,})\.(tmp|old)-(\d+)")
_WORKERS = min(8, os.cpu_count() or 1)  # sha256 and file I/O release the GIL
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}  # fmt: skip


class StateError(Exception):
    """A state directory that must not be loaded; the message names the file."""


@dataclass(frozen=True)
class Descriptor:
    dir: Path
    shards: list[dict]  # {"file", "bytes", "sha256", "tensors": [keys]}
    files: list[dict]  # JSON files, meta.json first: {"file", "bytes", "sha256"}
    tensors: dict[str, dict]  # name -> {"dtype", "shape", "parts": [keys]}
    total_bytes: int
    meta: dict
    sha256: str  # of descriptor.json


# --- save -----------------------------------------------------------------------------------------
def save_state(
    dir: Path,
    *,
    tensors: dict[str, torch.Tensor],
    meta: dict,
    extra_json: dict[str, object] | None = None,
    shard_bytes: int = SHARD_BYTES,
) -> Path:
    """Write `dir` atomically; an existing `dir` is replaced only once the new one is complete.

    `extra_json` = {"trainer_state.json": obj, ...}: more JSON files beside meta.json, listed in
    descriptor.json with their sha256 and verified like the shards (NaN allowed, as the HF Trainer writes).
    A save that does not fit raises DiskFullError (checked up front, and again on ENOSPC mid-write); the
    bytes it needs are exact: shards with their safetensors headers, the JSON files, descriptor and seal.
    """
    target = Path(dir)
    meta_bytes = json.dumps(meta, sort_keys=True, indent=1, allow_nan=False).encode()  # fails before writing
    extra = {name: json.dumps(obj, indent=1).encode() for name, obj in (extra_json or {}).items()}
    for name in extra:
        if not re.fullmatch(r"[\w.-]+\.json", name) or name in ("meta.json", "descriptor.json"):
            raise ValueError(
                f"extra_json file name {name!r}: expected a plain *.json name other than meta/descriptor"
            )
    shards, index = _pack(tensors, shard_bytes)
    names = [f"shard-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    json_files = {"meta.json": meta_bytes, **extra}
    heads = [_header(s) for s in shards]
    sized = [{"file": n, "bytes": 8 + len(h) + sum(t.nbytes for t in s.values()), "sha256": "0" * 64,
              "tensors": list(s)} for n, h, s in zip(names, heads, shards)]  # fmt: skip
    needed = sum(e["bytes"] for e in sized) + sum(map(len, json_files.values()))
    needed += len(_descriptor_bytes(sized, json_files, index)) + len(_seal_bytes(b""))
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_interrupted_saves(target.parent)
    check_free_space(target, needed)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)

    def write_shard(i: int) -> dict:
        size, digest = _write_shard(tmp / names[i], shards[i], heads[i])
        return {"file": names[i], "bytes": size, "sha256": digest, "tensors": list(shards[i])}

    try:
        tmp.mkdir()
        with ThreadPoolExecutor(_WORKERS) as pool:
            entries = list(pool.map(write_shard, range(len(shards))))
        for name, data in json_files.items():
            _write(tmp / name, data)
        descriptor_bytes = _descriptor_bytes(entries, json_files, index)
        _write(tmp / "descriptor.json", descriptor_bytes)
        _write(tmp / SEAL, _seal_bytes(descriptor_bytes))
        _fsync_dir(tmp)
    except BaseException as e:
        full = disk_full(target, needed) if is_disk_full(e) else None  # the free space as the save met it
        shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing behind, the disk as it was
        if full:
            raise full from None
        raise
    install_dir(tmp, target)
    return target


def _descriptor_bytes(entries: list[dict], json_files: dict[str, bytes], index: dict) -> bytes:
    files = [
        {"file": n, "bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in json_files.items()
    ]
    descriptor = {"format": FORMAT, "total_bytes": sum(e["bytes"] for e in entries), "shards": entries,
                  "files": files, "tensors": index}  # fmt: skip
    return json.dumps(descriptor, indent=1).encode()


def _seal_bytes(descriptor_bytes: bytes) -> bytes:
    return (hashlib.sha256(descriptor_bytes).hexdigest() + "\n").encode()


def check_free_space(target: Path, needed: int) -> None:
    if shutil.disk_usage(target.parent).free < needed:
        raise disk_full(target, needed)


def install_dir(tmp: Path, target: Path) -> None:
    """Rename the complete `tmp` to `target`. An existing `target` is renamed away first and deleted only
    once the new one is in place: a kill between the two renames leaves `.NAME.old-<pid>/`, which
    `remove_interrupted_saves` puts back."""
    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.replace(target, old)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
        shutil.rmtree(old)
    else:
        os.replace(tmp, target)
        _fsync_dir(target.parent)


def remove_interrupted_saves(parent: Path) -> list[Path]:
    """Temp dirs of dead saves of `stateNNN/` and `stepNNN/` beside them: `.NAME.tmp-<pid>` are removed,
    `.NAME.old-<pid>` put back as NAME when NAME is missing (killed between install_dir's renames), else
    removed. Temp files of dead atomic writes (`.NAME.tmp-<pid>-<random>`, data/atomic.py: run.json,
    steps.jsonl) are removed; NAME itself is whole, the old or the new file. Those of a live process other
    than this one are left alone. Returns what was removed."""
    removed = []
    for f in sorted(Path(parent).glob(".*.tmp-*-*")):
        m = TEMP_FILE.fullmatch(f.name)
        if m and f.is_file() and (int(m[2]) == os.getpid() or not _alive(int(m[2]))):
            f.unlink(missing_ok=True)
            removed.append(f)
    put_back_replaced(parent)
    for d in sorted(Path(parent).glob(".*.*-*")):
        m = _INTERRUPTED.fullmatch(d.name)
        if not m or not d.is_dir() or (int(m[3]) != os.getpid() and _alive(int(m[3]))):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed.append(d)
    return removed


def put_back_replaced(parent: Path) -> list[Path]:
    """`.NAME.old-<pid>/` of a dead process put back as NAME where NAME is missing: a kill between
    install_dir's two renames. Done before a resume judges the states, or the newest good one looks broken."""
    restored = []
    for d in sorted(Path(parent).glob(".*.old-*")):
        m = _INTERRUPTED.fullmatch(d.name)
        if m and m[2] == "old" and d.is_dir() and not (d.parent / m[1]).exists():
            if int(m[3]) == os.getpid() or not _alive(int(m[3])):
                os.replace(d, d.parent / m[1])
                restored.append(d.parent / m[1])
    return restored


def _pack(tensors: dict[str, torch.Tensor], shard_bytes: int) -> tuple[list[dict], dict]:
    """Greedy packing in sorted-name order, splitting a tensor across shards where it does not fit."""
    shards: list[dict[str, torch.Tensor]] = [{}]
    room = shard_bytes
    index = {}
    for name in sorted(tensors):
        if "@" in name:
            raise ValueError(f"tensor name {name!r} contains '@' (reserved for split tensors)")
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _DTYPES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot be stored")
        index[name] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape), "parts": []}
        if t.nbytes <= room:  # whole, in the current shard
            shards[-1][name] = t
            index[name]["parts"].append(name)
            room -= t.nbytes
            continue
        if t.nbytes <= shard_bytes:  # whole, in a fresh shard rather than split
            shards.append({name: t})
            index[name]["parts"].append(name)
            room = shard_bytes - t.nbytes
            continue
        # larger than a shard: flat pieces filling the current shard and as many more as needed
        flat, start = t.view(-1), 0
        while start < flat.numel():
            if room < t.element_size():
                shards.append({})
                room = shard_bytes
            n = min(flat.numel() - start, room // t.element_size())
            key = f"{name}@{start}"
            shards[-1][key] = flat[start : start + n]
            index[name]["parts"].append(key)
            room -= n * t.element_size()
            start += n
    return shards, index


def _header(tensors: dict[str, torch.Tensor]) -> bytes:
    """A shard's safetensors JSON header, padded so that the data is 8-byte aligned, as safetensors writes it."""
    header, offset = {}, 0
    for key, t in tensors.items():
        header[key] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    return head + b" " * (-len(head) % 8)


def _write_shard(path: Path, tensors: dict[str, torch.Tensor], head: bytes) -> tuple[int, str]:
    """Write one safetensors file straight from tensor memory, hashing on the way; (bytes, sha256).

    The layout is safetensors' own (u64 header length, JSON header, raw little-endian data; loaded
    back by safetensors itself): safetensors.torch.save copies each shard twice holding the GIL, which
    capped saving at 0.6 GB/s on the H200 host whatever the thread count.
    """
    offset = sum(t.nbytes for t in tensors.values())
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        os.fchmod(f.fileno(), FILE_MODE)
        for part in [len(head).to_bytes(8, "little"), head, *(_raw(t) for t in tensors.values())]:
            digest.update(part)  # hashlib and file writes release the GIL: shards go out in parallel
            f.write(part)
        f.flush()
        os.fsync(f.fileno())
    return 8 + len(head) + offset, digest.hexdigest()


def _raw(t: torch.Tensor) -> memoryview:
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        os.fchmod(f.fileno(), FILE_MODE)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- verify and load ------------------------------------------------------------------------------
def _read_json(path: Path, data: bytes) -> dict:
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StateError(f"{path}: malformed JSON ({e})") from None
    if not isinstance(obj, dict):
        raise StateError(f"{path}: malformed (expected a JSON object)")
    return obj


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise StateError(f"{path}: missing")
    return path.read_bytes()


def _descriptor(dir: Path, *, hash_shards: bool) -> Descriptor:
    """Every check but (unless hash_shards) the shards' sha256; the JSON files are small and always hashed."""
    if not dir.is_dir():
        raise StateError(f"{dir}: missing")
    seal_path, desc_path = dir / SEAL, dir / "descriptor.json"
    seal = _read(seal_path).decode(errors="replace").strip()
    if not re.fullmatch(r"[0-9a-f]{64}", seal):
        raise StateError(f"{seal_path}: malformed (expected the sha256 of descriptor.json)")
    desc_bytes = _read(desc_path)
    if hashlib.sha256(desc_bytes).hexdigest() != seal:
        raise StateError(f"{desc_path}: sha256 does not match {SEAL} (corrupted or tampered)")
    desc = _read_json(desc_path, desc_bytes)
    shards, files, tensors = desc.get("shards"), desc.get("files"), desc.get("tensors")
    if desc.get("format") != FORMAT:
        raise StateError(f"{desc_path}: format {desc.get('format')!r}, expected {FORMAT!r}")
    if not isinstance(shards, list) or not isinstance(files, list) or not isinstance(tensors, dict):
        raise StateError(f"{desc_path}: malformed (shards, files and tensors expected)")
    owner: dict[str, str] = {}
    for i, s in enumerate(shards):
        expected = f"shard-{i:05d}-of-{len(shards):05d}.safetensors"
        if not isinstance(s, dict) or s.get("file") != expected:
            raise StateError(
                f"{desc_path}: unexpected shard listed at position {i}: {s!r} (expected {expected})"
            )
        if not isinstance(s.get("tensors"), list) or not isinstance(s.get("sha256"), str):
            raise StateError(f"{desc_path}: malformed entry for {expected}")
        for key in s["tensors"]:
            if key in owner:
                raise StateError(f"{desc_path}: tensor {key!r} listed in {owner[key]} and {expected}")
            owner[key] = expected
    for name, t in tensors.items():
        if not isinstance(t, dict) or not isinstance(t.get("shape"), list) or not t.get("parts"):
            raise StateError(f"{desc_path}: malformed entry for tensor {name!r}")
        for key in t["parts"]:
            if key not in owner:
                raise StateError(f"{desc_path}: tensor {name!r} part {key!r} is in no shard")
    if desc.get("total_bytes") != sum(s.get("bytes", 0) for s in shards):
        raise StateError(
            f"{desc_path}: total_bytes {desc.get('total_bytes')} is not the sum of the shard sizes"
        )
    for f in files:
        if not isinstance(f, dict) or not re.fullmatch(r"[\w.-]+\.json", str(f.get("file"))):
            raise StateError(f"{desc_path}: malformed 'files' entry {f!r}")
    if "meta.json" not in [f["file"] for f in files]:
        raise StateError(f"{desc_path}: meta.json not listed (every file of a state is covered)")
    listed = {s["file"] for s in shards + files} | {"descriptor.json", SEAL}
    for f in sorted(dir.iterdir()):
        if f.name not in listed:
            raise StateError(f"{f}: file not listed in {desc_path}")
    for s in shards + files:
        path = dir / s["file"]
        if not path.is_file():
            raise StateError(f"{path}: missing")
        if (size := path.stat().st_size) != s.get("bytes"):
            short = " (truncated)" if isinstance(s.get("bytes"), int) and size < s["bytes"] else ""
            raise StateError(f"{path}: size {size} bytes, descriptor.json says {s.get('bytes')}{short}")
    json_data = {}
    for f in files:
        json_data[f["file"]] = data = (dir / f["file"]).read_bytes()
        if hashlib.sha256(data).hexdigest() != f.get("sha256"):
            raise StateError(f"{dir / f['file']}: sha256 mismatch (corrupted or edited)")
    if hash_shards:
        with ThreadPoolExecutor(_WORKERS) as pool:
            digests = list(pool.map(sha256_file, [dir / s["file"] for s in shards]))
        for s, digest in zip(shards, digests):
            if digest != s.get("sha256"):
                raise StateError(f"{dir / s['file']}: sha256 mismatch (corrupted)")
    meta = _read_json(dir / "meta.json", json_data["meta.json"])
    return Descriptor(dir, shards, files, tensors, desc["total_bytes"], meta, seal)


def check_state(dir: Path) -> Descriptor:
    """Every check of verify_state except hashing the shards (sizes are checked): cheap, for listing."""
    return _descriptor(Path(dir), hash_shards=False)


def verify_state(dir: Path) -> Descriptor:
    """The seal, descriptor.json, every file's presence, size and sha256, no unlisted file; raise
    StateError naming the file."""
    return _descriptor(Path(dir), hash_shards=True)


def load_state(dir: Path, *, expect: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Verify everything, then load. `expect` (e.g. {"arm": "S2", "policy_id": ...}) must match meta.json;
    it is checked before the shards are hashed (fail fast)."""
    dir = Path(dir)
    meta = check_state(dir).meta
    for field, value in (expect or {}).items():
        if meta.get(field) != value:
            raise StateError(
                f"{dir / 'meta.json'}: field {field!r} is {meta.get(field)!r}, expected {value!r}"
            )
    desc = verify_state(dir)
    pieces: dict[str, torch.Tensor] = {}
    for s in desc.shards:
        loaded = safetensors.torch.load_file(dir / s["file"])
        if sorted(loaded) != sorted(s["tensors"]):
            raise StateError(
                f"{dir / s['file']}: holds tensors {sorted(loaded)}, descriptor.json lists {s['tensors']}"
            )
        pieces |= loaded
    tensors = {}
    for name, t in desc.tensors.items():
        parts = [pieces.pop(k) for k in t["parts"]]
        whole = (
            parts[0] if len(parts) == 1 and t["parts"] == [name] else torch.cat([p.view(-1) for p in parts])
        )
        if whole.numel() != math.prod(t["shape"]) or str(whole.dtype).removeprefix("torch.") != t["dtype"]:
            raise StateError(f"{dir / 'descriptor.json'}: tensor {name!r} does not match its dtype/shape")
        tensors[name] = whole.view(t["shape"])
    return tensors, desc.meta


def state_dirs(run_dir: Path) -> list[Path]:
    """Every `stateNNN/` of `run_dir` (complete or not), oldest first."""
    found = [(int(m[1]), d) for d in Path(run_dir).glob("state*") if (m := _STATE_DIR.fullmatch(d.name))]
    return [d for _, d in sorted(found) if d.is_dir()]


def latest_state(run_dir: Path) -> Path | None:
    """Highest `stateNNN/` passing check_state (everything but the shard hashes); None if none."""
    for d in reversed(state_dirs(run_dir)):
        try:
            check_state(d)
        except StateError:
            continue
        return d
    return None


# --- RNG states as JSON ---------------------------------------------------------------------------
def capture_rng_state() -> dict:
    """python `random`, numpy's global RandomState, torch CPU and every CUDA device, JSON-safe."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },  # fmt: skip
        "torch": _b64(torch.get_rng_state()),
        "cuda": [_b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }


def restore_rng_state(d: dict) -> None:
    cuda = d["cuda"]
    if cuda and len(cuda) != (torch.cuda.device_count() if torch.cuda.is_available() else 0):
        raise ValueError(
            f"RNG state has {len(cuda)} CUDA devices, this process sees {torch.cuda.device_count()}"
        )
    py, npy = d["python"], d["numpy"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss_next"]))
    np.random.set_state((npy["kind"], np.array(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))  # fmt: skip
    torch.set_rng_state(_unb64(d["torch"]))
    if cuda:
        torch.cuda.set_rng_state_all([_unb64(s) for s in cuda])


def _b64(t: torch.Tensor) -> str:
    return base64.b64encode(t.numpy().tobytes()).decode()


def _unb64(s: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8)
