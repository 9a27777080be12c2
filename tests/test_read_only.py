"""Issue 61, class 2: on a read-only disk (or one that refuses a write: no permission, full) every command that
writes a run, a card, a comparison or a launch refuses in one line naming the path, exits non-zero, writes
nothing, and shows no traceback. `make eval` and `make regrade` already did; training, `make card`, `make push`,
`make compare` and `make launch` ended in an OSError traceback (on `.lock`, on `.README.md.tmp-…`).

The read-only mount is simulated (tests/read_only.py): tests may run as root, whom chmod does not stop."""

import errno
import os
from pathlib import Path

import pytest
from read_only import read_only, tree
from test_cards import make_run

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs/embedded.yaml"
H200 = ROOT / "docs/experiment-h200/result"


def _one_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _exit_code(main, argv):
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_training_into_a_fresh_output_dir_on_a_read_only_disk(tmp_path, monkeypatch, capsys):
    from trainer import train

    disk = tmp_path / "ro"
    disk.mkdir()
    out = disk / "run"
    read_only(monkeypatch, disk)
    code = _exit_code(train.main, ["--config", str(RECIPE), "--arm", "S2", "--output_dir", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and line == f"error: {out}: Read-only file system", line
    assert not out.exists()


def test_resuming_a_run_on_a_read_only_disk(tmp_path, monkeypatch, capsys):
    from trainer import train

    run = tmp_path / "ro" / "run"
    run.mkdir(parents=True)
    (run / "run.json").write_text('{"arm": "S2"}\n')
    before = tree(tmp_path / "ro")
    read_only(monkeypatch, tmp_path / "ro")
    code = _exit_code(train.main, ["--config", str(RECIPE), "--arm", "S2", "--resume", str(run)])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and line == f"error: {run / '.lock'}: Read-only file system", line
    monkeypatch.undo()
    assert tree(tmp_path / "ro") == before


def test_a_lock_that_cannot_be_created_leaves_no_directory_behind(tmp_path, monkeypatch, capsys):
    """The output_dir could be made, its .lock could not (a full disk): the refusal removes what it made."""
    from trainer import train

    out = tmp_path / "run"
    real_open = os.open

    def full(path, flags, *args, **kwargs):
        if str(path).endswith("/.lock"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full)
    code = _exit_code(train.main, ["--config", str(RECIPE), "--arm", "S2", "--output_dir", str(out)])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and line.startswith(f"error: {out / '.lock'}: ") and "disk is full" in line, line
    assert not out.exists()


@pytest.mark.parametrize("errno_", [errno.EROFS, errno.EACCES], ids=["read-only", "no-permission"])
def test_make_card_on_a_read_only_run(errno_, tmp_path, monkeypatch, capsys):
    from cards import card

    run = make_run(tmp_path)
    before = tree(run)
    read_only(monkeypatch, run, errno_)
    code = _exit_code(card.main, [str(run)])
    line = _one_line(capsys.readouterr().err)
    assert (
        code == 1
        and line.startswith(f"error: {run}/step")
        and line.endswith(f"/README.md: {os.strerror(errno_)}")
    ), line
    monkeypatch.undo()
    assert tree(run) == before


def test_make_push_of_a_read_only_run_stops_before_the_hub(tmp_path, monkeypatch, capsys):
    from cards import push

    run = make_run(tmp_path)
    before = tree(run)
    called = []
    monkeypatch.setattr(push, "HfApi", lambda *a, **k: called.append(a) or pytest.fail("a Hub client"))
    read_only(monkeypatch, run)
    code = _exit_code(push.main, [str(run), "--repo", "org/name"])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and line.startswith(f"error: {run}/") and line.endswith(": Read-only file system"), line
    monkeypatch.undo()
    assert tree(run) == before and not called


def test_make_compare_into_a_read_only_folder(tmp_path, monkeypatch, capsys):
    from analysis import compare
    from rundir.archive import unpack

    runs = unpack(H200, tmp_path / "h200") / "runs"
    disk = tmp_path / "ro"
    disk.mkdir()
    read_only(monkeypatch, disk)
    argv = [str(runs / "S2"), str(runs / "S0"), "--resamples", "10", "--out", str(disk / "cmp")]
    code = _exit_code(compare.main, argv)
    line = _one_line(capsys.readouterr().err)
    assert code not in (0, None) and line.endswith(f"{disk / 'cmp'}: Read-only file system"), line
    monkeypatch.undo()
    assert tree(disk) == {}


def test_make_launch_into_a_read_only_work_folder(tmp_path, monkeypatch, capsys):
    from launch.__main__ import main as launch_main

    disk = tmp_path / "ro"
    disk.mkdir()
    read_only(monkeypatch, disk)
    plan = str(ROOT / "docs/experiment-real/plan.yaml")
    code = launch_main([plan, "train", "--smoke", "--work", str(disk / "w"), "--out", str(disk / "o")])
    line = _one_line(capsys.readouterr().err)
    assert code == 1 and line == f"error: {disk / 'w'}: Read-only file system", line
    monkeypatch.undo()
    assert tree(disk) == {}


def test_refused_write_is_the_disk_refusing_and_nothing_else():
    from data.atomic import refused_write

    assert (
        refused_write(OSError(errno.EROFS, "Read-only file system", "/r/x")) == "/r/x: Read-only file system"
    )
    assert (
        refused_write(PermissionError(errno.EACCES, "Permission denied", "/r/x")) == "/r/x: Permission denied"
    )
    assert refused_write(OSError(errno.ENOSPC, "No space left on device")).startswith(
        "a file: not written, the disk is full"
    )  # a write to an open file names no path
    assert (
        refused_write(PermissionError(errno.EPERM, "Operation not permitted")) is None
    )  # no path: not the disk
    assert refused_write(FileNotFoundError(errno.ENOENT, "No such file or directory", "/r/x")) is None
    assert refused_write(ValueError("x")) is None
