"""`make experiment`: the embedded seeds6 experiment (docs/experiment-embedded/seeds6/plan.yaml) through the launcher,
on the CPU: which runs it starts with which settings, how many at a time, and what it refuses or reports as failed.
Its report recomputing byte for byte is tests/test_published_rows.py's."""

import io
import json
import tarfile

import pytest

import launch.runs as runs
from launch.__main__ import main as launch_main
from launch.plan import ROOT, LaunchError, PlanError, load
from launch.settings import run_settings

PLAN = ROOT / "docs/experiment-embedded/seeds6/plan.yaml"


class Proc:
    """A trainer process that runs for `polls` polls, then exits with `code`."""

    def __init__(self, cmd, polls, code):
        self.cmd, self.left, self.code, self.returncode, self.pid = cmd, polls, code, None, 1

    def poll(self):
        if self.left > 0:
            self.left -= 1
            return None
        self.returncode = self.code
        return self.code

    def wait(self):
        self.left = 0
        return self.poll()


@pytest.fixture
def started(monkeypatch):
    """The trainer processes `train` starts, recorded instead of run; `fail` names runs that exit 1."""
    calls = {"procs": [], "fail": set(), "alive_at_start": [], "env": []}

    def popen(cmd, env=None, **_):
        calls["alive_at_start"].append(sum(p.left > 0 for p in calls["procs"]))
        calls["env"].append(env)
        out = cmd[cmd.index("--output_dir") + 1]
        p = Proc(cmd, 3, 1 if any(out.endswith(f) for f in calls["fail"]) else 0)
        calls["procs"].append(p)
        return p

    monkeypatch.setattr(runs.subprocess, "Popen", popen)
    monkeypatch.setattr(runs.time, "sleep", lambda _: None)
    monkeypatch.setattr("launch.gpus.visible_gpus", lambda: pytest.fail("a CPU plan asks nvidia-smi nothing"))
    return calls


def flag(cmd, name):
    return cmd[cmd.index(name) + 1]


def test_every_arm_and_seed_is_one_run_two_at_a_time_on_the_cpu(started, tmp_path):
    work = tmp_path / "w"
    assert launch_main([str(PLAN), "train", "--work", str(work), "--out", str(tmp_path / "o")]) == 0
    cmds = [p.cmd for p in started["procs"]]
    # a seed's pair together, seed-major; every run from the recipe
    assert [(flag(c, "--arm"), flag(c, "--seed"), flag(c, "--output_dir")) for c in cmds] == [
        (arm, str(s), str(work / f"runs/{arm}-s{s}")) for s in range(6) for arm in ("S0", "S2")]  # fmt: skip
    assert {flag(c, "--config") for c in cmds} == {str(ROOT / "configs/embedded.yaml")}
    assert max(started["alive_at_start"]) == 1  # never more than two at a time, and no leader alone
    assert started["alive_at_start"][1] == 1
    assert not any("CUDA_VISIBLE_DEVICES" in (env or {}) for env in started["env"])


def test_the_settings_are_the_ones_the_published_runs_recorded(tmp_path):
    """Every field the plan and launcher set is what seeds6's run.json files recorded (PLAN.md's command:
    `--max_steps 10`, two jobs on one thread each; the recipe's eval_every 5)."""
    plan = load(PLAN)
    with tarfile.open(ROOT / "docs/experiment-embedded/seeds6/rows.tar.xz") as tar:
        for arm in plan.arms:
            for name, seed in plan.runs(arm):
                recorded = json.load(io.BytesIO(tar.extractfile(f"runs/{name}/run.json").read()))["config"]
                s = run_settings(plan, {}, tmp_path / name, arm, seed, smoke=False, parallel=2)
                assert s.pop("config") == str(ROOT / "configs/embedded.yaml")
                assert s.pop("output_dir") == str(tmp_path / name)
                assert s == {k: recorded[k] for k in s} == {"arm": arm, "seed": seed, "max_steps": 10,
                                                            "eval_every": 5, "cpu_threads": 1}  # fmt: skip
    alone = run_settings(plan, {}, tmp_path / "S0-s0", "S0", 0, smoke=False, parallel=1)
    assert "cpu_threads" not in alone  # one at a time: the recipe's two threads


def test_a_failed_run_is_named_with_its_log(started, tmp_path, capsys):
    started["fail"].add("S2-s1")
    work = tmp_path / "w"
    assert launch_main([str(PLAN), "train", "--work", str(work), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: training S2-s1 failed (exit 1; see {work / 'runs/S2-s1.log'})"]


def test_a_non_empty_run_folder_that_is_no_run_is_refused_before_anything_starts(started, tmp_path, capsys):
    work = tmp_path / "w"
    (work / "runs/S2-s3").mkdir(parents=True)
    (work / "runs/S2-s3/notes.txt").write_text("mine")
    assert launch_main([str(PLAN), "train", "--work", str(work), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {work / 'runs/S2-s3'}: not empty and no run to resume")
    assert started["procs"] == [] and (work / "runs/S2-s3/notes.txt").read_text() == "mine"


@pytest.mark.parametrize(
    "edit, says",
    [(lambda r: r.update(arms=["S0", "S2", "S0"]), "arms: 'S0' appears twice"),
     (lambda r: r.update(seeds=[0, 1, 0]), "seeds: 0 appears twice"),
     (lambda r: r.update(seeds=[0, "x"]), "seeds: 'x' is not a whole number")],
    ids=["arms", "seeds", "not-a-seed"],
)  # fmt: skip
def test_arms_or_seeds_that_repeat_are_refused_before_anything_starts(edit, says, started, tmp_path, capsys):
    """Issue 61, class 5: a repeated seed started its run twice."""
    import yaml

    raw = yaml.safe_load(PLAN.read_text())
    edit(raw)
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(PlanError, match=f"{path}: {says}"):
        load(path)
    work = tmp_path / "w"
    assert launch_main([str(path), "train", "--work", str(work), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {path}: {says}"]
    assert started["procs"] == [] and not work.exists()


def train_argv(tmp_path, *extra):
    """`python -m launch <embedded plan> train` into tmp_path's w/ and o/, with `extra` options."""
    return [str(PLAN), "train", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o"), *extra]


def test_train_runs_only_the_arms_asked_and_refuses_an_arm_not_in_the_plan(started, tmp_path, capsys):
    argv = train_argv(tmp_path, "--seeds", "3", "--arms", "S2")
    assert launch_main(argv) == 0
    assert [(flag(c, "--arm"), flag(c, "--seed")) for c in (p.cmd for p in started["procs"])] == [("S2", "3")]
    assert launch_main([*argv[:-1], "S1"]) == 1
    assert (
        capsys.readouterr().err.strip().splitlines()[-1]
        == f"error: --arms S1: not among {PLAN}'s arms S0, S2"
    )


def test_every_new_run_copies_an_earlier_leases_step0_rows_when_given_and_a_missing_file_is_refused(
    started, tmp_path, capsys
):
    rows = tmp_path / "lease1/S0-s0/results/eval_step000.jsonl"
    work = tmp_path / "w"
    argv = train_argv(tmp_path, "--seeds", "1,2", "--step0-from", str(rows))
    assert launch_main(argv) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --step0-from {rows}: no such file (an earlier run's results/eval_step000.jsonl)"
    ]
    assert started["procs"] == [] and not work.exists()
    rows.parent.mkdir(parents=True)
    rows.write_text("")  # each trainer checks the rows against its own run (trainer/eval_callback.py)
    assert launch_main(argv) == 0
    cmds = [p.cmd for p in started["procs"]]
    assert len(cmds) == 4 and {flag(c, "--step0_eval_from") for c in cmds} == {str(rows)}


def test_train_raises_and_never_exits(started, tmp_path):
    with pytest.raises(LaunchError, match="--seeds \\[7\\]: not among"):
        runs.train(load(PLAN), tmp_path / "w", tmp_path / "o", smoke=False, seeds=[7])


def test_the_trainer_reads_the_command_line_as_the_settings(tmp_path):
    from launch.settings import argv
    from trainer.train import parse

    settings = run_settings(load(PLAN), {}, tmp_path / "S2-s3", "S2", 3, smoke=False, parallel=2)
    args, model = parse(argv(settings)[3:])
    assert {k: getattr(args, k) for k in ("arm", "seed", "max_steps", "eval_every", "cpu_threads")} == {
        "arm": "S2", "seed": 3, "max_steps": 10, "eval_every": 5, "cpu_threads": 1}  # fmt: skip
    assert args.output_dir == str(tmp_path / "S2-s3") and model.model_name_or_path == "embedded/base"


def test_a_run_written_before_the_setup_redesign_passes_todays_resume_comparison(tmp_path):
    """Issue 63: run.json's `config` still records the settings the trainer ran with, so a seeds6 run (written at
    an older commit, by the old config that decided in __post_init__) compares equal field by field with what
    today's setup decides from the same command line: its resume is accepted (no state here: it restarts)."""
    from launch.settings import argv
    from policy.arms import resolve_arm
    from trainer import setup
    from trainer.train import parse

    run = tmp_path / "S2-s0"
    run.mkdir()
    with tarfile.open(ROOT / "docs/experiment-embedded/seeds6/rows.tar.xz") as tar:
        info = json.load(io.BytesIO(tar.extractfile("runs/S2-s0/run.json").read()))
    (run / "run.json").write_text(json.dumps(info))
    settings = run_settings(load(PLAN), {}, run, "S2", 0, smoke=False, parallel=2)
    args, model_args = parse([*argv(settings)[3:], "--resume", str(run)])
    args = setup.settled(args, resolve_arm("S2"), world=1)
    resume, recorded = setup.check_resume(run, args, model_args, resolve_arm("S2"), 1, info["snapshot"], [])
    assert recorded is not None and recorded.to_json().items() >= info["launch"]["micro_batch"].items()
    assert resume.state is None and resume.event["changed"] == {}


@pytest.mark.slow
def test_make_experiment_writes_the_comparison_of_its_fresh_runs(tmp_path):
    """`make experiment`'s report stage with --out: analysis.compare's report and figures of the runs it trained,
    as trainer/experiment.py left them. On seeds6's committed runs it is the published S2_vs_S0/report.md, but for
    the folder the runs are named in."""
    from launch.report import write_comparison
    from rundir import archive

    seeds6 = archive.unpack(ROOT / "docs/experiment-embedded/seeds6", tmp_path / "seeds6")
    folder = write_comparison(load(PLAN), seeds6 / "runs", tmp_path / "out")
    assert folder == tmp_path / "out/S2_vs_S0" and (folder / "accuracy.png").is_file()
    text = (folder / "report.md").read_text().replace(str((seeds6 / "runs").resolve()), "/tmp/emb6/runs")
    assert text == (ROOT / "docs/experiment-embedded/seeds6/S2_vs_S0/report.md").read_text()
