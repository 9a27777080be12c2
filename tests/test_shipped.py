"""embedded/shipped.py: the shipped base's weights and snapshot, tracked as .xz and unpacked into the plain files
every recipe names; a plain file with other bytes is refused by name, never replaced."""

import hashlib
import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from embedded import shipped
from embedded.shipped import SHIPPED, ShippedError, pack, unpack

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def clone(tmp_path) -> Path:
    """A root holding only the tracked .xz files, as a fresh clone has them."""
    for name in SHIPPED:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f"{name}.xz", tmp_path / f"{name}.xz")
    return tmp_path


def test_the_xz_files_hold_the_pinned_bytes_the_recipes_and_manifest_name(clone):
    assert sorted(unpack(clone)) == sorted(clone / name for name in SHIPPED)
    for name, pinned in SHIPPED.items():
        assert hashlib.sha256((clone / name).read_bytes()).hexdigest() == pinned
    manifest = json.loads(
        (ROOT / "embedded/base/tiny_base.json").read_text()
    )  # the snapshot the base was built on
    assert SHIPPED[manifest["snapshot"]["path"]] == manifest["snapshot"]["sha256"]
    assert unpack(clone) == []  # a second call writes nothing
    assert not [p for p in clone.rglob(".*tmp-*")]


def test_a_plain_file_with_other_bytes_is_refused_and_kept(clone):
    weights = clone / "embedded/base/model.safetensors"
    weights.write_bytes(b"a model of my own")
    with pytest.raises(
        ShippedError, match=r"model.safetensors: not the shipped bytes of model.safetensors.xz"
    ):
        unpack(clone)
    assert weights.read_bytes() == b"a model of my own"


def test_a_damaged_or_other_xz_is_refused_by_name(clone):
    packed = clone / "embedded/synthetic.tasks.json.xz"
    packed.write_bytes(packed.read_bytes()[:-100])
    with pytest.raises(ShippedError, match=r"synthetic.tasks.json.xz: not a readable .xz"):
        unpack(clone)
    packed.write_bytes(lzma.compress(b"[]"))
    with pytest.raises(
        ShippedError, match=r"synthetic.tasks.json.xz: unpacks to sha256 .*, embedded/shipped.py pins"
    ):
        unpack(clone)
    assert not (clone / "embedded/synthetic.tasks.json").exists()


def test_pack_round_trips_deterministically_and_keeps_an_existing_xz(tmp_path):
    plain = tmp_path / "model.safetensors"
    plain.write_bytes((ROOT / "embedded/base/model.safetensors").read_bytes()[:300_000])
    first = pack(plain).read_bytes()
    assert lzma.decompress(first) == plain.read_bytes()
    with pytest.raises(ShippedError, match=r"model.safetensors.xz: exists; remove it"):
        pack(plain)
    (tmp_path / "model.safetensors.xz").unlink()
    assert pack(plain).read_bytes() == first


def test_cli_refusal_is_one_line_and_exit_1(clone, monkeypatch, capsys):
    (clone / "embedded/synthetic.tasks.json").write_text("[]")
    monkeypatch.setattr(shipped, "ROOT", clone)
    monkeypatch.setattr(shipped.unpack, "__defaults__", (clone,))
    assert shipped.main([]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {clone / 'embedded/synthetic.tasks.json'}: not the shipped"
    )


def test_the_launcher_refuses_a_plan_while_a_shipped_file_is_not_the_shipped_bytes(tmp_path):
    """`python -m launch` unpacks before its base and train stages; here the snapshot a plan names is someone
    else's file, so the launch stops in one line, before anything is written."""
    (tmp_path / "embedded/base").mkdir(parents=True)
    for name in SHIPPED:
        shutil.copy(ROOT / f"{name}.xz", tmp_path / f"{name}.xz")
    (tmp_path / "embedded/synthetic.tasks.json").write_text("[]")
    code = (
        "import sys; from pathlib import Path; import embedded.shipped as s; "
        f"s.unpack.__defaults__ = (Path({str(tmp_path)!r}),); from launch.__main__ import main; "
        "sys.exit(main(sys.argv[1:]))"
    )
    work = tmp_path / "work"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "docs/experiment-embedded/seeds6/plan.yaml",
            "train",
            "--work",
            str(work),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'embedded/synthetic.tasks.json'}: not the shipped bytes of synthetic.tasks.json.xz "
        f"(sha256 pinned {SHIPPED['embedded/synthetic.tasks.json'][:12]}…); move it away to unpack"
    ]
    assert not work.exists()
