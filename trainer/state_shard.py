"""The `stateNNN/` exact-resume format (SPEC §6): safetensors shards, descriptor.json, meta.json.

```
stateNNN/shard-00000-of-00003.safetensors ...   ~shard_bytes each; tensors packed in sorted-name order
stateNNN/descriptor.json   {"format", "total_bytes", "shards": [{"file", "bytes", "sha256", "tensors"}],
                            "files": [{"file", "bytes", "sha256"}],   (extra JSON files, e.g. trainer_state)
                            "tensors": {name: {"dtype", "shape", "parts": [key, ...]}}}
stateNNN/meta.json         the caller's meta + "descriptor_sha256" (sha256 of descriptor.json's bytes)
```
A tensor that does not fit the current shard is split: its flat pieces are stored 1-D under the keys
"<name>@<first element>" in consecutive shards (so shards stay ~256 MB even for a 2.5 GB embedding);
a tensor held whole is stored under its own name and shape. No pickle: safetensors and JSON only.

Writes are atomic: everything goes to `.stateNNN.tmp-<pid>/` beside the target, is fsynced, then
renamed into place and the parent fsynced. `load_state` verifies every byte against descriptor.json
(and descriptor.json against meta.json) before loading anything, and names the file it refuses.
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

FORMAT = "capgrpo.state/1"
SHARD_BYTES = 256 * 2**20
_STATE_DIR = re.compile(r"state(\d{3,})")
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
    files: list[dict]  # extra JSON files: {"file", "bytes", "sha256"}
    tensors: dict[str, dict]  # name -> {"dtype", "shape", "parts": [keys]}
    total_bytes: int


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
    """
    target = Path(dir)
    if "descriptor_sha256" in meta:
        raise ValueError("meta must not contain 'descriptor_sha256' (save_state writes it)")
    meta_text = json.dumps(meta, sort_keys=True, indent=1, allow_nan=False)  # fail before writing anything
    extra = {name: json.dumps(obj, indent=1).encode() for name, obj in (extra_json or {}).items()}
    for name in extra:
        if not re.fullmatch(r"[\w.-]+\.json", name) or name in ("meta.json", "descriptor.json"):
            raise ValueError(
                f"extra_json file name {name!r}: expected a plain *.json name other than meta/descriptor"
            )
    shards, index = _pack(tensors, shard_bytes)
    names = [f"shard-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    target.parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(target.parent)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()

    def write_shard(i: int) -> dict:
        size, digest = _write_shard(tmp / names[i], shards[i])
        return {"file": names[i], "bytes": size, "sha256": digest, "tensors": list(shards[i])}

    with ThreadPoolExecutor(_WORKERS) as pool:
        entries = list(pool.map(write_shard, range(len(shards))))
    for name, data in extra.items():
        _write(tmp / name, data)
    files = [{"file": n, "bytes": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in extra.items()]
    descriptor = {"format": FORMAT, "total_bytes": sum(e["bytes"] for e in entries), "shards": entries,
                  "files": files, "tensors": index}  # fmt: skip
    descriptor_bytes = json.dumps(descriptor, indent=1).encode()
    _write(tmp / "descriptor.json", descriptor_bytes)
    full_meta = json.loads(meta_text) | {"descriptor_sha256": hashlib.sha256(descriptor_bytes).hexdigest()}
    _write(tmp / "meta.json", json.dumps(full_meta, sort_keys=True, indent=1).encode())
    _fsync_dir(tmp)

    if target.exists():
        old = target.parent / f".{target.name}.old-{os.getpid()}"
        os.replace(target, old)
        os.replace(tmp, target)
        _fsync_dir(target.parent)
        shutil.rmtree(old)
    else:
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    return target


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


def _write_shard(path: Path, tensors: dict[str, torch.Tensor]) -> tuple[int, str]:
    """Write one safetensors file straight from tensor memory, hashing on the way; (bytes, sha256).

    The layout is safetensors' own (u64 header length, JSON header, raw little-endian data; loaded
    back by safetensors itself): safetensors.torch.save copies each shard twice holding the GIL, which
    capped saving at 0.6 GB/s on the H200 host whatever the thread count.
    """
    header, offset = {}, 0
    for key, t in tensors.items():
        header[key] = {
            "dtype": _DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # data 8-byte aligned, as safetensors writes it
    digest = hashlib.sha256()
    with open(path, "wb") as f:
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
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _clean_stale(parent: Path) -> None:
    """Remove temp dirs of dead saves; `.stateNNN.old-*` only once stateNNN/ itself is back in place."""
    for d in parent.glob(".state*.*-*"):
        m = re.fullmatch(r"\.(state\d{3,})\.(tmp|old)-(\d+)", d.name)
        if not m or not d.is_dir() or (int(m[3]) != os.getpid() and _alive(int(m[3]))):
            continue
        if m[2] == "tmp" or (parent / m[1]).is_dir():
            shutil.rmtree(d, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# --- verify and load ------------------------------------------------------------------------------
def _read_json(path: Path, sha256: str | None = None) -> dict:
    if not path.is_file():
        raise StateError(f"{path}: missing")
    data = path.read_bytes()
    if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
        raise StateError(f"{path}: sha256 does not match descriptor_sha256 in meta.json (tampered)")
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise StateError(f"{path}: malformed JSON ({e})") from None
    if not isinstance(obj, dict):
        raise StateError(f"{path}: malformed (expected a JSON object)")
    return obj


def _descriptor(dir: Path, *, hash_shards: bool) -> Descriptor:
    meta = _read_json(dir / "meta.json")
    if not isinstance(meta.get("descriptor_sha256"), str):
        raise StateError(f"{dir / 'meta.json'}: no descriptor_sha256")
    desc_path = dir / "descriptor.json"
    desc = _read_json(desc_path, meta["descriptor_sha256"])
    shards, tensors = desc.get("shards"), desc.get("tensors")
    if desc.get("format") != FORMAT or not isinstance(shards, list) or not isinstance(tensors, dict):
        raise StateError(f"{desc_path}: malformed (format {desc.get('format')!r}, expected {FORMAT!r})")
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
    listed = {s["file"] for s in shards}
    for f in sorted(dir.glob("shard-*.safetensors")):
        if f.name not in listed:
            raise StateError(f"{f}: shard file not listed in {desc_path}")
    files = desc.get("files", [])
    for f in files if isinstance(files, list) else [None]:
        if not isinstance(f, dict) or not re.fullmatch(r"[\w.-]+\.json", str(f.get("file"))):
            raise StateError(f"{desc_path}: malformed 'files' entry {f!r}")
    for s in shards + files:
        path = dir / s["file"]
        if not path.is_file():
            raise StateError(f"{path}: missing")
        if path.stat().st_size != s.get("bytes"):
            raise StateError(
                f"{path}: size {path.stat().st_size} bytes, descriptor.json says {s.get('bytes')}"
            )
    if hash_shards:
        with ThreadPoolExecutor(_WORKERS) as pool:
            digests = list(pool.map(_sha256_file, [dir / s["file"] for s in shards + files]))
        for s, digest in zip(shards + files, digests):
            if digest != s.get("sha256"):
                raise StateError(f"{dir / s['file']}: sha256 mismatch (corrupted)")
    return Descriptor(dir, shards, files, tensors, desc["total_bytes"])


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(16 * 2**20):
            h.update(chunk)
    return h.hexdigest()


def verify_state(dir: Path) -> Descriptor:
    """Check meta.json, descriptor.json and every shard's size and sha256; raise StateError naming the file."""
    return _descriptor(Path(dir), hash_shards=True)


def load_state(dir: Path, *, expect: dict | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """Verify everything, then load. `expect` (e.g. {"arm": "S2", "policy_id": ...}) must match meta.json."""
    dir = Path(dir)
    meta = _read_json(dir / "meta.json")
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
    return tensors, meta


def latest_state(run_dir: Path) -> Path | None:
    """Highest `stateNNN/` passing a structural check (JSON, descriptor hash, shard sizes); None if none."""
    found = sorted(
        (int(m[1]), d) for d in Path(run_dir).glob("state*") if (m := _STATE_DIR.fullmatch(d.name))
    )
    for _, d in reversed(found):
        try:
            _descriptor(d, hash_shards=False)
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
