"""docs/experiment-qwen15/ (issue 62): the 1.5B base report recomputes from its committed rows, the registered rule
picks the committed cell, and the comparison with the 0.5B's cells in its README is what launch/base.py prints."""

import json
from pathlib import Path

import pytest

from launch.base import choose, compare_md, finished_accuracy
from launch.plan import load
from tests.test_qwen_experiment import recomputed_base_report

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs/experiment-qwen15"
PLAN = load(DOCS / "plan.yaml")


def test_the_base_report_recomputes_and_the_registered_rule_picks_its_cell():
    committed = recomputed_base_report(DOCS)
    assert PLAN.base_report.rule.pass_at_1 == (0.20, 0.70)  # issue 62's band, no amendment
    chosen = choose(committed["cells"], PLAN.base_report.rule)
    assert (chosen["temperature"], chosen["cap"], chosen["fallback"]) == (1.0, 384, False)
    assert {k: v for k, v in chosen.items() if k != "at_choice"} == {
        k: v for k, v in committed["choice"].items() if k not in ("at_choice", "snapshot_sha256")
    }
    k = chosen["at_choice"]
    assert (round(k["truncated"], 3), round(k["pass@1"], 3), round(k["gate_v1"], 2)) == (0.208, 0.382, 0.59)
    assert finished_accuracy(k) == "48.2%"


def test_the_readme_compares_the_cells_with_the_05bs_as_the_launcher_prints_them():
    reports = {
        name: json.loads((REPO / folder / "base/base_report.json").read_text())
        for name, folder in (
            ("Qwen2.5-Coder-0.5B", "docs/experiment-qwen"),
            ("Qwen2.5-Coder-1.5B", "docs/experiment-qwen15"),
        )
    }
    table = compare_md(reports)
    assert table in (DOCS / "README.md").read_text()
    assert "| 0.7 | 320 | **33.0% / 15.9% / 23.8% / 34%** |" in table  # the 0.5B's chosen cell
    assert "**20.8% / 38.2% / 48.2% / 59%** |" in table  # the 1.5B's: twice as often right when it finishes


def test_the_second_throughput_trial_starts_its_runs_as_the_experiment_would(tmp_path, monkeypatch):
    """plan-throughput2.yaml (issue 60's 1.5B lease figure): three runs sharing the GPU, each sized for 0.3 of it,
    with the experiment's extra evaluations; the trainer reads its command line back into those fields (a mapping
    field as JSON)."""
    from launch.plan import ROOT, load
    from launch.settings import argv, run_settings
    from trainer.train import parse

    math500 = tmp_path / "math500.jsonl"
    math500.write_text('{"problem": "1+1?", "answer": "2"}\n')
    plan = load(ROOT / "docs/experiment-qwen15/plan-throughput2.yaml")
    assert plan.budget["gpu_memory_share"] == 0.3 and plan.budget["parallel"] == 3 and plan.budget["mps"]
    assert not set(plan.seeds) & set(
        load(ROOT / "docs/experiment-qwen15/plan.yaml").seeds
    )  # never the experiment's
    settings = run_settings(plan, {}, tmp_path / "qwen15-S2-s910", "S2", 910, smoke=False, parallel=3)
    assert settings["gpu_memory_share"] == 0.3 and settings["eval_at_steps"] == [0, 10]
    cmd = argv(settings)
    assert cmd[cmd.index("--eval_set_files") + 1] == '{"math500": "artifacts/real/math500.jsonl"}'
    cmd[cmd.index("--eval_set_files") + 1] = json.dumps({"math500": str(math500)})  # where this test has one
    monkeypatch.chdir(tmp_path)
    args, _ = parse([*cmd[3:], "--use_cpu", "true"])  # the GPU recipe parsed on this CPU machine
    assert args.eval_set_files == {"math500": str(math500)} and args.extra_eval_steps == [0, 10]
    assert args.extra_evals == ["math500@384", "math500@1024", "heldout300@1152"] and args.deterministic


def test_amendment_2s_micro_batch_is_what_the_sizer_gave_every_trial_run_and_trains_the_same():
    """The given micro-batch (64 rows, checkpointing) is the one every run of the 1.5B trials recorded, and the
    trainer's settings after the batch arithmetic are those the sized micro-batch gave: given or sized, one run."""
    from engine.micro_batch import MicroBatch
    from rundir import archive
    from trainer.config import CapGRPOConfig
    from trainer.setup import batch_arithmetic

    folder = REPO / "docs/performance/h200-2026-12-05b"
    runs = archive.glob(str(folder / "*/qwen15-*"))
    assert len(runs) == 5  # throughput3's four and the run alone
    for run in runs:
        recorded = json.loads(archive.read_bytes(run / "run.json"))["launch"]["micro_batch"]
        assert (recorded["rows"], recorded["checkpointing"], recorded["basis"]) == (
            64,
            True,
            "memory: 15.6 GiB",
        )
    common = {
        "output_dir": "/tmp/x",
        "groups_per_step": 8,
        "num_generations": 8,
        "use_cpu": True,
        "bf16": False,
    }
    sized = CapGRPOConfig(**common)
    given = CapGRPOConfig(**common, per_device_train_batch_size=64, gradient_checkpointing=True)
    batch = MicroBatch(64, True, 566, "")
    assert (
        batch_arithmetic(given, batch, 1).to_json_string()
        == batch_arithmetic(sized, batch, 1).to_json_string()
    )


def test_the_final_training_design_is_what_the_trial_measured():
    """plan.yaml's training design, final since the lease figure (2026-12-05): 16 pairs and, by amendment 1, the
    rerun seeds 100-115, 30 deterministic steps, every extra evaluation read by a registered secondary at its cap, and the budget
    and run_args of plan-throughput3.yaml, whose rows gave the lease figure (its extra evaluations at its own last
    step); plan-throughput3 differs from the second trial only in seeds and budget, and PLAN.md states the figure
    as the trial's rows give it (tests/test_lease.py recomputes it)."""
    from launch.lease import figures

    trial = load(DOCS / "plan-throughput3.yaml")
    assert PLAN.status == "final" and PLAN.seeds[:16] == tuple(range(16)) and PLAN.steps == 30
    assert PLAN.seeds[16:] == tuple(
        range(100, 116)
    )  # amendment 1: the rerun seeds of deviation rule 4, listed
    assert (
        PLAN.primary["min_step"] == PLAN.steps
    )  # rule 4: a pair short of step 30 is left out, no fallback step
    gpu = PLAN.run_args["gpu"]
    assert gpu["deterministic"] and gpu["extra_eval_steps"] == [0, PLAN.steps]
    assert {f"{s['set']}@{s['cap']}" for s in PLAN.secondaries if "cap" in s} == set(gpu["extra_evals"])
    read = {f"{s['set']}@{s['cap']}" for s in PLAN.report if s["kind"] == "secondary" and "cap" in s}
    assert read == set(gpu["extra_evals"])
    assert PLAN.budget == trial.budget
    given = {"per_device_train_batch_size": 64, "gradient_checkpointing": True}  # amendment 2
    rest = {k: v for k, v in gpu.items() if k not in given}
    assert {k: gpu[k] for k in given} == given and {
        **rest,
        "extra_eval_steps": [0, trial.steps],
    } == trial.run_args["gpu"]
    second = load(DOCS / "plan-throughput2.yaml")
    assert {f for f in second.__dataclass_fields__ if getattr(second, f) != getattr(trial, f)} == {
        "path", "name", "seeds", "budget",
    }  # fmt: skip
    assert not set(trial.seeds) & (set(second.seeds) | set(PLAN.seeds))
    g = figures(REPO / "docs/performance/h200-2026-12-05b/throughput3")
    assert (
        f"**Lease figure: {g['lease_s_per_run_step']:.1f} s of lease a run-step**"
        in (DOCS / "PLAN.md").read_text()
    )


def test_the_readme_report_is_what_the_report_command_prints():
    from launch.report import report

    readme = (DOCS / "README.md").read_text()
    block = readme.split("<!-- report -->\n", 1)[1].split("<!-- /report -->", 1)[0]
    assert block == report(PLAN)


def test_every_training_run_ran_from_the_final_plan_or_later_and_skipped_no_update():
    """Issue 62's bars, from the committed rows: every run.json names a commit at or after the plan's last
    registered change (amendment 2, 5862de6), both runs of a pair ran on one GPU model, and no update was skipped
    for a non-finite gradient."""
    import subprocess

    import pytest

    from rundir import archive

    runs = archive.glob(str(DOCS / "launch*/qwen15-*"))
    assert len(runs) >= 2
    devices = {}
    for run in runs:
        meta = json.loads(archive.read_bytes(run / "run.json"))
        commit = meta["code"]["commit"]
        git = subprocess.run(["git", "merge-base", "--is-ancestor", "5862de6", commit], cwd=REPO)
        if git.returncode not in (0, 1):
            pytest.skip("no git history here to order the commits")
        assert git.returncode == 0, f"{run.name}: commit {commit} is before the plan's amendment 2"
        devices.setdefault(run.name.rsplit("-s", 1)[1], set()).add(meta["launch"]["device"])
        steps = [json.loads(line) for line in archive.read_bytes(run / "results/steps.jsonl").splitlines()]
        assert steps and not any(s["update_skipped"] for s in steps), run.name
    assert all(len(d) == 1 for d in devices.values())


# what computes a run's rows (amendment 4): a pair whose arms ran at two commits must show no change here between them
RUN_CODE = ["trainer", "engine", "rewards", "data", "bases", "launch/settings.py", "requirements.lock",
            "docs/experiment-qwen15/recipe.yaml", "docs/experiment-qwen15/plan.yaml"]  # fmt: skip


def pairs_parted_by_code(commits: dict[str, dict[str, str]]) -> list[str]:
    """The seeds (of {seed: {arm: commit}}) whose two arms ran at commits that differ in RUN_CODE."""
    import subprocess

    parted = []
    for seed, by_arm in sorted(commits.items()):
        first, *rest = sorted(set(by_arm.values()))
        for other in rest:
            diff = subprocess.run(["git", "diff", "--quiet", first, other, "--", *RUN_CODE], cwd=REPO)
            if diff.returncode not in (0, 1):
                raise RuntimeError(f"git diff {first} {other}: exit {diff.returncode}")
            parted += [seed] * diff.returncode
    return parted


def test_a_pair_spanning_two_leases_ran_the_same_run_code_in_both_arms():
    """Amendment 4: a pair's runs may run in two leases; the code that computes them must be the same. Checked on
    every committed pair, and shown to catch a pair whose arms straddle a change to the trainer."""
    import subprocess

    import pytest

    from rundir import archive

    commits: dict[str, dict[str, str]] = {}
    for run in archive.glob(str(DOCS / "launch*/qwen15-*")):
        arm, seed = run.name.removeprefix("qwen15-").split("-s")
        commits.setdefault(seed, {})[arm] = json.loads(archive.read_bytes(run / "run.json"))["code"]["commit"]
    if subprocess.run(["git", "cat-file", "-e", "5862de6"], cwd=REPO).returncode:
        pytest.skip("no git history here to compare the commits")
    assert pairs_parted_by_code(commits) == []
    # 742b176 (lease 1) and 974048d (lease 4): trainer/ changed between them, so such a pair would be refused
    assert pairs_parted_by_code({"x": {"S0": "742b176", "S2": "974048d"}}) == ["x"]
    assert pairs_parted_by_code({"y": {"S0": "17e43d3", "S2": "e7fbf72"}}) == []  # tools/carry.py only


def test_s2_s1_started_again_gave_its_crashed_attempts_rows_so_amendment_3_counts_it_resumed():
    """Amendment 3: S2-s1 ran out of memory during step 10 (lease 2) and was started again from its start; it is
    not a failure only if the new attempt's rows equal the crashed attempt's at every step that attempt wrote
    (every field but timings and memory) and both copied the same step-0 rows."""
    from rundir import archive
    from trainer.steps_log import MEASURED

    def rows(run, name):
        return [json.loads(x) for x in archive.read_bytes(run / "results" / name).splitlines()]

    crashed, again = DOCS / "launch2/crashed/qwen15-S2-s1", DOCS / "launch2/qwen15-S2-s1"
    before, after = rows(crashed, "steps.jsonl"), rows(again, "steps.jsonl")
    assert len(before) == 9 and len(after) == 30
    for b, a in zip(before, after, strict=False):
        assert {k: v for k, v in b.items() if k not in MEASURED} == {
            k: v for k, v in a.items() if k not in MEASURED
        }
    for name in ("eval_step000.jsonl", "eval_step000_cap1024.jsonl", "eval_step000_cap1152.jsonl"):
        assert archive.read_bytes(crashed / "results" / name) == archive.read_bytes(again / "results" / name)
    # it died before its first own evaluation
    assert not archive.exists(crashed / "results/eval_step010.jsonl")


def test_s0_s5s_crashed_attempt_wrote_no_step_so_its_second_is_its_start_again():
    """Lease 4: S0-s5's first attempt died at its first compile (the lease script's CC name), before any step row.
    By amendment 3 its start is its last state; with no step written there is no row to compare, only the step-0
    rows both attempts copied from launch1, and the run's settings, which must be the same run's."""
    from rundir import archive

    crashed, again = DOCS / "launch4/crashed/qwen15-S0-s5", DOCS / "launch4/qwen15-S0-s5"
    assert not archive.exists(crashed / "results/steps.jsonl")
    for name in ("eval_step000.jsonl", "eval_step000_cap1024.jsonl", "eval_step000_cap1152.jsonl"):
        assert archive.read_bytes(crashed / "results" / name) == archive.read_bytes(again / "results" / name)
        assert archive.read_bytes(again / "results" / name) == archive.read_bytes(
            DOCS / "launch1/qwen15-S0-s0/results" / name
        )
    first, second = (json.loads(archive.read_bytes(r / "run.json")) for r in (crashed, again))
    written_at_end = ("started", "best_step")  # the start time, and what a finished run adds
    assert {k: v for k, v in first.items() if k not in written_at_end} == {
        k: v for k, v in second.items() if k not in written_at_end
    }
    assert len(archive.read_bytes(again / "results/steps.jsonl").splitlines()) == 30


def test_the_figures_command_draws_the_pooled_pairs_of_every_lease(tmp_path):
    """`launch PLAN report --out DIR` without --results: analysis.compare's report and figures over the launches the
    plan's primary pools ("launch*"), as the README's figures were made."""
    from launch.__main__ import main

    assert main([str(DOCS / "plan.yaml"), "report", "--out", str(tmp_path)]) == 0
    folder = tmp_path / "S2_vs_S0"
    drawn = {p.name for p in folder.glob("*.png")}
    assert drawn >= {"accuracy.png", "unresolved_rates.png", "output_length.png", "lead_split.png"}
    text = (folder / "report.md").read_text()
    assert "| training seeds | 0" in text and "launch1/qwen15-S2-s0" in text  # seed 0's pair, the first


def test_the_readme_headline_numbers_recompute_from_the_rows():
    """The headline paragraph's numbers that the report block does not print: each arm's truncated share on the
    primary set at step 30, seed by seed, and the sign-flip power 16 pairs have at the tested seeds' SD."""
    import statistics

    from analysis.stats import sign_flip_power
    from launch.report import Launch, Run, launch_where

    lx = Launch(PLAN, launch_where(REPO / PLAN.results, "launch*"))
    seeds = lx.tested_seeds()
    headline = " ".join((DOCS / "README.md").read_text().split("\n\n")[1].split())  # as read, not as wrapped

    def listed(values: list[float], unit: str = "") -> str:
        cells = [f"{v:.1f}" for v in values]
        return ", ".join(cells[:-1]) + f" and {cells[-1]}{unit}"

    score = {arm: [Run(lx.dir(arm, s)).score(30, lx.set) for s in seeds] for arm in lx.arms}
    for arm in lx.arms:
        assert listed([100 * x.rate("truncated") for x in score[arm]], "%") in headline, arm
    diffs = [100 * (a.rate("correct") - b.rate("correct")) for a, b in zip(score["S2"], score["S0"])]
    sd = statistics.stdev(diffs)
    assert f"({sd:.1f} pp), 16 pairs give" in headline
    power = [round(100 * sign_flip_power(sd, effect, 16)) for effect in (3, 3.5, 4, 5)]
    assert (
        f"{power[0]}% power at +3 pp, {power[1]}% at +3.5, {power[2]}% at +4 and {power[3]}% at +5"
        in headline
    )


def test_the_leads_two_parts_add_up_to_each_seeds_lead():
    """launch.report.lead_parts (the lead_split section and its figure) splits each seed's primary lead: its
    either-unresolved and both-finished parts sum to the seed's S2 − S0 accuracy difference on heldout300."""
    from launch.report import Launch, Run, launch_where, lead_parts

    lx = Launch(PLAN, launch_where(REPO / PLAN.results, "launch*"))
    seeds, step, parts = lead_parts(lx)
    assert step == 30 and len(seeds) == 16
    for i, s in enumerate(seeds):
        a, b = (Run(lx.dir(arm, s)).score(step, lx.set) for arm in ("S2", "S0"))
        lead = 100 * (a.rate("correct") - b.rate("correct"))
        assert parts["either unresolved"][i] + parts["both finished"][i] == pytest.approx(lead), s
    assert sum(x > 0 for x in parts["either unresolved"]) == 14  # the README's "14 of 16 positive"
