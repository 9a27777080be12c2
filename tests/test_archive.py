"""rundir/archive.py: published rows packed into rows.tar.xz and read by rundir's readers as if on disk."""

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from rundir import archive
from rundir.files import Run, read_jsonl

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "docs/experiment-h200/result"


@pytest.fixture
def plain(tmp_path) -> Path:
    """The H200 experiment's folder with its rows as plain files (unpacked from the committed archive)."""
    return archive.unpack(H200, tmp_path / "plain")


def test_a_packed_run_reads_as_its_plain_files(plain, tmp_path):
    packed = tmp_path / "packed"
    (plain / "README.md").write_text("a folder's own README stays on disk\n")
    shutil.copytree(plain, packed)
    card = lambda p: p.name == "README.md" and (p.parent / "run.json").is_file()  # noqa: E731  (a run's card)
    rows = lambda p: p.suffix in (".jsonl", ".log") or p.name == "run.json" or card(p)  # noqa: E731  (packed)
    before = {p.relative_to(plain) for p in plain.rglob("*") if rows(p)}
    assert (
        before
        and (plain / "runs/S2/results/steps.jsonl").is_file()
        and (plain / "runs/S2/README.md").is_file()
    )
    assert Path("runs/S2/README.md") in before and Path("README.md") not in before
    archive.pack(packed)
    assert not [p for p in packed.rglob("*") if rows(p)]  # the plain files are gone
    assert (packed / "README.md").is_file()
    a, b = Run(plain / "runs/S2"), Run(packed / "runs/S2")
    assert b.steps == a.steps and list(b.eval_files) == list(a.eval_files)
    assert b.scores == a.scores and b.table(40) == a.table(40)
    assert read_jsonl(packed / "runs/S0/results/eval_step035.jsonl") == read_jsonl(
        plain / "runs/S0/results/eval_step035.jsonl"
    )
    # byte for byte: what tar itself unpacks is what the runs wrote
    with tarfile.open(packed / archive.ARCHIVE) as tar:
        assert {Path(m.name) for m in tar.getmembers()} == before
        member = tar.extractfile("runs/S0/results/steps.jsonl").read()
    assert member == (plain / "runs/S0/results/steps.jsonl").read_bytes()


def test_glob_finds_run_folders_that_exist_only_in_the_archive(plain, tmp_path, monkeypatch):
    from analysis.pairing import expand_runs

    packed = tmp_path / "packed"
    shutil.copytree(plain, packed)
    archive.pack(packed)
    assert not [p for p in (packed / "runs").rglob("*") if p.is_file()]  # cards, rows, run.json: all packed
    shutil.rmtree(packed / "runs")  # the empty folders pack leaves, which a git clone does not have
    monkeypatch.chdir(tmp_path)
    assert archive.glob("packed/runs/S*") == [Path("packed/runs/S0"), Path("packed/runs/S2")]
    assert archive.glob("packed/runs/S*/results") == [
        Path("packed/runs/S0/results"),
        Path("packed/runs/S2/results"),
    ]
    assert expand_runs("packed/runs/S*") == [Path("packed/runs/S0"), Path("packed/runs/S2")]


def test_merge_stores_shared_rows_once_and_the_launches_read_as_before(plain, tmp_path, monkeypatch, capsys):
    """`merge`: an experiment's launch archives (here two launches with the same rows) and its plain rows into
    one archive above them; each launch's runs are then found, read and unpacked from it as from their own."""
    experiment = tmp_path / "experiment"
    for launch in ("launch1", "launch2"):
        shutil.copytree(plain, experiment / launch)
        archive.pack(experiment / launch)
        shutil.rmtree(
            experiment / launch / "runs"
        )  # the empty folders pack leaves, which a clone does not have
    (experiment / "launch1/report.md").write_text("a launch's report stays on disk\n")
    (experiment / "timeline.jsonl").write_text('{"t": 0}\n')
    sizes = sum(a.stat().st_size for a in experiment.rglob(archive.ARCHIVE))
    assert archive.main(["merge", str(experiment)]) == 0
    assert capsys.readouterr().out.startswith(f"{experiment / archive.ARCHIVE}: ")
    assert list(experiment.rglob(archive.ARCHIVE)) == [experiment / archive.ARCHIVE]
    assert (
        experiment / archive.ARCHIVE
    ).stat().st_size < 0.6 * sizes  # the second launch's rows: nearly free
    assert not (experiment / "timeline.jsonl").exists() and (experiment / "launch1/report.md").is_file()
    with tarfile.open(experiment / archive.ARCHIVE) as tar:
        assert "launch2/runs/S2/results/steps.jsonl" in tar.getnames() and "timeline.jsonl" in tar.getnames()
    monkeypatch.chdir(tmp_path)
    assert archive.glob("experiment/launch1/runs/S*") == [
        Path("experiment/launch1/runs/S0"),
        Path("experiment/launch1/runs/S2"),
    ]
    assert Run(experiment / "launch2/runs/S2").scores == Run(plain / "runs/S2").scores
    copy = archive.unpack(experiment / "launch1", tmp_path / "launch1-copy")
    whole = archive.unpack(experiment, tmp_path / "experiment-copy")
    for launch in (copy, whole / "launch1", whole / "launch2"):
        files = {p.relative_to(launch) for p in launch.rglob("*") if p.is_file()} - {Path("report.md")}
        assert files == {p.relative_to(plain) for p in plain.rglob("*") if p.is_file()}, launch
        assert (launch / "runs/S0/results/steps.jsonl").read_bytes() == (
            plain / "runs/S0/results/steps.jsonl"
        ).read_bytes()
    assert (whole / "timeline.jsonl").read_text() == '{"t": 0}\n'
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/README.md").write_text("no rows here\n")
    with pytest.raises(archive.ArchiveError, match=r"empty: no archive below it and no plain rows to merge"):
        archive.merge(tmp_path / "empty")


def test_pack_is_deterministic_and_refuses_an_existing_archive(plain, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(plain / "runs/S0", one)
    shutil.copytree(plain / "runs/S0", two)
    assert archive.pack(one).read_bytes() == archive.pack(two).read_bytes()
    (one / "results/extra.jsonl").write_text("{}\n")
    with pytest.raises(archive.ArchiveError, match=r"one/rows\.tar\.xz: exists"):
        archive.pack(one)
    assert (one / "results/extra.jsonl").is_file()  # nothing removed


def test_a_file_on_disk_and_in_the_archive_is_refused_by_name(plain, tmp_path):
    packed = tmp_path / "packed"
    shutil.copytree(plain / "runs/S2", packed)
    archive.pack(packed)
    twin = packed / "results/eval_step040.jsonl"
    shutil.copy(plain / "runs/S2/results/eval_step040.jsonl", twin)
    with pytest.raises(archive.ArchiveError, match=r"eval_step040\.jsonl: on disk and in .*rows\.tar\.xz"):
        Run(packed)
    with pytest.raises(archive.ArchiveError, match=r"eval_step040\.jsonl: on disk and in"):
        read_jsonl(twin)


def test_a_damaged_archive_is_one_line_naming_it(plain, tmp_path):
    packed = tmp_path / "packed"
    shutil.copytree(plain / "runs/S2", packed)
    path = archive.pack(packed)
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(archive.ArchiveError, match=r"rows\.tar\.xz: not a readable tar\.xz"):
        _ = Run(packed).steps


def test_unpack_gives_a_plain_copy_and_the_cli_says_one_line(plain, tmp_path, capsys):
    assert json.loads((plain / "runs/S2/run.json").read_text())["arm"] == "S2"
    assert (plain / "runs/S2/results/eval_step000.jsonl").is_file() and not (plain / archive.ARCHIVE).exists()
    assert archive.main(["unpack", str(H200), str(plain)]) == 1
    assert capsys.readouterr().err.strip() == f"error: {plain}: exists; unpack into a new folder"
    assert archive.main(["pack", str(tmp_path / "nothing-here")]) == 1
    assert "no .jsonl, .log, run.json files to pack" in capsys.readouterr().err


def _damage(archive_path: Path, how: str) -> None:
    if how == "cut":  # a download or copy cut short
        archive_path.write_bytes(archive_path.read_bytes()[: archive_path.stat().st_size // 2])
        return
    with tarfile.open(archive_path, "r:xz") as tar:  # the same members, then one the reader refuses
        members = [(info, tar.extractfile(info).read()) for info in tar]
    with tarfile.open(archive_path, "w:xz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("runs/S2/results/eval_step999.jsonl")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)


def _entry_points(docs: Path) -> dict:
    """Each reader of published rows, as its command runs it: a callable returning the exit status."""
    from analysis import compare, published
    from cards import card, push
    from launch.__main__ import main as launch_main
    from rundir import regrade

    runs = docs / "experiment-h200/result/runs"

    def exit_code(main, argv):
        try:
            return main(argv)
        except SystemExit as e:
            return e.code

    return {
        "compare": lambda: exit_code(compare.main, [str(runs / "S2"), str(runs / "S0"), "--resamples", "10",
                                                    "--out", str(docs / "cmp")]),
        "card": lambda: exit_code(card.main, [str(runs / "S2")]),
        "published": lambda: exit_code(published.main, [str(docs)]),
        "launch-report": lambda: exit_code(launch_main, [str(ROOT / "docs/experiment-h200/plan.yaml"), "report",
                                                         "--results", str(runs)]),
        "regrade": lambda: exit_code(regrade.main, [str(runs / "S2")]),
        "push": lambda: exit_code(push.main, [str(runs / "S2"), "--repo", "org/name", "--dry-run"]),
    }  # fmt: skip


@pytest.mark.parametrize("how", ["cut", "refused-member"])
@pytest.mark.parametrize("entry", ["compare", "card", "published", "launch-report", "regrade", "push"])
def test_every_reader_of_a_damaged_archive_says_one_line_naming_it_and_exits_non_zero(
    entry, how, tmp_path, capsys
):
    """Issue 61, class 4: `make compare` on a published run whose rows.tar.xz is cut short, or holds a member the
    reader refuses, printed the archive error as a traceback."""
    docs = tmp_path / "docs"
    shutil.copytree(H200.parent, docs / "experiment-h200")
    damaged = docs / "experiment-h200/result" / archive.ARCHIVE
    _damage(damaged, how)
    before = sorted(p for p in docs.rglob("*"))
    code = _entry_points(docs)[entry]()
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line]
    assert code not in (0, None) and len(err) == 1 and str(damaged) in err[0], (code, err)
    assert sorted(p for p in docs.rglob("*")) == before  # nothing written


def test_pack_refuses_a_symlink_to_outside_the_folder(plain, tmp_path, capsys):
    """Issue 61, class 3 at `make launch ... unpack` and `python -m rundir.archive pack`: published rows are never
    bytes from outside the folder."""
    (tmp_path / "secret.jsonl").write_text('{"not": "from the run"}\n')
    link = plain / "runs/S2/results/extra.jsonl"
    link.symlink_to(tmp_path / "secret.jsonl")
    before = sorted(plain.rglob("*"))
    assert archive.main(["pack", str(plain)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {link}: a symlink to {tmp_path / 'secret.jsonl'}, outside {plain}; nothing packed"
    ]
    assert sorted(plain.rglob("*")) == before  # no archive, no file removed
