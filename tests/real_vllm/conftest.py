"""The real vLLM tests: `make test-vllm` only (pyproject's norecursedirs keeps them out of `make test`).

They need vLLM's CPU build, installed in its own environment by tests/real_vllm/setup_venv.sh (docs/gpu.md).
Each training run is a subprocess: a colocated engine initialises torch.distributed and vLLM's globals
once per process.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: run `make test-vllm` (docs/gpu.md)")

REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # TRL's colocate mode: the engine in the trainer's process
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB (see tests/real_vllm/two_steps.py)
}


def run_module(module: str, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`python -m module args` from the repository root; on failure the output's tail is the message."""
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=REPO,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if done.returncode:
        pytest.fail(f"python -m {module} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-6000:]}")
    return done


@pytest.fixture(scope="session")
def tiny_qwen35(tmp_path_factory) -> Path:
    from tests.real_vllm.tiny_qwen35 import build

    return build(tmp_path_factory.mktemp("model") / "tiny-qwen35")


class Run:
    """One two-step run: its directory, the probe the driver wrote, its eval rows per step."""

    def __init__(self, path: Path):
        self.path = path
        self.probe = json.loads((path / "vllm_probe.json").read_text())

    def rollouts(self, step: int) -> list[list[int]]:
        """The completions vLLM sampled while global_step was `step` (step 0: the first step's rounds)."""
        return [c for call in self.probe["vllm_calls"] if call["step"] == step for c in call["completions"]]

    def eval_rows(self, step: int) -> list[dict]:
        lines = (self.path / "results" / f"eval_step{step:03d}.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]


@pytest.fixture(scope="session")
def two_steps(tiny_qwen35, tmp_path_factory):
    """run(name, lr, *flags) -> Run, each run once per session."""
    runs = {}

    def run(name: str, lr: float, *flags: str) -> Run:
        if name not in runs:
            out = tmp_path_factory.mktemp("runs") / name
            run_module(
                "tests.real_vllm.two_steps",
                "--model",
                str(tiny_qwen35),
                "--out",
                str(out),
                "--lr",
                str(lr),
                *flags,
            )
            runs[name] = Run(out)
        return runs[name]

    return run
