"""Two "nodes" on one host: `accelerate launch --num_machines 2 --machine_rank {0,1}`, one CPU process per node
(gloo), no vLLM, two optimizer steps of CapGRPOTrainer on the embedded base. Slow (part of `make test`;
alone: `make test-multinode`, `4 passed in 60.81s` on 2 cores).

Every write under output_dir is recorded per process by tests/multinode_audit.py. Checked: the run directory
is written by the global main process alone (rank 1 is its node's local main process and writes nothing);
a node with a disk of its own is refused in one line on both nodes before anything is written; a run killed
after state001/ and resumed on the same layout equals the uninterrupted one.
"""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from free_port import free_port
from safetensors.torch import load_file

from bench.resume_check import descendants
from trainer.config import CapGRPOConfig, ConfigError

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
AUDIT = REPO / "tests" / "multinode_audit.py"

# S0 on the embedded base: two groups of 8 per step (one problem per node and round), so that both steps
# train (groups qualify and the weights move) at CPU speed; state001/ is what the killed run resumes from.
SMALL = {
    "arm": "S0",
    "model_name_or_path": REPO / "embedded/base",
    "snapshot_path": REPO / "embedded/synthetic.tasks.json",
    "max_steps": 2,
    "groups_per_step": 2,
    "num_generations": 8,
    "per_device_train_batch_size": 8,
    "problems_per_round": 4,
    "max_sampling_rounds": 3,
    "heldout_size": 2,
    "fixed_size": 1,
    "fixed_samples": 1,
    "eval_every": 2,
    "eval_batch_size": 4,
    "checkpoint_steps": 1,
    "grader_workers": 1,
    "disable_tqdm": "true",
}  # the recipe's report_to (tensorboard) stays: its event files are run-dir writes too


class Nodes:
    """One two-node launch: each node's exit status, its log, and each process's recorded writes."""

    def __init__(self, audit: Path, codes: list[int]):
        self.audit, self.codes = audit, codes
        self.logs = [(audit / f"node{r}.log").read_text() for r in (0, 1)]

    def writes(self, rank: int) -> list[dict]:
        path = self.audit / f"rank{rank}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def launch(outs: tuple[Path, Path], audit: Path, *extra: str, kill_after: int | None = None) -> Nodes:
    """Node r trains into outs[r] (the same path: a shared disk). `kill_after`: SIGKILL both nodes' process
    trees once state<kill_after>/ is complete (torch's launcher starts workers in sessions of their own)."""
    audit.mkdir(parents=True)
    port, procs = free_port(), []
    # CPU "nodes" (gloo) even where a GPU is visible: these test the run directory, not the device
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env["CUDA_VISIBLE_DEVICES"] = ""
    for rank, out in enumerate(outs):
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_machines", "2"]
        cmd += [
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
        ]
        cmd += ["--num_processes", "2", "--mixed_precision", "no", "--dynamo_backend", "no"]
        cmd += [str(AUDIT), str(audit), "--config", str(REPO / "configs/embedded.yaml")]
        for k, v in SMALL.items():
            cmd += [f"--{k}", str(v)]
        cmd += ["--output_dir", str(out), *extra]
        log = open(audit / f"node{rank}.log", "w")  # noqa: SIM115 (closed below)
        procs.append(
            (subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True), log)
        )
    deadline = time.monotonic() + 600
    while any(p.poll() is None for p, _ in procs) and time.monotonic() < deadline:
        if kill_after is not None and (outs[0] / f"state{kill_after:03d}").is_dir():
            for p, _ in procs:
                for pid in [p.pid, *descendants(p.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    for p, log in procs:
        if p.poll() is None:
            p.kill()
        p.wait()
        log.close()
    return Nodes(audit, [p.returncode for p, _ in procs])


def rows(run: Path) -> list[dict]:
    lines = (run / "results/steps.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    base = tmp_path_factory.mktemp("two-nodes")
    ref, cut = base / "uninterrupted", base / "resumed"
    found = {"ref": (ref, launch((ref, ref), base / "audit-ref"))}
    killed = launch((cut, cut), base / "audit-killed", kill_after=1)
    resumed = launch((cut, cut), base / "audit-resumed", "--resume", str(cut))
    found |= {"killed": (cut, killed), "resumed": (cut, resumed)}
    for name in ("ref", "resumed"):
        nodes = found[name][1]
        assert nodes.codes == [0, 0], (
            f"{name}: {nodes.codes}\n{nodes.logs[0][-3000:]}\n{nodes.logs[1][-3000:]}"
        )
    return found


def test_the_run_directory_is_written_once_by_the_global_main_process(runs):
    run, nodes = runs["ref"]
    # rank 1 is its node's local main process: it reads the run directory and writes nothing in it
    assert nodes.writes(1) == []
    written = {(w["event"], w["path"]) for w in nodes.writes(0)}
    for path in ("run.json", "README.md", "results/eval_step000.jsonl", "results/eval_step002.jsonl"):
        assert ("os.rename", path) in written, path  # installed by rename (data/atomic.py)
    for step in ("001", "002"):
        for path in (f"step{step}", f"state{step}", f"step{step}/README.md"):
            assert ("os.rename", path) in written, path
    assert ("open", "results/steps.jsonl") in written
    assert any(p.startswith("runs/") and "tfevents" in p for e, p in written if e == "open")  # tensorboard
    # once: one row per step, one launch of 2 processes on 2 nodes, each process's RNG streams in the state
    assert [r["step"] for r in rows(run)] == [1, 2]
    info = json.loads((run / "run.json").read_text())
    assert info["launch"]["num_processes"] == 2 and info["launch"]["distributed_type"] == "MULTI_CPU"
    assert len(json.loads((run / "state002/meta.json").read_text())["rng"]) == 2
    assert sorted(p.name for p in run.iterdir()) == [
        "README.md", "results", "run.json", "runs", "state001", "state002", "step001", "step002",
    ]  # fmt: skip
    assert all(r["groups"]["trained"] > 0 for r in rows(run))  # both steps move the weights


def test_a_resume_on_the_same_layout_is_exact(runs):
    ref, _ = runs["ref"]
    cut, killed = runs["killed"]
    assert killed.codes != [0, 0]  # it really was killed, after state001/
    _, resumed = runs["resumed"]
    assert resumed.writes(1) == []
    assert json.loads((cut / "run.json").read_text())["resumes"][0]["from_state"] == "state001"
    assert rows(cut) == rows(ref)
    assert not list(cut.glob("**/.*.tmp-*"))  # what the kill left mid-write (a card's temp file) is gone
    for name in ("eval_step000.jsonl", "eval_step002.jsonl"):
        assert (cut / "results" / name).read_bytes() == (ref / "results" / name).read_bytes(), name
    a, b = load_file(ref / "step002/model.safetensors"), load_file(cut / "step002/model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    first = load_file(ref / "step001/model.safetensors")
    assert any((first[k] != a[k]).any() for k in a)  # step 2 trained: the comparison is not of a frozen model


def test_a_node_with_a_disk_of_its_own_is_refused_in_one_line(tmp_path):
    """Each node gets its own directory at `the same` output_dir: rank 1 cannot see rank 0's lock file."""
    outs = (tmp_path / "disk0" / "run", tmp_path / "disk1" / "run")
    nodes = launch(outs, tmp_path / "audit")
    assert nodes.codes == [1, 1]
    host = socket.gethostname()
    for out, log in zip(outs, nodes.logs, strict=True):
        errors = [line for line in log.splitlines() if line.startswith("error: ")]
        assert errors == [
            f"error: output_dir {out}: process 1 on {host} does not see the lock file process 0 holds there "
            f"({out / '.lock'}): every node must write one output_dir on a filesystem they all share "
            "(save_on_each_node is not supported; docs/gpu.md)"
        ]
        assert "rundir/lock.py" not in log  # our refusal, not a traceback (torchrun's own report follows it)
    assert not outs[0].exists() and not outs[1].exists()  # nothing written on either disk
    assert nodes.writes(1) == []


def test_save_on_each_node_is_refused_by_name(tmp_path):
    with pytest.raises(ConfigError, match=r"^save_on_each_node: not supported: .* shared filesystem"):
        CapGRPOConfig(output_dir=str(tmp_path), save_on_each_node=True, report_to="none", use_cpu=True)
