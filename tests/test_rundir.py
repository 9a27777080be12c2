"""rundir.files: the one reader of a run directory (names, rows, accuracy per set and step)."""

import ast
import errno
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from data.atomic import DiskFullError, write_atomic
from rundir.files import Run, RunFileError, SetScore, eval_path, read_jsonl, summarize, write_eval
from rundir.lock import LOCK_FILE, RunLock, RunLockedError
from rundir.resume import rewind
from rundir.step import StepError, verify_step
from rundir.step import main as step_main


def _rows(step: int, cap: int, outcomes: list[str], name: str = "heldout300") -> list[dict]:
    return [
        {"step": step, "set": name, "task_id": f"t{i}", "sample": 0, "seed": i, "outcome": o, "answer": "1",
         "reference": "1", "completion_tokens": 10 + i, "cap": cap, "completion": "..."}
        for i, o in enumerate(outcomes)
    ]  # fmt: skip


@pytest.fixture
def run_dir(tmp_path):
    meta = {"arm": "S2", "policy_id": "p", "gate": "v1", "grader_version": "g", "eval": {"cap": 64}}
    (tmp_path / "run.json").write_text(json.dumps(meta))
    for step, outcomes in {0: ["wrong", "wrong"], 2: ["correct", "wrong"], 4: ["wrong", "correct"]}.items():
        write_eval(tmp_path, step, _rows(step, 64, outcomes))
    write_eval(tmp_path, 4, _rows(4, 128, ["correct", "correct"]), cap_suffix=128)
    for d in ("step002", "step004", "state004"):
        (tmp_path / d).mkdir()
    return tmp_path


def test_scores_are_keyed_by_step_and_cap(run_dir):
    run = Run(run_dir)
    assert sorted(run.eval_files) == [(0, 64), (2, 64), (4, 64), (4, 128)]
    assert run.evaluated() == [0, 2, 4] and run.evaluated(128) == [4]
    assert run.score(4, "heldout300").accuracy == 0.5 and run.score(4, "heldout300", 128).accuracy == 1.0
    assert (run.saved, run.states, run.resumable) == ([2, 4], [4], [4])


def test_best_step_is_the_earliest_of_ties_at_the_run_cap(run_dir):
    # steps 2 and 4 tie at 50%; the 100% of step 4 is at another cap and does not count
    assert Run(run_dir).best_step("heldout300") == {"set": "heldout300", "step": 2, "accuracy": 0.5}


def test_indeterminate_leaves_the_denominator_and_summaries_say_none_when_nothing_is_graded():
    score = SetScore.of(
        ["correct", "indeterminate", "wrong", "truncated"], ["a", "a", "b", "b"], [1, 2, 3, 4]
    )
    assert (score.n, score.graded, score.accuracy, score.samples) == (4, 3, 1 / 3, 2)
    assert summarize(_rows(0, 64, ["indeterminate"]))["heldout300"]["accuracy"] is None
    with pytest.raises(ValueError):
        SetScore.of(["timeout"])


def test_summaries_of_sets_with_several_samples_carry_pass_and_maj_at_k():
    """fixed32-like: 2 problems × 2 samples → pass@1, pass@2, maj@2 with intervals; one sample: none."""
    rows = [
        {**r, "task_id": f"p{i // 2}", "sample": i % 2, "answer": a}
        for i, (r, a) in enumerate(zip(_rows(0, 64, ["correct", "wrong", "wrong", "truncated"], "f"), "1299"))
    ]
    s = summarize(rows + _rows(0, 64, ["correct", "wrong"]))
    assert "at_k" not in s["heldout300"]
    at_k = s["f"]["at_k"]
    assert list(at_k) == ["pass@1", "pass@2", "maj@2"]
    # p0: n 2, c 1 → pass@1 ½, pass@2 1; p1: none correct. maj: p0 ties 1 (correct) and 2 → ½; p1: 9 is wrong.
    assert [at_k[m]["value"] for m in at_k] == [0.25, 0.5, 0.25]
    assert at_k["pass@2"]["ci"] == [0.0, 1.0] and at_k["pass@2"]["level"] == 0.95


def test_rows_that_disagree_with_their_file_name_are_refused(run_dir):
    path = eval_path(run_dir, 2)
    path.write_text(path.read_text().replace('"cap": 64', '"cap": 65', 1))
    with pytest.raises(RunFileError, match=r"eval_step002.jsonl:1: row step/cap 2/65 disagree"):
        Run(run_dir).scores  # noqa: B018
    (run_dir / "results" / "eval_step0002.jsonl").write_text("")
    with pytest.raises(RunFileError, match="two eval files for step 2 at cap 64"):
        Run(run_dir)


# --- issue 30: torn rows, a resume's rewind, atomic writes under a full disk, the lock ------------------
def test_a_torn_last_row_is_named_with_the_way_on_and_a_torn_middle_row_by_line(run_dir):
    """Case 3: a reader (cards, compare) names a torn last row as what an interrupted append leaves."""
    steps = run_dir / "results" / "steps.jsonl"
    steps.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')
    with pytest.raises(RunFileError, match=r"steps.jsonl:3: torn last row .*--resume to redo its step"):
        assert Run(run_dir).steps
    assert [r["step"] for r in read_jsonl(steps, torn_tail="drop")] == [1, 2]
    steps.write_text('{"step": 1}\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(RunFileError, match=r"steps.jsonl:2: not valid JSON"):
        read_jsonl(steps, torn_tail="drop")
    path = eval_path(run_dir, 2)
    path.write_text(path.read_text()[:-20])  # the same for eval rows
    with pytest.raises(RunFileError, match=r"eval_step002.jsonl:2: torn last row") as refused:
        Run(run_dir).rows(2)
    # an eval file is written whole: a resume does not repair it, evaluating the step again does (issue 49)
    assert "--resume" not in str(refused.value) and "make eval RUN=<run> STEPS=<step>" in str(refused.value)


def test_a_resume_drops_the_rows_past_its_state_and_moves_their_eval_files_aside(run_dir):
    """Cases 3 and 7: the torn row goes with the rows past the state; eval_step004.jsonl (and its other-cap
    file) of a step that is redone leave results/ for results/superseded/, where no reader lists them."""
    steps = run_dir / "results" / "steps.jsonl"
    steps.write_text(
        "".join(json.dumps({"step": s, "loss": 0.5}) + "\n" for s in (1, 2, 3)) + '{"step": 4, "l'
    )
    moved = rewind(run_dir, after=2)
    assert steps.read_text() == '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.5}\n'
    assert sorted(p.name for p in moved) == ["eval_step004.jsonl", "eval_step004_cap0128.jsonl"]
    assert Run(run_dir).evaluated() == [0, 2] and all(p.parent.name == "superseded" for p in moved)
    write_eval(
        run_dir, 4, _rows(4, 64, ["wrong", "wrong"])
    )  # the redone step's evaluation, then another resume
    assert [p.name for p in rewind(run_dir, after=2)] == ["eval_step004.1.jsonl"]  # nothing moved is replaced


def test_an_atomic_write_on_a_full_disk_names_the_path_and_keeps_the_old_file(tmp_path, monkeypatch):
    """Case 4: the card writer truncated README.md to 0 bytes and raised [Errno 28] with no path."""
    readme = write_atomic(tmp_path / "README.md", b"the old card")
    real_fdopen = os.fdopen

    def full(fd, mode):
        f = real_fdopen(fd, mode)
        f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
        return f

    monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(DiskFullError) as e:
        write_atomic(readme, b"a new card of 23 bytes.")
    assert str(e.value).startswith(f"{readme}: not saved, the disk is full: it needs 23 bytes and ")
    assert readme.read_bytes() == b"the old card" and sorted(p.name for p in tmp_path.iterdir()) == [
        "README.md"
    ]


def test_a_full_disk_reports_the_free_space_the_write_met(tmp_path, monkeypatch):
    """Issue 49: the free space was measured after the partial file was removed ("400 KB short" on a disk that
    was full when the write failed): it is measured while the partial file still holds its bytes."""
    import shutil
    from collections import namedtuple

    usage, real_fdopen = namedtuple("usage", "total used free"), os.fdopen

    def disk_usage(path):  # a disk whose free space the temp file took
        partial = any(p.name.startswith(".README.md.tmp-") for p in tmp_path.iterdir())
        return usage(10**6, 10**6, 0 if partial else 400_000)

    def full(fd, mode):
        f = real_fdopen(fd, mode)
        f.write = lambda data: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device"))
        return f

    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(os, "fdopen", full)
    with pytest.raises(DiskFullError, match=r"it needs 23 bytes and 0 are free"):
        write_atomic(tmp_path / "README.md", b"a new card of 23 bytes.")
    assert list(tmp_path.iterdir()) == []  # the partial file is gone all the same


def test_the_lock_leaves_nothing_behind_and_refuses_a_second_holder(tmp_path):
    run = tmp_path / "runs" / "S2"
    with RunLock(run) as lock:
        assert (run / LOCK_FILE).read_text() == f"{os.getpid()} {lock.token}\n"  # what require_shared reads
        with pytest.raises(RunLockedError, match=rf"pid {os.getpid()}"):
            RunLock(run).acquire()  # another open file description: flock refuses it too
    assert not run.exists()  # the lock made the directory, and it stayed empty


def refused_while_the_holder_writes(run: Path, line: bytes) -> str:
    """A second RunLock on `run` while a holder has flocked its lock file and writes `line` 0.2 s later (a holder
    between its flock and its pid write): the refusal's message."""
    import fcntl
    import threading

    fd = os.open(run / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    writer = threading.Timer(0.2, lambda: os.pwrite(fd, line, 0))
    writer.start()
    try:
        with pytest.raises(RunLockedError) as refused:
            RunLock(run).acquire()
    finally:
        writer.join()
        os.close(fd)
    return str(refused.value)


def test_a_refusal_names_a_holder_that_has_not_written_its_pid_yet(tmp_path):
    """Issue 49, lock race: the loser read the lock file between the winner's flock and its pid write ("pid ?")."""
    run = tmp_path / "S2"
    run.mkdir()
    assert re.search(r"pid 4242, holding", refused_while_the_holder_writes(run, b"4242 host:token\n"))


def _race(run: str, barrier, results) -> None:
    barrier.wait()
    try:
        with RunLock(run):
            time.sleep(0.05)
        results.put("won")
    except RunLockedError as e:
        results.put(str(e))


def test_two_launches_on_a_new_directory_leave_one_winner_a_named_holder_and_no_directory(tmp_path):
    """Issue 49, lock race: 150 of 150 had one winner, but 12 refusals said "pid ?" and 2 left an empty run
    directory (the launch that made it lost the lock, and the winner had not made it)."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    for attempt in range(20):
        run = tmp_path / f"r{attempt}" / "S2"
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_race, args=(str(run), barrier, results)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        got = sorted(results.get(timeout=5) for _ in procs)
        assert got[-1] == "won", got  # at least one won; both may, one after the other
        assert all(g == "won" or re.search(r"pid \d+, holding", g) for g in got), got
        assert not run.exists(), attempt  # the winner left it empty: removed, whoever made it


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its pid names no process
    return proc.pid


def test_a_refusal_names_the_live_winner_not_the_dead_pid_it_took_over_from(tmp_path):
    """Issue 61, class 7: a killed run's .lock holds a dead pid; the resume that won the flock has not written
    its own yet when the loser reads the file. The loser must name the winner, not the dead pid."""
    import socket

    dead, run = _dead_pid(), tmp_path / "S2"
    run.mkdir()
    (run / LOCK_FILE).write_text(f"{dead} {socket.gethostname()}:0123abcd\n")  # what a SIGKILL leaves
    line = f"{os.getpid()} {socket.gethostname()}:4567ef01\n".encode().ljust(
        len(str(dead)) + 30
    )  # the winner's
    assert re.search(rf"pid {os.getpid()}, holding", refused_while_the_holder_writes(run, line))


def _resume_race(run: str, barrier, results) -> None:
    barrier.wait()
    try:
        with RunLock(run):
            time.sleep(0.05)
        results.put(f"won {os.getpid()}")
    except RunLockedError as e:
        results.put(str(e))


def test_two_resumes_racing_on_a_dead_runs_lock_name_the_winner(tmp_path):
    """Issue 61, class 7, with real processes: the audit's loser named the dead pid in 147 of 150 races."""
    import multiprocessing
    import socket

    ctx, dead = multiprocessing.get_context("fork"), _dead_pid()
    for attempt in range(40):
        run = tmp_path / f"r{attempt}" / "S2"
        run.mkdir(parents=True)
        (run / "run.json").write_text("{}")
        (run / LOCK_FILE).write_text(f"{dead} {socket.gethostname()}:0123abcd\n")
        barrier, results = ctx.Barrier(2), ctx.Queue()
        procs = [ctx.Process(target=_resume_race, args=(str(run), barrier, results)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        got = [results.get(timeout=5) for _ in procs]
        winners = {int(g.split()[1]) for g in got if g.startswith("won ")}
        assert winners, got
        for g in got:
            if not g.startswith("won "):
                named = int(re.search(r"pid (\d+), holding", g).group(1))
                assert named != dead and named in winners, (attempt, dead, got)
        assert sorted(p.name for p in run.iterdir()) == ["run.json"]  # the lock went with its last holder


def test_a_directory_another_launch_made_is_removed_when_left_empty(tmp_path):
    run = tmp_path / "S2"
    run.mkdir()  # made by a launch that then lost the lock
    with RunLock(run):
        pass
    assert not run.exists()
    run.mkdir()
    (run / "run.json").write_text("{}")  # a directory with a run in it is never removed
    with RunLock(run):
        pass
    assert (run / "run.json").is_file() and not (run / LOCK_FILE).exists()


def _imported_packages(package: str) -> dict[str, set[str]]:
    """module file -> the top-level packages of ours it imports."""
    root = Path(__file__).resolve().parent.parent
    ours = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [
            n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and not n.level
        ]
        found[path.relative_to(root).as_posix()] = {m.split(".")[0] for m in names} & ours - {package}
    return found


def test_the_arrows_run_one_way():
    """Issue 31, item 1: cards/push.py imported trainer.state_shard, and rewards/regrade.py imported rundir
    while rundir imported rewards. rundir reads data and rewards only; rewards and data never read rundir."""
    for module, packages in _imported_packages("rundir").items():
        assert packages <= {"data", "rewards"}, module
    for package in ("rewards", "data"):
        for module, packages in _imported_packages(package).items():
            assert "rundir" not in packages and "trainer" not in packages, module
    for module, packages in _imported_packages("cards").items():
        assert "trainer" not in packages, module
    for module, packages in _imported_packages("engine").items():  # engine sits below trainer
        assert "trainer" not in packages, module


def test_a_checkpoint_from_before_manifests_is_refused_until_recorded(tmp_path, capsys):
    """Issue 30, case 2: the way on for a stepNNN/ saved before checkpoints were hashed."""
    step = tmp_path / "step003"
    step.mkdir()
    (step / "model.safetensors").write_bytes(b"\0" * 64)
    with pytest.raises(StepError, match=r"manifest.json: missing .*--write-manifest"):
        verify_step(step)
    assert step_main([str(step)]) == 1 and "error: " in capsys.readouterr().err
    assert step_main(["--write-manifest", str(step)]) == 0
    verify_step(step)
    (step / "stray.bin").write_bytes(b"x")
    with pytest.raises(StepError, match=r"stray.bin: not listed in manifest.json"):
        verify_step(step)


def test_a_card_write_killed_mid_way_leaves_the_checkpoint_whole(tmp_path):
    """Found by tests/multinode (a kill right after state001/): the card is written into stepNNN/ after the
    checkpoint is installed, so its temp file is no part of the weights; any other stray file still is."""
    step = tmp_path / "step001"
    step.mkdir()
    (step / "model.safetensors").write_bytes(b"\0" * 64)
    step_main(["--write-manifest", str(step)])
    (step / ".README.md.tmp-4242-abcd1234").write_text("half a card")
    verify_step(step)
    (step / ".model.safetensors.tmp-4242-abcd1234").write_bytes(b"x")
    with pytest.raises(StepError, match=r"model.safetensors.tmp-4242-abcd1234: not listed in manifest.json"):
        verify_step(step)
