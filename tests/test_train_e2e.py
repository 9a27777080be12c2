"""End to end on the tiny base: `python -m trainer.train` writes a complete run directory, and a run
killed with SIGKILL and resumed is bitwise identical to an uninterrupted one (SPEC §6). The finished run they
read is the session's shared short run (conftest.py `short_run`, tests/short_run.py)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file
from short_run import REPO, RESUMABLE, rows, run, same_run, train_args, train_cmd

from rundir.step import verify_step
from trainer import eval_checkpoints, train

pytestmark = pytest.mark.slow


def test_run_directory_is_complete(short_run):
    run_dir = short_run
    info = json.loads((run_dir / "run.json").read_text())
    assert (
        info["arm"] == "S4" and info["policy_id"] == "affine-unresolved-failure-v2" and info["gate"] == "v2"
    )
    assert info["architecture"] == "Qwen3_5ForConditionalGeneration" and info["grader_version"]
    assert len(info["eval_sets"]["heldout300"]) == 6 and len(info["eval_sets"]["fixed32"]) == 3
    assert info["best_step"]["set"] == "heldout300"
    steps = rows(run_dir / "results" / "steps.jsonl", drop=())
    assert [r["step"] for r in steps] == [1, 2, 3]
    for key in ("loss", "learning_rate", "grad_norm", "groups", "outcomes_sampled", "outcomes_trained",
                "reward_mean", "logprob_median", "entropy_mean", "completion_length", "tokens_trained",
                "seconds", "sampler", "gate_stat"):  # fmt: skip
        assert key in steps[0], key
    assert sum(r["tokens_trained"] for r in steps) > 0, "no group qualified: the test would prove nothing"
    assert {"eval"} <= set(steps[1]) and {"eval"} <= set(steps[2]) and "eval" not in steps[0]
    for step in (0, 2, 3):
        evals = rows(run_dir / "results" / f"eval_step{step:03d}.jsonl", drop=())
        assert len(evals) == 6 * 1 + 3 * 2 and {r["step"] for r in evals} == {step}
    for step in (1, 2, 3):
        ckpt = run_dir / f"step{step:03d}"
        config = json.loads((ckpt / "config.json").read_text())
        assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
        weights = load_file(ckpt / "model.safetensors")
        assert {str(t.dtype) for t in weights.values()} == {"torch.bfloat16"}
        assert any("visual" in k for k in weights)  # the vision tower rides along
        assert "capgrpo" in (ckpt / "README.md").read_text()
        verify_step(ckpt)  # hashed at save (issue 30, case 2) ...
        assert {p.stat().st_mode & 0o777 for p in ckpt.iterdir()} == {0o644}  # ... and shared (case 6)
    assert sorted(p.name for p in run_dir.glob("state*")) == ["state002", "state003"]  # keep_states=2
    assert (run_dir / "README.md").is_file()
    assert not (run_dir / ".lock").exists()  # the run's lock goes with the run


def test_sigkill_then_resume_is_bitwise_identical(short_run, tiny_base, embedded_snapshot, tmp_path):
    """SIGKILL after state001/, then --resume: the same rows, weights and state as the uninterrupted shared run, BEMA's
    averaged model and buffers included (the run keeps the shared run's callbacks but its hook log)."""
    out = tmp_path / "S4"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        train_cmd(tiny_base, embedded_snapshot, out, callbacks=RESUMABLE),
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.time() + 600
    while not (out / "state001").is_dir():
        assert proc.poll() is None and time.time() < deadline, "training ended before state001 appeared"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the trainer and its grader workers, mid-run
    proc.wait()
    assert not (out / "step003").exists() and not (out / "bema").exists()
    exited = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (out / f".state002.tmp-{int(exited.stdout)}").mkdir()  # as a save killed mid-way leaves it
    (out / f".run.json.tmp-{int(exited.stdout)}-x1y2z3").write_text('{"ha')  # and a run.json write
    original = json.loads((out / "run.json").read_text())

    run(train_cmd(tiny_base, embedded_snapshot, out, callbacks=RESUMABLE, resume=out))
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]  # removed at the start
    info = json.loads((out / "run.json").read_text())
    assert {k: v for k, v in info.items() if k not in ("resumes", "best_step")} == {
        k: v for k, v in original.items() if k != "best_step"
    }  # the run's own record is never rewritten by a resume ...
    assert [(e["from_state"], e["changed"]) for e in info["resumes"]] == [
        ("state001", {})
    ]  # ... only added to
    same_run(out, short_run)


def test_fresh_run_into_a_finished_run_is_refused_and_changes_nothing(
    short_run, tiny_base, embedded_snapshot, capsys
):
    # in this process (`python -m trainer.train` is `train.main`): the refusal comes before any model or
    # worker starts, so a subprocess would only add its imports (tests/test_resume_refusals.py does the same)
    before = {p: p.read_bytes() for p in sorted(short_run.rglob("*")) if p.is_file()}
    with pytest.raises(SystemExit) as exit:
        train.main(train_args(tiny_base, embedded_snapshot, output_dir=short_run))
    err = capsys.readouterr().err
    assert exit.value.code == 1 and err.strip().splitlines()[-1].startswith(
        f"error: output_dir {short_run} is not empty"
    )
    assert "Traceback" not in err
    assert {p: p.read_bytes() for p in sorted(short_run.rglob("*")) if p.is_file()} == before


def test_standalone_eval_reproduces_training_rows(short_run):
    """`make eval` (`python -m trainer.eval_checkpoints`, i.e. `eval_checkpoints.main`, here in this process) on saved
    checkpoints gives byte-identical rows to the in-training evaluation."""
    files = [short_run / "results" / f"eval_step{s:03d}.jsonl" for s in (2, 3)]
    before = [f.read_bytes() for f in files]
    assert eval_checkpoints.main([str(short_run), "--steps", "2,3"]) == 0
    assert [f.read_bytes() for f in files] == before
