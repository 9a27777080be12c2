"""Code that runs only under FSDP2 (multi-GPU) exercised on two CPU processes with real `fully_shard`:
stateNNN/ holds full tensors and restores into a sharded model exactly; evaluating a sharded model gives
the rows of the same weights evaluated whole (tests/fsdp2_probe.py does the work)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from free_port import free_port
from trl import ModelConfig

from policy.arms import resolve_arm
from rundir.state import StateError, save_state
from rundir.step import write_manifest
from trainer.checkpoint import load_resume_state
from trainer.config import CapGRPOConfig, ConfigError
from trainer.setup import check_resume

PROBE = Path(__file__).with_name("fsdp2_probe.py")


@pytest.mark.slow
def test_fsdp2_state_and_eval(tmp_path):
    result = tmp_path / "result.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(PROBE),
        str(tmp_path),
        str(result),
    ]
    # CPU processes (gloo) even where a GPU is visible: on a one-GPU host rank 1 would ask for cuda:1
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    found = json.loads(result.read_text())
    assert found["sharded"] and found["exported_shapes_full"]
    assert found["exported"] == ["exp_avg", "exp_avg_sq", "master"]
    assert found["params_moved"], "the steps changed nothing: the comparison would prove nothing"
    assert found["resumed_params_equal"] and found["resumed_state_equal"]
    assert found["eval_rows"] == 6 and found["eval_equal"]


def test_resume_refuses_another_process_count(tmp_path):
    run = tmp_path / "run"
    (run / "step001").mkdir(parents=True)
    (run / "step001" / "config.json").write_text("{}")
    write_manifest(run / "step001")  # the weights beside the state are whole: only the process count differs
    (run / "results").mkdir()
    (run / "results" / "steps.jsonl").write_text('{"step": 1}\n')  # a state never exists without its row
    meta = {"arm": "S2", "policy_id": "affine-unresolved-zero-reward-active-v1", "step": 1, "rng": [{}, {}]}
    save_state(run / "state001", tensors={}, meta=meta)
    args = CapGRPOConfig(output_dir=str(run), arm="S2", report_to="none", use_cpu=True)
    with pytest.raises(
        StateError, match=r"state001: saved by 2 process\(es\), this launch has 1; .*--num_processes 2"
    ):
        load_resume_state(run, args, resolve_arm("S2"))


def test_resume_names_the_process_count_before_the_fields_it_implies(tmp_path):
    """A one-process resume of a two-process run changes gradient_accumulation_steps and steps_per_generation
    too (the same rollouts over fewer processes); the refusal names the process count, not those."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"launch": {"num_processes": 2}, "config": {}}))
    args = CapGRPOConfig(output_dir=str(run), arm="S2", report_to="none", use_cpu=True)
    with pytest.raises(
        ConfigError, match=r"launched with 2 process\(es\), this launch has 1; resume with --num_processes 2"
    ):
        check_resume(
            run, args, ModelConfig(model_name_or_path="base"), resolve_arm("S2"), 1, {"sha256": None}, []
        )
