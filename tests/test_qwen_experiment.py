"""docs/experiment-qwen/ (issue 45): every number of its README recomputes from the committed rows, through the
launcher's report stage and docs/experiment-qwen/plan.yaml."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from launch.base import at_cap, cell_tasks, choose
from launch.plan import LaunchError, load
from launch.report import launch_folders, report
from rundir.archive import folders, read_bytes
from rundir.files import read_jsonl

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs/experiment-qwen"
PLAN = load(DOCS / "plan.yaml")
AMENDMENT_1 = (
    "f07d47c25bc9bdacff3c0e07a66fe4ed4aee6bd9",
    "2026-12-04T05:39:01Z",
)  # git log -1 --format=%cI f07d47c


def test_the_readme_report_is_what_the_report_command_prints():
    readme = (DOCS / "README.md").read_text()
    block = readme.split("<!-- report -->\n", 1)[1].split("<!-- /report -->", 1)[0]
    assert block == report(PLAN)


def recomputed_base_report(docs: Path) -> dict:
    """A base stage's committed base_report.json, every cell's every cap checked against its rows (128 problems
    × 8 samples, from base/rows.tar.xz)."""
    committed = json.loads((docs / "base/base_report.json").read_text())
    for cell in committed["cells"]:
        name = f"base_rows_{cell_tasks(cell)}_{cell['model']}_{cell['prompt']}_T{cell['temperature']}.jsonl"
        rows = read_jsonl(docs / "base" / name)
        assert len(rows) == 128 * 8 and [at_cap(rows, k["cap"]) for k in cell["caps"]] == cell["caps"]
    return committed


def test_the_base_report_recomputes_and_only_amendment_1_makes_a_cell_eligible():
    committed = recomputed_base_report(DOCS)
    chosen = choose(committed["cells"], PLAN.base_report.rule)
    assert {k: v for k, v in chosen.items() if k != "at_choice"} | {"snapshot_sha256": committed["choice"]["snapshot_sha256"]} == {
        k: v for k, v in committed["choice"].items() if k != "at_choice"}  # fmt: skip
    assert (chosen["temperature"], chosen["cap"]) == (0.7, 320)
    registered = replace(PLAN.base_report.rule, pass_at_1=(0.20, 0.70))  # the rule as committed at 3e19d9b
    with pytest.raises(LaunchError, match="no candidate cell meets the plan's rule"):
        choose(committed["cells"], registered)


def _runs() -> list[Path]:
    launch = DOCS / "launch1"  # a run whose files are all packed exists only in rows.tar.xz
    return sorted(f for f in folders(launch) if f.parent == launch and f.name.startswith("qwen05-"))


def test_every_run_ran_from_amendment_1s_commit_and_started_after_it():
    assert len(_runs()) == 9  # seeds 0-3 of both arms and S0-s4; the rest never started
    for run in _runs():
        info = json.loads(read_bytes(run / "run.json"))  # from launch1/rows.tar.xz
        assert info["code"]["commit"] == AMENDMENT_1[0] and info["started"] > AMENDMENT_1[1], run


def test_the_readme_counts_of_skipped_updates_and_the_gpu_replay():
    rows = {run.name: read_jsonl(run / "results/steps.jsonl") for run in _runs()}
    arm = lambda a: [r for name, rs in rows.items() if f"-{a}-" in name for r in rs]  # noqa: E731
    assert [(len(arm(a)), sum(bool(r.get("update_skipped")) for r in arm(a))) for a in ("S0", "S2")] == [
        (96, 5),
        (76, 5),
    ]
    readme = (DOCS / "README.md").read_text()
    assert "10 of 172 steps (S0 5 of 96, S2 5 of 76)" in readme
    identical, moved = [], []
    for name in ("qwen05-S2-s0", "qwen05-S2-s1"):
        for step in (15, 20):
            run = DOCS / "launch1" / name / "results"
            old, new = (
                {
                    (r["set"], r["task_id"], r["sample"]): r
                    for r in read_jsonl(p / f"eval_step{step:03d}.jsonl")
                }
                for p in (run / "superseded", run)
            )
            identical.append(sum(old[k]["completion"] == new[k]["completion"] for k in old))
            acc = [
                sum(d[k]["outcome"] == "correct" for k in d if k[0] == "heldout300") / 3 for d in (old, new)
            ]
            moved.append(round(acc[1] - acc[0], 1))
    assert identical == [282, 51, 182, 15] and moved == [2.0, 2.3, -2.0, -1.3]
    assert "282 and 182 of 556 samples at step 15 and for 51 and 15 at\nstep 20" in readme


def test_the_lead_split_and_finished_accuracy_recompute_issue_62s_outside_figures():
    """Issue 62 quotes an outside recomputation of launch 1 at step 20: the lead from pairs where either arm was
    unresolved +3.3, +4.0, +0.7 pp, where both finished +6.7, −5.3, −9.0 pp; S2's accuracy among finished answers
    26.1% → 21.9% while S0's stayed at 26.1%. The launcher's sections give the same from the committed rows."""
    from launch.plan import ROOT, load
    from launch.report import Launch, finished_accuracy, lead_split

    plan = load(ROOT / "docs/experiment-qwen/plan.yaml")
    lx = Launch(plan, ROOT / plan.results / "launch1")
    split = lead_split(lx)
    assert "| either unresolved | +3.3, +4.0, +0.7 | +2.7 |" in split
    assert "| both finished | +6.7, -5.3, -9.0 | -2.6 |" in split
    table = finished_accuracy(lx).splitlines()
    assert table[2].startswith("| 0 | 26.1 / 26.1 |") and table[-1].startswith("| 20 | 26.1 / 21.9 |")


def test_pairs_on_several_gpu_models_get_a_sensitivity_line_each_and_the_status_names_their_gpu(tmp_path):
    """Issue 62's amendment 2: a lease may run on another GPU model. The primary pools every pair; where the tested
    pairs ran on several models (run.json `launch.device`), the primary on each model's pairs alone (two pairs or
    more) follows it as a sensitivity line, and the status table names each run's GPU. Launch 1 of the 0.5B, its
    seeds 0 and 1 marked as run on an H200 and seed 2 on an H100."""
    from launch.report import section
    from rundir.archive import unpack

    whole = unpack(DOCS / "launch1", tmp_path / "whole")
    before = section(PLAN, whole, {"kind": "primary"})
    assert "GPU" not in section(
        PLAN, whole, {"kind": "launch_status"}
    )  # launches before amendment 2 record none
    for run in whole.glob("qwen05-*-s*/run.json"):
        info = json.loads(run.read_text())
        info["launch"]["device"] = (
            "NVIDIA H100 80GB HBM3" if run.parent.name.endswith("-s2") else "NVIDIA H200"
        )
        run.write_text(json.dumps(info))
    primary = section(PLAN, whole, {"kind": "primary"})
    assert (
        primary.startswith(before) and primary.count("### Sensitivity") == before.count("### Sensitivity") + 1
    )
    assert (
        "### Sensitivity, the pairs on NVIDIA H200 alone: S2 − S0, heldout300, step 20, PLAN.md's deviation step, seeds 0, 1\n"
        in primary
    )
    status = section(PLAN, whole, {"kind": "launch_status"})
    assert "| evaluated at steps | GPU |" in status and status.count("| NVIDIA H100 80GB HBM3 |") == 2


def test_pooled_launch_folders_come_in_lease_order_launch10_after_launch9(tmp_path):
    for name in ("launch1", "launch10", "launch2", "launch9"):
        (tmp_path / name).mkdir()
    (tmp_path / "launch1.txt").write_text("")  # a file, not a launch folder
    names = [f.name for f in launch_folders(tmp_path, "launch*")]
    assert names == ["launch1", "launch2", "launch9", "launch10"]


def test_a_pooled_report_over_several_launch_folders_reads_as_one_and_refuses_a_run_in_two(tmp_path):
    """Issue 62's pairs come from several leases, one launch folder each (docs/experiment-qwen15/PLAN.md): a section
    whose `launch` is a pattern pools the matching folders. Launch 1 of the 0.5B split by seed into two folders gives
    the same primary and decomposition as launch 1 whole; a run found in two folders is refused by name."""
    import shutil

    from launch.report import section
    from rundir.archive import unpack

    whole = unpack(DOCS / "launch1", tmp_path / "whole")
    pooled = tmp_path / "pooled"
    for run in sorted(whole.glob("qwen05-*-s*")):
        if run.is_dir():
            lease = "launch1" if int(run.name.rsplit("-s", 1)[1]) < 2 else "launch2"
            shutil.copytree(run, pooled / lease / run.name)
    for spec in ({"kind": "primary"}, {"kind": "decomposition"}, {"kind": "lead_split"}):
        assert section(PLAN, pooled, {**spec, "launch": "launch*"}) == section(PLAN, whole, dict(spec))
    shutil.copytree(pooled / "launch1/qwen05-S0-s0", pooled / "launch2/qwen05-S0-s0")
    with pytest.raises(
        LaunchError, match="qwen05-S0-s0: in .*launch1 and .*launch2; a run belongs to one launch"
    ):
        section(PLAN, pooled, {"kind": "primary", "launch": "launch*"})
    lease = section(PLAN, DOCS, {"kind": "lease", "launches": "launch*"})  # every lease's row, in lease order
    assert lease == section(PLAN, DOCS, {"kind": "lease", "launches": ["launch1", "launch2"]})
    with pytest.raises(LaunchError, match="no launch folder matches 'lease\\*'"):
        section(PLAN, pooled, {"kind": "primary", "launch": "lease*"})
