"""Issue 60: what a lease bought (launch/lease.py) recomputed from committed rows, and the launcher's levers that
need no GPU to check: evaluation at the plan's steps, the step-0 rows shared by a launch's runs (checked before
they are copied), the last save skipped where the launcher drops it, runs at a time from the leader's first row,
and a train stage that outlives its caller (`--detach`, `watch`, `pack`)."""

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from launch.__main__ import main as launch_main
from launch.gpus import fitting, row_memory
from launch.lease import figures, table
from launch.plan import LaunchError, load
from launch.settings import eval_settings
from launch.watch import launcher_pid
from rundir.run_json import RunDirError
from trainer.eval_callback import EvalCallback, shared_step0_rows
from trainer.evaluation import EvalSpec, sample_seed

ROOT = Path(__file__).resolve().parent.parent
QWEN = ROOT / "docs/experiment-qwen"


def test_launch_1s_lease_figure_recomputes_from_its_rows():
    g = figures(QWEN / "launch1")
    assert (g["lease_s"], g["run_steps"], g["runs"]) == (1227, 172, 9)  # the 7.1 s a run-step
    assert round(g["lease_s_per_run_step"], 2) == 7.13 and round(g["sampled_per_trained_group"], 2) == 3.71
    assert g["runs_going_median"] is None  # launch 1 kept no timeline


def test_launch_2s_lease_figure_and_timeline_recompute_from_its_rows():
    g = figures(QWEN / "launch2")
    assert (g["lease_s"], g["run_steps"], g["runs"]) == (909.3, 133, 6)
    assert round(g["lease_s_per_run_step"], 2) == 6.84 and round(g["sampled_per_trained_group"], 2) == 3.61
    assert (g["runs_going_median"], g["runs_going_max"]) == (4, 4)  # the leader's memory x 1.6: 4 at a time
    steps_seen = sum(c.get("run_steps", 0) for c in g["per_call"])
    assert 0.85 * g["run_steps"] < steps_seen <= g["run_steps"]  # the rest came in the seconds between calls
    assert g["calls"] == 42 and "| launch2 | 42 | 909 | 133 | **6.84** |" in table(
        {"launch2": QWEN / "launch2"}
    )


# Issue 62's pairs leases, all on H100s (one 1.5B run at a time there, amendment 2), step 0 copied from launch1 after
# it: (folder, lease s, run-steps, runs, calls, lease s per run-step, runs going median and max, sampled groups per
# trained group).
Q15_LEASES = [
    ("launch1", 1383, 60, 2, 29, 23.05, 1, 1, 3.10),  # seed 0's pair
    # seed 1's pair; S2-s1 started again after it ran out of memory (its crashed attempt's 9 rows cost lease time and
    # add no run-step), and seed 2's two 1-step runs: two at a time until the memory ran out
    # (lease s: the budget it charged; the device tool's held_s, 1,391.2, counted three refused starts too)
    ("launch2", 1123, 62, 4, 32, 18.11, 1, 2, 2.74),
    # seeds 3 and 4; seed 5's pair did not fit, so it has no row
    ("launch3", 1659.6, 120, 4, 30, 13.83, 1, 1, 2.37),
    # seed 5: S0-s5's first attempt crashed at its first compile (next-lease.sh had named a file CC, which the image
    # exports) and has no step row, so it adds no run-step; one pair, not two
    ("launch4", 1445.1, 60, 2, 33, 24.08, 1, 1, 3.00),
    # seed 6, lease 4's compile caches carried; seeds 7 and 8 did not fit
    ("launch5", 1096.1, 60, 2, 30, 18.27, 1, 1, 2.93),
    # seed 7's pair and S0-s8 (amendment 4: a run, not a pair; S2-s8 did not fit), no compile caches carried
    ("launch6", 1372.8, 90, 3, 31, 15.25, 1, 1, 2.69),
    # S2-s8 (its partner ran in lease 6), seed 9's pair and S0-s10; no compile caches (the call carrying them was over
    # 64 MiB and refused)
    ("launch7", 1683.3, 120, 4, 31, 14.03, 1, 1, 2.65),
    # S2-s10 (its partner ran in lease 7) and S0-s11, lease 7's compile caches carried; nine calls of parts refused
    # unsent and a start call again (the launcher refused the embedded base's archive, moved out to fit the parts)
    ("launch8", 991, 60, 2, 42, 16.52, 1, 1, 2.77),
    # S2-s11 (its partner ran in lease 8), seed 12's pair and S0-s13, from cf9d495 (S0-s11's run code), lease 8's compile
    # caches carried; nothing refused, nothing crashed
    ("launch9", 1522, 120, 4, 34, 12.68, 1, 1, 2.37),
    # S2-s13 (its partner ran in lease 9), seed 14's pair and S0-s15, from 2bd00db (S0-s13's run code), lease 9's
    # compile caches carried; nothing refused, nothing crashed
    ("launch10", 1693, 120, 4, 34, 14.11, 1, 1, 2.58),
    # S2-s15 alone (its partner ran in lease 10), from b072551 (S0-s15's run code), lease 10's compile caches carried;
    # the first launcher started nothing (its first-run check, 574 s left against 596), a second by hand ran it
    ("launch11", 779, 30, 1, 36, 25.97, 1, 1, 2.13),
    # seed 100's pair (rule 4's rerun of seed 2), from main at ac76781, lease 11's compile caches in a call of their
    # own; nothing refused, nothing crashed
    ("launch12", 1099, 60, 2, 36, 18.32, 1, 1, 3.23),
]


@pytest.mark.parametrize(
    "launch, lease_s, run_steps, runs, calls, per_run_step, median, most, sampled", Q15_LEASES
)
def test_the_15b_experiments_lease_figures_recompute_from_their_rows(
    launch, lease_s, run_steps, runs, calls, per_run_step, median, most, sampled
):
    """Each pairs lease's figure from its lease.json and rows, and the same row in PERFORMANCE.md's table."""
    g = figures(QWEN.parent / "experiment-qwen15" / launch)
    assert (g["lease_s"], g["run_steps"], g["runs"], g["calls"]) == (lease_s, run_steps, runs, calls)
    assert round(g["lease_s_per_run_step"], 2) == per_run_step
    assert round(g["sampled_per_trained_group"], 2) == sampled
    assert (g["runs_going_median"], g["runs_going_max"]) == (median, most)
    row = table({f"1.5B {launch} (H100)": QWEN.parent / "experiment-qwen15" / launch}).splitlines()[-1]
    assert row in (ROOT / "docs/PERFORMANCE.md").read_text()


# What compilers, linkers and loaders read from the environment: a lease script's own variable must not take one of
# these names, since a name the image exports stays exported when a script assigns it (lease 4: CC=<a .tar.gz> became
# the C compiler of every Triton build the detached launcher's runs made).
TOOLCHAIN = {"CC", "CXX", "CPP", "LD", "AR", "AS", "NM", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH",
             "LIBRARY_PATH", "LD_LIBRARY_PATH", "LD_PRELOAD", "PATH", "HOME", "TMPDIR", "CUDA_HOME", "CUDA_PATH"}  # fmt: skip


def toolchain_assignments(script: str) -> list[str]:
    """Lines that assign a toolchain name without exporting it on purpose (`export NAME=` is a deliberate choice)."""
    found = []
    for line in script.splitlines():
        code = line.split("#", 1)[0]
        if re.match(r"\s*export\b", code):
            continue
        found += [f"{name}: {line.strip()}" for name in re.findall(r"(?:^|[\s;&|(])([A-Z_][A-Z0-9_]*)=", code)
                  if name in TOOLCHAIN]  # fmt: skip
    return found


def test_no_lease_script_takes_a_name_the_toolchain_reads_from_the_environment():
    lease4 = "  CC=.carry/caches/x.tar.gz\n"  # next-lease.sh's line at 974048d
    assert toolchain_assignments(lease4) == ["CC: CC=.carry/caches/x.tar.gz"]
    assert toolchain_assignments("export CC=gcc\nCACHE_FILE=x  # CC=y\n") == []
    listed = subprocess.run(["git", "ls-files", "*.sh"], cwd=ROOT, capture_output=True, text=True)
    assert "docs/experiment-qwen15/next-lease.sh" in listed.stdout.split()
    for name in listed.stdout.split():
        assert toolchain_assignments((ROOT / name).read_text()) == [], name


def test_the_launch2_plan_differs_from_launch_1s_only_where_amendment_4_says():
    one, two = load(QWEN / "plan.yaml"), load(QWEN / "plan-launch2.yaml")
    differ = {f for f in one.__dataclass_fields__ if getattr(one, f) != getattr(two, f)}
    assert differ == {"path", "name", "seeds", "eval", "budget", "run_args", "report"}
    assert not set(one.seeds) & set(two.seeds) and two.eval["sets"] == one.eval["sets"]
    assert two.run_args["gpu"] == {**one.run_args["gpu"], "deterministic": True}


def test_the_launch3_plan_is_launch_1s_experiment_with_new_seeds_at_launch_2s_pace():
    """Issue 60's first bar: launch 1's plan (not deterministic), new seeds, launch 2's levers (MPS, detached runs,
    step 0 shared, the report's steps), runs at a time by 1.3x the leader's first-step memory."""
    one, two, three = (load(QWEN / f) for f in ("plan.yaml", "plan-launch2.yaml", "plan-launch3.yaml"))
    x8 = load(QWEN / "plan-x8.yaml")
    differ = {f for f in one.__dataclass_fields__ if getattr(one, f) != getattr(three, f)}
    assert differ == {"path", "name", "seeds", "eval", "budget", "report"}
    assert not set(three.seeds) & (set(one.seeds) | set(two.seeds) | set(x8.seeds))
    assert three.eval == two.eval and three.run_args == one.run_args
    assert {k: three.budget[k] for k in ("mps", "share_step0", "memory_growth")} == {
        "mps": True, "share_step0": True, "memory_growth": 1.3,
    }  # fmt: skip


def test_the_trainer_evaluates_at_the_plans_steps_alone():
    plan = load(QWEN / "plan-launch2.yaml")
    assert eval_settings(plan, 30) == {"eval_every": 1, "eval_at_steps": [0, 10, 20, 30]}
    assert eval_settings(load(QWEN / "plan.yaml"), 30) == {"eval_every": 5}
    cb = EvalCallback("/nowhere", {}, EvalSpec(), 1, None, eval_steps=(0, 10, 20, 30))
    assert [s for s in range(31) if cb.due(s, 30)] == [0, 10, 20, 30]
    assert [s for s in range(8) if cb.due(s, 7)] == [0, 7]  # the last step always
    every = EvalCallback("/nowhere", {}, EvalSpec(), 5, None)
    assert [s for s in range(12) if every.due(s, 11)] == [0, 5, 10, 11]


def _run(tmp_path: Path, name: str, **change) -> tuple[Path, dict, EvalSpec]:
    """A run directory with a run.json as the trainer writes its step-0 fields, and its would-be spec."""
    spec = EvalSpec(cap=64, samples={"fixed32": 2, "heldout300": 1})
    info = {"base_model": "/b", "architecture": "Qwen2ForCausalLM", "snapshot": {"sha256": "s"},
            "eval_sets": {"fixed32": ["f1"], "heldout300": ["h1", "h2"]}, "eval": spec.to_json(),
            "grader_version": "v1", **change}  # fmt: skip
    run = tmp_path / name
    (run / "results").mkdir(parents=True)
    (run / "run.json").write_text(json.dumps(info))
    return run, {"fixed32": [{"id": "f1"}], "heldout300": [{"id": "h2"}, {"id": "h1"}]}, spec


def _rows(spec: EvalSpec) -> list[dict]:
    items = [("fixed32", "f1", 0), ("fixed32", "f1", 1), ("heldout300", "h1", 0), ("heldout300", "h2", 0)]
    return [{"step": 0, "set": s, "task_id": t, "sample": i, "seed": sample_seed(spec.seed, t, i),
             "outcome": "wrong", "answer": "1", "reference": "2", "completion_tokens": 5, "cap": spec.cap,
             "completion": "x"} for s, t, i in items]  # fmt: skip


def test_shared_step0_rows_are_taken_only_when_they_are_this_runs_own(tmp_path):
    source, tasks, spec = _run(tmp_path, "leader")
    rows_file = source / "results/eval_step000.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in _rows(spec)))
    follower, _, _ = _run(tmp_path, "follower")
    assert shared_step0_rows(rows_file, follower, tasks, spec) == _rows(spec)
    other, _, _ = _run(tmp_path, "other-cap", eval={**spec.to_json(), "cap": 128})
    with pytest.raises(RunDirError, match="differs from this one in eval"):
        shared_step0_rows(rows_file, other, tasks, spec)
    elsewhere, _, _ = _run(tmp_path, "on-an-h100", launch={"device": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(RunDirError, match=r"differs from this one in device \(None there\)"):
        shared_step0_rows(rows_file, elsewhere, tasks, spec)  # rows from another GPU model are not this run's
    rows = _rows(spec)
    rows[2]["seed"] += 1  # one sample drawn with another seed
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RunDirError, match="row 3 is not this run's step-0 sample"):
        shared_step0_rows(rows_file, follower, tasks, spec)


def test_copied_step0_rows_are_the_sources_bytes(tmp_path):
    source, tasks, spec = _run(tmp_path, "leader")
    rows_file = source / "results/eval_step000.jsonl"
    from rundir.files import write_eval

    write_eval(source, 0, _rows(spec))
    follower, _, _ = _run(tmp_path, "follower")
    logged = []
    cb = EvalCallback(follower, tasks, spec, 1, None, log_fn=logged.append, step0_rows=rows_file)
    cb.on_train_begin(None, SimpleNamespace(global_step=0, max_steps=3), None)
    assert (follower / "results/eval_step000.jsonl").read_bytes() == rows_file.read_bytes()
    assert cb.last_step == 0 and cb.last_summary["heldout300"]["n"] == 2 and logged


def test_the_last_step_is_not_saved_where_the_launcher_drops_it():
    from launch.settings import run_settings  # noqa: F401  (the flag is the launcher's, the skip the trainer's)
    from trainer.checkpoint import CheckpointCallback

    saved = []

    class Trainer:
        accelerator = SimpleNamespace(is_main_process=False, wait_for_everyone=lambda: None)

    cb = CheckpointCallback(Trainer(), Path("/nowhere"), Path("/base"))
    import trainer.checkpoint as checkpoint

    real = checkpoint.save_weights
    checkpoint.save_weights = lambda trainer, path: saved.append(path)
    checkpoint_state = checkpoint.save_state_dir
    checkpoint.save_state_dir = lambda *a: None
    try:
        args = SimpleNamespace(max_steps=3, save_last_step=False, checkpoint_steps=[], checkpoint_every=0,
                               keep_states=1)  # fmt: skip
        cb.on_log(
            args, SimpleNamespace(global_step=3), SimpleNamespace(should_training_stop=True), logs={"loss": 1}
        )
        assert saved == []
        args.save_last_step = True
        cb.on_log(
            args, SimpleNamespace(global_step=3), SimpleNamespace(should_training_stop=True), logs={"loss": 1}
        )
        assert saved == [Path("/nowhere/step003")]
    finally:
        checkpoint.save_weights, checkpoint.save_state_dir = real, checkpoint_state


def test_runs_at_a_time_come_from_the_leaders_first_row_where_it_has_one(tmp_path, monkeypatch):
    import launch.gpus as gpus

    run = tmp_path / "leader"
    (run / "results").mkdir(parents=True)
    row = {
        "step": 1,
        "gpu_memory": {"peak_reserved_gib": 15.988, "device_used_gib": 16.8, "total_gib": 139.8},
    }
    (run / "results/steps.jsonl").write_text(json.dumps(row) + "\n")
    memory = row_memory(run)
    assert memory == pytest.approx((15.988 * 1024 + 850, 139.8 * 1024))
    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: None)  # MPS: nvidia-smi lists the server
    assert fitting(8, 1, 0.9, 1.6, row_memory=memory) == 4  # launch 2's leader: 17,222 MiB x 1.6
    assert fitting(8, 1, 0.9, 1.6) == 8  # nothing known: the plan's number, as before
    (run / "results/steps.jsonl").write_text(json.dumps({"step": 1, "gpu_memory": None}) + "\n")
    assert row_memory(run) is None  # a CPU run


class Running:
    """A leader's process, still going (what `Gpu.waits` and `Gpu.settle` ask of a Popen)."""

    pid = 1

    def poll(self):
        return None


def test_two_15b_runs_at_a_time_do_not_fit_an_h100_by_the_committed_rows():
    """PERFORMANCE.md's lever row "two 1.5B runs at a time on an H100": every run of issue 62 that reached step 30 on
    an H100, its peak reserved before its first evaluation of its own and after it (the step-0 copies' row 11 on)."""
    from rundir.archive import read_bytes

    q15 = ROOT / "docs/experiment-qwen15"
    before, after, kept, first, total = [], [], [], {}, set()
    for name in (
        "launch1/qwen15-S0-s0",
        "launch1/qwen15-S2-s0",
        "launch2/qwen15-S0-s1",
        "launch2/qwen15-S2-s1",
    ):
        rows = [json.loads(x) for x in read_bytes(q15 / name / "results/steps.jsonl").decode().splitlines()]
        assert len(rows) == 30
        total |= {r["gpu_memory"]["total_gib"] for r in rows}
        if name.endswith("S0-s0"):  # the leader: step 0 evaluated with the extra sets before its row 1
            first[name] = (
                rows[0]["gpu_memory"]["peak_reserved_gib"],
                max(r["gpu_memory"]["peak_reserved_gib"] for r in rows),
            )
            continue
        before.append(max(r["gpu_memory"]["peak_reserved_gib"] for r in rows[:10]))
        after.append(max(r["gpu_memory"]["peak_reserved_gib"] for r in rows[10:]))
        kept.append(
            min(r["gpu_memory"]["peak_allocated_gib"] for r in rows[10:])
        )  # the evaluation's copy stays
    assert total == {79.179}
    assert (min(before), max(before), min(after), max(after)) == (38.105, 38.555, 44.67, 45.471)
    assert round(min(kept), 1) == 41.8
    assert first == {"launch1/qwen15-S0-s0": (46.875, 54.555)}
    context = 850 / 1024
    assert round(2 * (min(before) + context), 1) == 77.9 and round(2 * (max(after) + context), 1) == 92.6


def test_a_leader_given_step_0_waits_for_its_first_evaluation_before_it_is_measured(tmp_path, monkeypatch):
    """Issue 62's lease 2 (an H100, step 0 copied from launch 1): the leader's first row came before any evaluation,
    so the launcher fit 2 runs and three of them ran out of memory. The row after its step-10 evaluation fits 1."""
    import launch.gpus as gpus
    from launch.settings import first_evaluated_step
    from rundir.archive import read_bytes

    leader = ROOT / "docs/experiment-qwen15/launch2/qwen15-S0-s1"
    rows = [json.loads(x) for x in read_bytes(leader / "results/steps.jsonl").decode().splitlines()]
    plan = load(ROOT / "docs/experiment-qwen15/plan.yaml")
    row = first_evaluated_step(plan, plan.steps) + 1
    assert row == 11  # evaluations at steps 0 (copied), 10, 20, 30
    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: None)
    run = tmp_path / "leader"
    (run / "results").mkdir(parents=True)
    fits = []
    for n in (1, row):
        (run / "results/steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:n]))
        fits.append(fitting(2, 1, 0.9, 1.05, say=lambda x: None, row_memory=row_memory(run, row)))
    assert fits == [2, 1]  # what lease 2 did at its first row, and what the leader's 11th row says

    gpu = gpus.Gpu(0, None, [], 2, tmp_path / "gpu0.log", time.perf_counter(), measure_row=row)
    gpu.procs.append((run, Running()))
    (run / "results/steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))
    assert gpu.waits(time.perf_counter() + 60)  # 10 rows: step 10's evaluation not yet counted
    (run / "results/steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:11]))
    assert not gpu.waits(time.perf_counter() + 60)
    assert gpu.settle(0.9, 1.05) and gpu.parallel == 1
    assert "leader holds 46550 of 81079 MiB" in (tmp_path / "gpu0.log").read_text()


def test_a_leader_given_step_0_is_sized_at_once_by_the_run_that_evaluated_it(tmp_path, monkeypatch):
    """The step-0 rows' own run (launch 1's leader, which evaluated step 0 with the extra sets: 46.9 GiB at its first
    row, 54.6 at most) sizes the GPU at the leader's first row, on the leader's GPU: 1 run on the H100, 2 on an H200.
    A source that copied its own step 0 (launch 2's runs) evaluated nothing before its row 11: the leader waits."""
    import launch.gpus as gpus
    from launch.runs import evaluated_step0, size_by_step0
    from rundir.archive import read_bytes

    monkeypatch.setattr(gpus, "gpu_memory_mib", lambda pid, gpu: None)
    source = tmp_path / "qwen15-S0-s0"
    (source / "results").mkdir(parents=True)
    for name in ("run.json", "results/steps.jsonl"):
        (source / name).write_bytes(read_bytes(ROOT / "docs/experiment-qwen15/launch1/qwen15-S0-s0" / name))
    copied = tmp_path / "qwen15-S0-s1"
    copied.mkdir()
    (copied / "run.json").write_bytes(
        read_bytes(ROOT / "docs/experiment-qwen15/launch2/qwen15-S0-s1/run.json")
    )
    assert evaluated_step0(source) and not evaluated_step0(copied)
    waits = gpus.Gpu(0, None, [], 2, tmp_path / "gpu0.log", time.perf_counter())  # given launch 2's rows
    size_by_step0(waits, copied / "results/eval_step000.jsonl", 11)
    assert (waits.memory_from, waits.measure_row) == (None, 11)

    fits = []
    for total in (79.179, 139.8):  # an H100 80GB HBM3 (the source's own), an H200
        leader = tmp_path / f"leader{total}"
        (leader / "results").mkdir(parents=True)
        gpu = gpus.Gpu(0, None, [], 2, tmp_path / "gpu0.log", time.perf_counter())
        size_by_step0(gpu, source / "results/eval_step000.jsonl", 11)  # with launch 1's
        assert (gpu.memory_from, gpu.measure_row) == (source, 1)
        gpu.procs.append((leader, Running()))
        assert gpu.waits(time.perf_counter() + 60)  # alone until its own first row: the caches compiled once
        row = {"step": 1, "gpu_memory": {"peak_reserved_gib": 30.7, "total_gib": total}}  # step 0 copied
        (leader / "results/steps.jsonl").write_text(json.dumps(row) + "\n")
        assert not gpu.waits(time.perf_counter() + 60) and gpu.settle(0.9, 1.05)
        fits.append(gpu.parallel)
    assert fits == [1, 2]
    assert "leader holds 56714 of 143155 MiB" in (tmp_path / "gpu0.log").read_text()  # 54.555 GiB, a context


def test_watch_ends_with_the_launcher_not_at_its_next_line(tmp_path, monkeypatch, capsys):
    """Lease 3's last call waited 82 s after the last run exited, most of it for the next minute's line: the call (and
    the lease) should end within a poll of the launcher's end. A fake clock: the launcher lives until t = 3.5 s."""
    import launch.watch as w

    clock = SimpleNamespace(t=0.0)
    fake = SimpleNamespace(
        perf_counter=lambda: clock.t,
        sleep=lambda s: setattr(clock, "t", clock.t + s),
        strftime=time.strftime,
    )
    monkeypatch.setattr(w, "time", fake)
    monkeypatch.setattr(w, "launcher_pid", lambda work: 4242 if clock.t < 3.5 else None)
    assert w.watch(tmp_path, for_s=600, every_s=60) == 0
    assert 3.5 <= clock.t <= 4.5
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(": ")[0].split()[-1] for line in lines] == ["runs", "ended"]


@pytest.mark.slow
def test_a_detached_train_outlives_its_caller_and_shares_step_0(tmp_path):
    import yaml

    raw = yaml.safe_load((ROOT / "docs/experiment-real/plan.yaml").read_text())
    raw["budget"].update(share_step0=True)  # the SmolLM2 plan (its snapshot is made by CI's make real-base)
    raw["eval"].update(steps=[0, 1])
    plan, work = tmp_path / "plan.yaml", tmp_path / "w"
    plan.write_text(yaml.safe_dump(raw))
    assert launch_main([str(plan), "base", "--smoke", "--work", str(work), "--out", str(tmp_path / "o")]) == 0
    cmd = [sys.executable, "-m", "launch", str(plan), "train", "--smoke", "--seeds", "0,1", "--work", str(work),
           "--detach"]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    started = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert started.returncode == 0 and "detached" in started.stdout  # returned at once
    assert launcher_pid(work) is not None
    assert launch_main([str(plan), "train", "--smoke", "--work", str(work), "--detach"]) == 1  # one at a time
    end, mid = time.time() + 600, None
    while launcher_pid(work) is not None and time.time() < end:
        if mid is None and list((work / "runs").glob("*/run.json")):  # a watch call's pack, while runs write
            assert launch_main([str(plan), "pack", "--work", str(work), "--out", str(tmp_path / "mid")]) == 0
            with tarfile.open(tmp_path / "mid/smollm2.tar.xz") as tar:
                mid = tar.getnames()
        time.sleep(2)
    assert mid and any(n.endswith("/run.json") for n in mid)
    assert launch_main([str(plan), "watch", "--work", str(work), "--for-s", "1"]) == 0
    runs = sorted(p for p in (work / "runs").iterdir() if p.is_dir())
    assert [r.name for r in runs] == ["smollm2-S0-s0", "smollm2-S0-s1", "smollm2-S2-s0", "smollm2-S2-s1"]
    leader = work / "runs/smollm2-S0-s0"
    for run in runs:
        config = json.loads((run / "run.json").read_text())["config"]
        shared = str(leader / "results/eval_step000.jsonl")
        assert config["step0_eval_from"] == (None if run == leader else shared)
        assert config["eval_at_steps"] == [0, 1]
        assert (run / "results/eval_step000.jsonl").read_bytes() == Path(shared).read_bytes()
    timeline = [json.loads(line) for line in (work / "runs/timeline.jsonl").read_text().splitlines()]
    assert {e["event"] for e in timeline} >= {"launcher", "start", "step", "exit"}
    assert launch_main([str(plan), "pack", "--work", str(work), "--out", str(tmp_path / "o2")]) == 0
    assert (tmp_path / "o2/smollm2.tar.xz").is_file()


def test_the_readme_report_of_launch_2_is_what_the_report_command_prints():
    from launch.report import report

    readme = (QWEN / "README.md").read_text()
    block = readme.split("<!-- report launch2 -->\n", 1)[1].split("<!-- /report launch2 -->", 1)[0]
    assert block == report(load(QWEN / "plan-launch2.yaml"))


def test_compile_caches_travel_to_the_next_lease_only_to_the_same_torch_triton_and_gpu(
    tmp_path, monkeypatch, capsys
):
    import launch.pack as pack

    work = tmp_path / "lease1"
    for name in ("cache/inductor/fxgraph/ab/entry", "cache/triton/K1/kernel.cubin"):
        (work / name).parent.mkdir(parents=True)
        (work / name).write_bytes(b"compiled")
    archive = pack.pack_caches(work, tmp_path / "out")
    assert archive == tmp_path / "out/compile-caches.tar.gz"
    assert pack.unpack_caches(archive, tmp_path / "lease2")
    assert (tmp_path / "lease2/cache/triton/K1/kernel.cubin").read_bytes() == b"compiled"
    assert not pack.unpack_caches(archive, tmp_path / "lease2")  # never over caches already there
    monkeypatch.setattr(
        pack,
        "cache_key",
        lambda: {"torch": "9.9", "triton": "3.6.0", "tilelang": None, "gpu": "cpu", "cuda": None},
    )
    assert not pack.unpack_caches(archive, tmp_path / "lease3") and not (tmp_path / "lease3").exists()
    assert "not used (torch" in capsys.readouterr().out
    (tmp_path / "cut.tar.gz").write_bytes(archive.read_bytes()[:100])
    with pytest.raises(LaunchError, match="cut.tar.gz: not a compile-cache archive"):
        pack.unpack_caches(tmp_path / "cut.tar.gz", tmp_path / "lease4")


def test_every_run_writes_the_caches_that_pack_carries_autotuning_included(tmp_path):
    """The runs' environment (launch/runs.py cache_env) names the folders pack_caches archives, and Triton keeps
    its autotuners' timings there, so the next lease's runs time nothing this one timed."""
    import tarfile

    import launch.pack as pack
    from launch.runs import cache_env

    env = cache_env(tmp_path)
    assert env["TRITON_CACHE_AUTOTUNING"] == "1"
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR"):
        (Path(env[var]) / "entry").parent.mkdir(parents=True)
        (Path(env[var]) / "entry").write_bytes(var.encode())
    with tarfile.open(pack.pack_caches(tmp_path, tmp_path / "out")) as tar:
        assert {"cache/inductor/entry", "cache/triton/entry", "cache/tilelang/entry"} <= set(tar.getnames())
    assert pack.unpack_caches(tmp_path / "out/compile-caches.tar.gz", tmp_path / "next")
    assert (tmp_path / "next/cache/tilelang/entry").read_bytes() == b"TILELANG_CACHE_DIR"


def test_the_15b_trial_figures_recompute_from_its_rows():
    """docs/PERFORMANCE.md's 1.5B figures (one run alone at T 1.0, cap 384), from the lease folder's archive."""
    import statistics

    from rundir.files import read_jsonl

    trial = ROOT / "docs/performance/h200-2026-12-04f/trial15/qwen15-S0-s900/results/steps.jsonl"
    rows = read_jsonl(trial)
    step = [sum(v for k, v in r["seconds"].items() if k not in ("eval", "grade_lost")) for r in rows]
    assert len(rows) == 10 and round(statistics.median(step[1:]), 1) == 5.9  # steps 2-10, evaluation apart
    assert round(rows[-1]["seconds"]["eval"]) == 14
    reserved = [r["gpu_memory"]["peak_reserved_gib"] for r in rows]
    assert round(min(reserved)) == 57 and round(max(reserved)) == 72


def test_the_third_15b_trial_figures_and_its_run_alone_recompute_from_their_rows():
    """docs/PERFORMANCE.md's eighth lease and the 1.5B plan's lease figure: plan-throughput3.yaml's two pairs (two
    runs at a time, each sized for 0.45 of the GPU, under MPS), and S2-s913 run again alone, bitwise the same."""
    import statistics

    from bench.resume_check import compare
    from rundir.files import read_jsonl

    lease = ROOT / "docs/performance/h200-2026-12-05b"
    g = figures(lease / "throughput3")
    assert (g["run_steps"], g["runs"], g["runs_going_max"]) == (40, 4, 2)
    assert round(g["lease_s_per_run_step"], 1) == 33.6 and round(g["sampled_per_trained_group"], 2) == 2.65
    rows = [r for run in ("S0-s913", "S2-s913", "S0-s914", "S2-s914")
            for r in read_jsonl(lease / f"throughput3/qwen15-{run}/results/steps.jsonl")]  # fmt: skip
    later = [r["seconds"] for r in rows if r["step"] > 1]  # step 1 compiles the rollout call
    wall = [sum(v for k, v in s.items() if k not in ("eval", "grade_lost")) for s in later]
    assert (
        round(statistics.median(wall), 1) == 7.3
        and round(statistics.median(s["generate"] for s in later), 1) == 5.4
    )
    assert round(statistics.median(s["train"] for s in later), 1) == 1.3
    assert [round(r["seconds"]["eval"]) for r in rows if r["seconds"]["eval"]] == [127, 122, 130, 115]
    timeline = read_jsonl(lease / "throughput3/timeline.jsonl")
    first_row = next(e["t"] for e in timeline if e["event"] == "step")
    assert (
        round(first_row - timeline[0]["t"]) == 195
    )  # the leader alone: step 0 with the extra sets, then step 1
    alone = read_jsonl(lease / "alone/qwen15-S2-s913/results/steps.jsonl")  # the same run by itself
    alone_wall = [
        sum(v for k, v in r["seconds"].items() if k not in ("eval", "grade_lost")) for r in alone[1:]
    ]
    assert round(statistics.median(alone_wall), 1) == 6.8 and round(alone[-1]["seconds"]["eval"]) == 91
    found = compare(lease / "throughput3/qwen15-S2-s913", lease / "alone/qwen15-S2-s913", None)
    assert found["rows_identical"] and found["eval_rows_identical"] and found["eval_files"] == 6
    assert json.loads((lease / "compare-S2.json").read_text())["rows_identical"]  # what the GPU machine found


def test_the_mps_probe_at_the_15b_decode_shape_recomputes_from_its_json():
    """docs/PERFORMANCE.md's lever 4 at the 1.5B's decode shape (batch 128, fp32, deterministic, position writes):
    two processes under MPS make 1.05x one process's tokens, two time-sliced 0.94x, from the median timed call."""
    import statistics

    def step_ms(name):  # the median of each length's timed calls (the first of each warms up)
        s = json.loads((ROOT / f"docs/performance/h200-2026-12-05b/probe-{name}.json").read_text())[
            "compiled"
        ]
        calls = s["seconds"]
        return 1e3 * (statistics.median(calls["384"][1:]) - statistics.median(calls["64"][1:])) / 320

    one = step_ms("one-1")
    mps, sliced = [step_ms(f"mps2-{i}") for i in (1, 2)], [step_ms(f"slice2-{i}") for i in (1, 2)]
    assert (
        round(one, 2) == 6.14
        and [round(x, 1) for x in mps] == [11.6, 11.7]
        and [round(x, 1) for x in sliced] == [13.0, 13.2]
    )
    assert round(sum(one / x for x in mps), 2) == 1.05 and round(sum(one / x for x in sliced), 2) == 0.94


def test_a_later_lease_copies_an_earlier_leases_step_0_rows(tmp_path):
    """`train --step0-from` (issue 62's leases after the first): runs of a new launch in the same work folder copy
    the step-0 rows an earlier launch's run evaluated, byte for byte, and say so in run.json; the trainers check
    the rows against their own run first (trainer/eval_callback.py shared_step0_rows)."""
    import shutil

    import yaml

    raw = yaml.safe_load((ROOT / "docs/experiment-real/plan.yaml").read_text())
    raw["eval"].update(steps=[0, 1])  # the SmolLM2 plan (its snapshot is made by CI's make real-base)
    plan, work, earlier = tmp_path / "plan.yaml", tmp_path / "w", tmp_path / "lease1"
    plan.write_text(yaml.safe_dump(raw))
    assert launch_main([str(plan), "base", "--smoke", "--work", str(work), "--out", str(tmp_path / "o")]) == 0
    train = [str(plan), "train", "--smoke", "--work", str(work), "--out", str(tmp_path / "o")]
    assert launch_main([*train, "--seeds", "0"]) == 0
    # what a lease keeps: its rows, elsewhere; the next lease's work folder is the same path
    shutil.move(work / "runs", earlier)
    rows = earlier / "smollm2-S0-s0/results/eval_step000.jsonl"
    assert launch_main([*train, "--seeds", "1", "--step0-from", str(rows)]) == 0
    for arm in ("S0", "S2"):
        run = work / f"runs/smollm2-{arm}-s1"
        assert json.loads((run / "run.json").read_text())["config"]["step0_eval_from"] == str(rows)
        assert (run / "results/eval_step000.jsonl").read_bytes() == rows.read_bytes()


def test_the_conversion_figures_recompute_from_their_json():
    """docs/PERFORMANCE.md's conversion table (this CPU, 2026-12-05): after / before from bench.conversion's JSON,
    and every file the same bytes before and after under each transformers version."""
    folder = ROOT / "docs/performance/cpu-2026-12-05"
    runs = {f.stem: json.loads(f.read_text()) for f in folder.glob("q15-*.json")}
    text = (ROOT / "docs/PERFORMANCE.md").read_text()
    for version, label in (("lock", "5.25.0"), ("5.17", "5.17.0")):
        before = [runs[f"q15-{version}-before{r}"] for r in ("", "-2")]
        after = [runs[f"q15-{version}-after{r}"] for r in ("", "-2")]
        assert {r["versions"]["transformers"] for r in before + after} == {label}
        assert len({json.dumps(r["sha256"], sort_keys=True) for r in before + after}) == 1
        ratio = sum(r["seconds"] for r in after) / sum(r["seconds"] for r in before)
        row = f"| {', '.join(str(r['seconds']) for r in before)} | {', '.join(str(r['seconds']) for r in after)} | **{ratio:.2f}** |"
        assert row in text, row
    weights = {r["sha256"]["model.safetensors"] for r in runs.values()}
    assert len(weights) == 1 and f"model.safetensors is\n  {weights.pop()[:8]}…" in text


def test_the_bare_machine_figures_recompute_from_their_json():
    """docs/PERFORMANCE.md's ninth lease: the 1.82B benchmark's step 1 against step 2 in a process that compiles
    everything, in fresh processes given only the carried caches, and with TileLang's cache carried too; the bf16
    rollout probe against the eighth lease's float32 figure."""
    lease = ROOT / "docs/performance/h200-2026-12-05c"

    def ratio(name):
        steps = json.loads((lease / name).read_text())["runs"]["ours"]["steps"]
        one, two = (s["seconds"]["total"] for s in steps)
        return round(one, 1), round(two, 1), round(one / two, 2)

    assert ratio("warm.json") == (271.7, 13.9, 19.6)
    assert ratio("carried-1.json") == (44.4, 13.7, 3.23)
    assert ratio("carried-2.json") == (46.8, 13.7, 3.42)
    assert ratio("carried-tilelang.json") == (25.0, 13.3, 1.87)  # issue 60's bar: <= 2
    bf16 = json.loads((lease / "rollout-bf16.json").read_text())
    fp32 = json.loads((ROOT / "docs/performance/h200-2026-12-05b/probe-one-1.json").read_text())
    assert bf16["args"]["dtype"] == "bfloat16"
    assert (bf16["args"]["batch"], bf16["args"]["new"]) == (128, "64,384")
    assert (fp32["args"]["batch"], fp32["args"]["new"]) == (128, "64,384")
    assert round(bf16["compiled"]["step_ms"], 2) == 4.27 and round(fp32["compiled"]["step_ms"], 2) == 6.13
    assert round(fp32["compiled"]["step_ms"] / bf16["compiled"]["step_ms"], 2) == 1.44
    assert round(bf16["floor"]["floor_ms"], 2) == 0.97
    text = (ROOT / "docs/PERFORMANCE.md").read_text()
    for figure in ("| 271.7 (97.1, 173.6) | 13.9 | 19.6× |", "| 44.4 (14.9, 28.6) | 13.7 | 3.2× |",
                   "| 46.8 (13.9, 32.2) | 13.7 | 3.4× |", "| **25.0** (14.2, 9.9) | 13.3 | **1.87×** |",
                   "**4.27 ms a decode step**, against 6.13 ms", "**1.44×**", "is 0.97 ms"):  # fmt: skip
        assert figure in text, figure


def test_the_bare_machine_bar_on_h100s_recomputes_from_its_json():
    """PERFORMANCE.md's fourteenth lease: lease A on a fresh H100 compiling everything, lease B on another fresh H100
    given only A's archive (TileLang's cache in it, so B compiled no TileLang kernel); the same losses in both."""
    lease = ROOT / "docs/performance/h100-2026-12-06c"
    runs = {
        name: json.loads((lease / f"{name}.json").read_text())["runs"]["ours"] for name in ("warm", "carried")
    }
    (a1, a2), (b1, b2) = ([s["seconds"]["total"] for s in runs[n]["steps"]] for n in ("warm", "carried"))
    assert (round(a1, 1), round(a2, 1), round(a1 / a2, 1)) == (162.6, 15.2, 10.7)
    assert (round(b1, 1), round(b2, 1), round(b1 / b2, 2)) == (27.9, 16.0, 1.75)  # issue 60's bar: <= 2
    assert [s["loss"] for s in runs["warm"]["steps"]] == [s["loss"] for s in runs["carried"]["steps"]]
    assert "begins to compile" in (lease / "warm.log").read_text()
    assert "begins to compile" not in (lease / "carried.log").read_text()
    text = (ROOT / "docs/PERFORMANCE.md").read_text()
    for figure in ("| 162.6 (58.7, 103.3) | 15.2 | 10.7× |", "| **27.9** (16.1, 11.2) | 16.0 | **1.75×** |"):
        assert figure in text, figure
