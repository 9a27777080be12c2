"""Two CPU processes (accelerate launch, gloo) select the same groups with the same advantages as one."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_port import free_port

PROBE = Path(__file__).with_name("dist_probe.py")
REPO = Path(__file__).resolve().parent.parent


def launch_two(tmp_path: Path) -> dict:
    result = tmp_path / "result2.json"
    # --multi_gpu is accelerate's torchrun launcher; without CUDA it runs CPU processes over gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += ["--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    cmd += ["--main_process_port", str(free_port())]
    cmd += [str(PROBE), str(tmp_path / "run2"), str(result)]
    # CPU processes even where a GPU is visible: on a one-GPU host rank 1 would otherwise ask for cuda:1
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(result.read_text())


@pytest.mark.slow
def test_two_processes_match_one(tmp_path, monkeypatch):
    # the one-process step in this process (as the scripted trainer tests run), two under accelerate launch
    import dist_probe

    dist_probe.main(str(tmp_path / "run1"), str(tmp_path / "result1.json"), monkeypatch)
    one, two = json.loads((tmp_path / "result1.json").read_text()), launch_two(tmp_path)
    assert (one["processes"], two["processes"]) == (1, 2)
    for key in ("groups", "task_ids_trained", "outcomes_sampled", "active", "num_items_in_batch"):
        assert one[key] == two[key], key
    assert one["advantages"] == pytest.approx(two["advantages"], abs=1e-6)
    # the probe's script makes the step non-trivial: several rounds, rejected groups, masked rows
    assert one["groups"]["rounds"] > 1 and one["groups"]["rejected"] and 0 in one["active"]


@pytest.mark.slow
def test_two_process_sigkill_then_resume_is_bitwise_identical(tiny_base, embedded_snapshot, tmp_path):
    """Each process's RNG streams are saved and restored: a 2-process run killed (the whole process tree)
    after state001/ and resumed equals an uninterrupted one (bench/resume_check.py does the three runs)."""
    from short_run import train_args

    report = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "bench.resume_check",
        "--processes",
        "2",
        "--out",
        str(tmp_path / "rc"),
    ]
    # two processes on CI's 2 cores: one intra-op thread each (the recipe's 2 are for a run alone)
    cmd += ["--report", str(report), "--", *train_args(tiny_base, embedded_snapshot, arm="S2", cpu_threads=1)]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
    }  # CPU, as above
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    found = json.loads(report.read_text())
    launch = {k: found["launch"][k] for k in ("num_processes", "distributed_type", "optimizer")}
    assert launch == {"num_processes": 2, "distributed_type": "MULTI_CPU", "optimizer": "adamw_torch_fused"}
    assert found["launch"]["micro_batch"]["basis"] == "explicit" and found["rng_entries"] == 2
    assert [s["step"] for s in found["steps"]] == [1, 2, 3]
    assert found["rows_identical"] and found["eval_rows_identical"] and found["eval_files"] == 3
    assert found["max_weight_diff"] == 0


@pytest.mark.slow
def test_a_two_process_run_frees_its_process_group_before_exit(tiny_base, embedded_snapshot, tmp_path):
    """Left to the interpreter's finalization, the DDP wrapper (and gloo's group and threads it holds) aborted an
    exiting rank now and then; freed by a collection inside `main`, the group's teardown, reached from DDP's reducer
    with the GIL held, hung a rank now and then (docs/gpu.md). `main` frees both, the group last, before it returns."""
    from short_run import train_args

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
    cmd += ["--main_process_port", str(free_port()), str(Path(__file__).with_name("exit_probe.py"))]
    cmd += [str(tmp_path / "rank")]
    cmd += train_args(tiny_base, embedded_snapshot, arm="S2", cpu_threads=1, max_steps=1)
    cmd += ["--output_dir", str(tmp_path / "run")]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        found = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert (found["alive"], found["watched"]) == ([], 1), rank
