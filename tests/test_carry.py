"""tools/carry.py: files split into per-call folders here, joined and sha256-checked on the GPU machine."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import carry  # noqa: E402


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "tracked.txt").write_bytes(b"x" * 1000)
    return repo


def _files(tmp_path: Path) -> list[Path]:
    a, b = tmp_path / "model.gguf", tmp_path / "w.whl"
    a.write_bytes(bytes(range(256)) * 40)  # 10,240 bytes
    b.write_bytes(b"wheel" * 7)
    return [a, b]


def test_split_receive_join_round_trip(tmp_path):
    repo, files = _repo(tmp_path), _files(tmp_path)
    folders = carry.split(files, "m", repo, budget=4000)
    # 10,275 bytes at 4,000 a call: three calls, the small file in the last one's space
    assert [f.name for f in folders] == ["call01", "call02", "call03"]
    assert all(
        sum(p.stat().st_size for p in f.iterdir() if p.name != "manifest.json") <= 4000 for f in folders
    )
    landing = tmp_path / "landing"
    for f in folders:
        carry.receive(f, landing)
    joined = carry.join("m", tmp_path / "out", landing)
    assert [p.read_bytes() for p in joined] == [f.read_bytes() for f in files]
    assert not list((landing / "m").glob("*.part*"))  # parts removed once joined
    assert "/.carry/" in (repo / ".git/info/exclude").read_text()


def test_join_names_the_missing_call(tmp_path):
    repo = _repo(tmp_path)
    folders = carry.split(_files(tmp_path), "m", repo, budget=4000)
    landing = tmp_path / "landing"
    for f in folders[:1] + folders[2:]:
        carry.receive(f, landing)
    with pytest.raises(carry.CarryError, match=r"model\.gguf\.part001 \(calls \[2\]\)"):
        carry.join("m", tmp_path / "out", landing)
    assert not (tmp_path / "out" / "model.gguf").exists()


def test_altered_part_is_refused_on_receive(tmp_path):
    repo = _repo(tmp_path)
    folders = carry.split(_files(tmp_path), "m", repo, budget=4000)
    part = folders[1] / "model.gguf.part001"
    part.write_bytes(b"\0" + part.read_bytes()[1:])
    with pytest.raises(carry.CarryError, match=r"call02/model\.gguf\.part001: sha256"):
        carry.receive(folders[1], tmp_path / "landing")


def test_budget_is_the_call_limit_less_the_tree(tmp_path, monkeypatch):
    repo = _repo(tmp_path)
    (repo / "untracked.bin").write_bytes(b"u" * 500)  # untracked, not ignored: it travels
    (repo / ".gitignore").write_text("ignored.bin\n")
    (repo / "ignored.bin").write_bytes(b"i" * 10_000)  # ignored: it does not
    assert carry.tree_bytes(repo) == 3 * carry.BLOCK  # tracked.txt, untracked.bin, .gitignore: a block each
    monkeypatch.setattr(carry, "CALL_LIMIT", carry.MARGIN + 3 * carry.BLOCK + 2**20 + 100)
    folders = carry.split(_files(tmp_path), "m", repo)
    manifest = (folders[0] / "manifest.json").read_text()
    assert '"budget": 1048676' in manifest  # 1 MiB + 100: the limit less tree and margin
    monkeypatch.setattr(carry, "CALL_LIMIT", carry.MARGIN + 3 * carry.BLOCK + 100)
    with pytest.raises(carry.CarryError, match="under 1 MiB"):
        carry.split(_files(tmp_path), "n", repo)


def test_a_file_counts_as_its_whole_blocks(tmp_path):
    """Lease 8's parts were refused though the files' bytes left 356,072 to spare: the device tool counts more. By
    4 KiB blocks its 503-file tree was 1.13 MB larger, which explains that refusal and lease 7's pass."""
    repo = _repo(tmp_path)
    for k in range(10):
        (repo / f"small{k}.json").write_bytes(b"{}")
    (repo / "exact.bin").write_bytes(b"e" * carry.BLOCK)
    (repo / "over.bin").write_bytes(b"o" * (carry.BLOCK + 1))
    # tracked.txt and ten 2-byte files a block each, exact.bin one, over.bin two
    assert carry.tree_bytes(repo) == (1 + 10 + 1 + 2) * carry.BLOCK


def _fullest(folders: list[Path]) -> int:
    return max(sum(carry.on_disk(p) for p in f.iterdir()) for f in folders)


def test_split_refuses_an_existing_folder(tmp_path):
    repo = _repo(tmp_path)
    carry.split(_files(tmp_path), "m", repo, budget=4000)
    with pytest.raises(carry.CarryError, match=r"\.carry/m: exists"):
        carry.split(_files(tmp_path), "m", repo, budget=4000)


def test_fits_names_the_call_a_grown_tree_pushes_over_the_limit(tmp_path, monkeypatch):
    """A lease's commits grow the tree after the split; `fits` finds the call that no longer travels before the
    machine starts (lease 4 had 0.5 MB to spare in its fullest call, and every lease adds ~0.5 MB of rows)."""
    repo = _repo(tmp_path)
    folders = carry.split(_files(tmp_path), "m", repo, budget=4000)
    # the tree (tracked.txt, one block), the fullest call (call03: the gguf's tail and the wheel, a block each, and
    # its manifest), 300 to spare
    monkeypatch.setattr(carry, "CALL_LIMIT", carry.BLOCK + _fullest(folders) + 300)
    assert carry.fits("m", repo) == 300
    (repo / "rows.tar.xz").write_bytes(b"r" * 400)  # a lease's rows, untracked and not ignored: they travel
    with pytest.raises(carry.CarryError, match=r"\.carry/m/call03: .* over a call's"):
        carry.fits("m", repo)
    with pytest.raises(carry.CarryError, match="no call folders"):
        carry.fits("other", repo)


def test_fits_counts_what_travels_beside_the_parts(tmp_path, monkeypatch):
    """Lease 7's start call carried the compile caches beside a full part and was refused over 64 MiB: `fits --with`
    counts them in every call they travel with."""
    repo = _repo(tmp_path)
    folders = carry.split(_files(tmp_path), "m", repo, budget=4000)
    monkeypatch.setattr(carry, "CALL_LIMIT", carry.BLOCK + _fullest(folders) + carry.BLOCK + 300)
    caches = repo / ".carry" / "caches"
    caches.mkdir()
    (caches / "GPU.tar.gz").write_bytes(b"c" * 200)
    assert carry.fits("m", repo, (caches,)) == 300
    (caches / "GPU.tar.gz").write_bytes(b"c" * (carry.BLOCK + 1))
    with pytest.raises(
        carry.CarryError, match=rf"call03: .* and {2 * carry.BLOCK} of .*caches are 3796 over a call's"
    ):
        carry.fits("m", repo, (caches,))
    assert carry.fits("m", repo) == carry.BLOCK + 300
