"""`make experiment` (trainer.experiment): which runs it launches, which comparisons, and when it stops."""

import subprocess

import pytest

from trainer import experiment


class FakeProc:
    def __init__(self, cmd, returncode=0):
        self.cmd, self.returncode = cmd, returncode

    def poll(self):
        return self.returncode

    def terminate(self):
        pass


@pytest.fixture
def launched(monkeypatch):
    """Record every training launch and comparison instead of running them; `fail` names runs that fail."""
    calls = {"train": [], "compare": [], "fail": set()}

    def popen(cmd, **_):
        calls["train"].append(cmd)
        out = cmd[cmd.index("--output_dir") + 1]
        return FakeProc(cmd, 1 if any(out.endswith(f) for f in calls["fail"]) else 0)

    def run(cmd, **_):
        calls["compare"].append(cmd)
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(experiment.subprocess, "Popen", popen)
    monkeypatch.setattr(experiment.subprocess, "run", run)
    monkeypatch.setattr(experiment.time, "sleep", lambda _: None)
    return calls


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_every_arm_and_seed_is_one_run_of_the_same_recipe(launched, tmp_path):
    rc = experiment.main(
        [
            "--arms",
            "S0,S2,DAPO-SOFT",
            "--seeds",
            "0,1",
            "--runs",
            str(tmp_path / "r"),
            "--out",
            str(tmp_path / "c"),
        ]
        + ["--", "--max_steps", "3"]
    )
    assert rc == 0
    runs = [(flag(c, "--arm"), flag(c, "--output_dir"), flag(c, "--seed")) for c in launched["train"]]
    r = tmp_path / "r"
    assert runs == [
        (arm, str(r / f"{arm}-s{seed}"), str(seed)) for arm in ("S0", "S2", "DAPO-SOFT") for seed in (0, 1)
    ]
    assert {flag(c, "--config") for c in launched["train"]} == {"configs/embedded.yaml"}
    assert all(c[-2:] == ["--max_steps", "3"] for c in launched["train"])  # extra arguments reach every run
    # every arm but the control is compared with the control, all seeds at once
    assert [(c[3], c[4], flag(c, "--out")) for c in launched["compare"]] == [
        (f"{r}/{arm}-s0,{r}/{arm}-s1", f"{r}/S0-s0,{r}/S0-s1", str(tmp_path / "c" / f"{arm}_vs_S0"))
        for arm in ("S2", "DAPO-SOFT")
    ]


def test_one_seed_runs_are_named_by_arm(launched, tmp_path):
    assert experiment.main(["--arms", "S0,S2", "--runs", str(tmp_path)]) == 0
    assert [flag(c, "--output_dir") for c in launched["train"]] == [
        str(tmp_path / "S0"),
        str(tmp_path / "S2"),
    ]
    assert not any("--seed" in c for c in launched["train"])


def test_parallel_runs_train_on_one_thread_each_unless_the_arguments_say_otherwise(launched, tmp_path):
    """The embedded recipe's two-thread training pass is for a run alone on the cores (configs/embedded.yaml)."""
    assert experiment.main(["--arms", "S0,S2", "--runs", str(tmp_path / "a"), "--jobs", "2"]) == 0
    assert [flag(c, "--cpu_threads") for c in launched["train"]] == ["1", "1"]
    argv = ["--arms", "S0,S2", "--runs", str(tmp_path / "b"), "--jobs", "2", "--", "--cpu_threads", "2"]
    assert experiment.main(argv) == 0
    assert all(c[-2:] == ["--cpu_threads", "2"] for c in launched["train"][2:])  # the last one given wins
    launched["train"].clear()
    assert experiment.main(["--arms", "S0,S2", "--runs", str(tmp_path / "c"), "--jobs", "1"]) == 0
    assert not any("--cpu_threads" in c for c in launched["train"])  # one at a time: the recipe's


def test_a_failed_run_stops_the_experiment_before_any_comparison(launched, tmp_path, capsys):
    launched["fail"].add("S2")
    assert experiment.main(["--arms", "S0,S2", "--runs", str(tmp_path), "--jobs", "1"]) == 1
    assert "error: training S2 failed (exit 1); see" in capsys.readouterr().err
    assert launched["compare"] == []


def test_a_non_empty_run_directory_is_refused_before_anything_starts(launched, tmp_path, capsys):
    (tmp_path / "S2").mkdir()
    (tmp_path / "S2" / "run.json").write_text("{}")
    assert experiment.main(["--arms", "S0,S2", "--runs", str(tmp_path)]) == 1
    assert f"error: {tmp_path / 'S2'} is not empty" in capsys.readouterr().err
    assert launched["train"] == [] and (tmp_path / "S2" / "run.json").read_text() == "{}"


def test_a_control_alone_is_not_an_experiment(launched, tmp_path):
    with pytest.raises(SystemExit):
        experiment.main(["--arms", "S0", "--runs", str(tmp_path)])


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--arms", "S0,S2,S0"], "--arms: S0 appears twice"),
        (["--seeds", "0,1,0"], "--seeds: 0 appears twice"),
        (["--seeds", "0,x"], "--seeds: 'x' is not a whole number"),
    ],
    ids=["arms", "seeds", "not-a-seed"],
)
def test_arms_or_seeds_that_repeat_are_refused_before_anything_starts(argv, says, launched, tmp_path, capsys):
    """Issue 61, class 5: a repeated seed started its run twice."""
    runs = tmp_path / "runs"
    assert experiment.main(["--arms", "S0,S2", *argv, "--runs", str(runs)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {says}"], err
    assert launched["train"] == [] and not runs.exists()
