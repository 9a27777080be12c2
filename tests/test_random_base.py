"""bench/random_base.py: a random Qwen3.5 base that trainer.train loads, and on which the arm docs/gpu.md gives for
issue 50's run (truncation's own reward, every group trained) has gradients although nothing is ever correct."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import random_base

ROOT = Path(__file__).resolve().parent.parent
ARM = {
    "PEN-ALL": {
        "policy_id": "stop-properly-penalty-v1",
        "groups_per_step": 2,
        "policy_params": {"gate": "all"},
    }
}


def test_refuses_an_existing_directory(tmp_path):
    with pytest.raises(SystemExit, match="exists"):
        random_base.main(["--out", str(tmp_path), "--hidden", "32", "--layers", "4", "--intermediate", "64"])


@pytest.mark.slow
def test_a_random_base_trains_under_the_penalty_arm(tmp_path):
    base = random_base.main(
        ["--out", str(tmp_path / "base"), "--hidden", "64", "--layers", "4", "--intermediate", "128",
         "--vocab", "600", "--p-ended", "0.5", "--cap", "16"]
    )  # fmt: skip
    config = json.loads((base / "generation_config.json").read_text())
    assert len(config["eos_token_id"]) > 1  # the stop tokens beside the tokenizer's EOS
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainer.train", "--config", "configs/embedded.yaml", "--model_name_or_path",
           str(base), "--arm", "PEN-ALL", "--arms", json.dumps(ARM), "--max_steps", "1", "--groups_per_step", "2",
           "--num_generations", "4", "--problems_per_round", "2", "--per_device_train_batch_size", "4",
           "--max_completion_length", "16", "--eval_every", "0", "--report_to", "none",
           "--output_dir", str(run)]  # fmt: skip
    done = subprocess.run(
        cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert done.returncode == 0, done.stderr[-2000:]
    row = json.loads((run / "results" / "steps.jsonl").read_text().splitlines()[0])
    assert row["outcomes_sampled"]["correct"] == 0
    assert row["outcomes_sampled"]["truncated"] > 0 and row["outcomes_sampled"]["format_rejected"] > 0
    assert row["groups"]["trained"] == 2 and row["grad_norm"] > 0
