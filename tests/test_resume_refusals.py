"""Refusals of `python -m trainer.train` on a run directory (issue 15): each one is a single `error: ...`
line with exit status 1, comes before the model is loaded, and leaves every byte of the run directory as it
was. The run directory is made by hand in the real format (save_state, run.json from the parsed config), so
no training is needed; loading the model is replaced by a sentinel that proves the refusals came first."""

import errno
import hashlib
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from trl import ModelConfig, TrlParser

from data.snapshot import write_snapshot
from engine.micro_batch import MicroBatch
from rundir.run_json import record_resume, versions
from rundir.state import capture_rng_state, save_state
from rundir.step import write_manifest
from trainer import setup, train
from trainer.checkpoint import is_verified, prune_states
from trainer.config import CapGRPOConfig

REPO = Path(__file__).resolve().parent.parent
POLICY = "affine-unresolved-zero-reward-active-v1"  # S2's


class ModelTouched(Exception):
    pass


def tree_digest(root: Path) -> str:
    """Every path under `root` (hidden ones included) with its bytes."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        if p.is_file():
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


@pytest.fixture
def inputs(tmp_path, monkeypatch) -> dict:
    snapshot = tmp_path / "tiny.tasks.json"
    write_snapshot(
        [{"id": f"t{i:03d}", "problem": f"{i} + 1", "answer": str(i + 1)} for i in range(400)], snapshot
    )
    base = tmp_path / "base"
    base.mkdir()

    def touched(*args, **kwargs):
        raise ModelTouched

    monkeypatch.setattr(setup, "load_base_model", touched)
    return {"snapshot": snapshot, "base": base, "run": tmp_path / "runs" / "S2"}


def argv(inputs: dict, *extra: str) -> list[str]:
    return ["--config", str(REPO / "configs/embedded.yaml"), "--arm", "S2", "--output_dir", str(inputs["run"]),
            "--model_name_or_path", str(inputs["base"]), "--snapshot_path", str(inputs["snapshot"]),
            "--snapshot_sha256", hashlib.sha256(inputs["snapshot"].read_bytes()).hexdigest(),
            "--report_to", "none", "--checkpoint_steps", "2", "3", *extra]  # fmt: skip


def make_run(inputs: dict, states=(2, 3)) -> Path:
    """A run stopped after step 3 with states at 2 and 3, in the format train.py writes."""
    args, model_args = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(argv(inputs))
    args = setup.settled(args, setup.resolve(args), world=1)  # the run's settings, as run.json records them
    args = setup.batch_arithmetic(args, MicroBatch(args.per_device_train_batch_size, False, 0, "explicit"), 1)
    run = inputs["run"]
    (run / "results").mkdir(parents=True)
    info = {"arm": "S2", "policy_id": POLICY, "config": json.loads(args.to_json_string()),
            "base_model": model_args.model_name_or_path, "versions": versions(),
            "snapshot": {"path": str(inputs["snapshot"]),
                         "sha256": hashlib.sha256(inputs["snapshot"].read_bytes()).hexdigest()}}  # fmt: skip
    (run / "run.json").write_text(json.dumps(info, indent=2))
    rows = [{"step": s, "arm": "S2", "loss": 0.1 * s} for s in (1, 2, 3)]
    (run / "results" / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for s in (1, 2, 3):
        make_step(run, s)
    for s in states:
        meta = {"step": s, "arm": "S2", "policy_id": POLICY, "rng": [capture_rng_state()],
                "task_sampler": {"seed": 0, "epoch": 0, "position": 8 * s}}  # fmt: skip
        save_state(run / f"state{s:03d}", tensors={"master/w": torch.full((300,), float(s))}, meta=meta,
                   extra_json={"trainer_state.json": {"global_step": s}}, shard_bytes=512)  # fmt: skip
    return run


def make_step(run: Path, step: int) -> Path:
    """A stepNNN/ as save_weights leaves it: config, weights, manifest."""
    d = run / f"step{step:03d}"
    d.mkdir(parents=True)
    (d / "config.json").write_text("{}")
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    write_manifest(d)
    return d


def refused(inputs: dict, capsys, *extra: str) -> str:
    """Run trainer.train, expect exit 1 with one `error:` line on stderr; return that line."""
    with pytest.raises(SystemExit) as exit:
        train.main(argv(inputs, *extra))
    assert exit.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: ") and "Traceback" not in "\n".join(err)
    return err[-1]


def accepted(inputs: dict, *extra: str) -> None:
    """Every refusal passed: the next thing is loading the model."""
    with pytest.raises(ModelTouched):
        train.main(argv(inputs, *extra))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def edit_meta(field: str, value):
    def edit(state: Path) -> None:
        meta = json.loads((state / "meta.json").read_text())
        meta[field] = value
        (state / "meta.json").write_text(json.dumps(meta, sort_keys=True, indent=1))

    return edit


# --- items 1-3: a broken newest state is named and refused, unless --resume-fallback -------------------
@pytest.mark.parametrize(
    "damage, culprit, what",
    [
        (lambda s: truncate(s / "shard-00001-of-00003.safetensors"), "shard-00001-of-00003.safetensors", "truncated"),
        (lambda s: flip(s / "shard-00000-of-00003.safetensors"), "shard-00000-of-00003.safetensors", "sha256 mismatch"),
        (lambda s: (s / "descriptor.json").unlink(), "descriptor.json", "missing"),
        (lambda s: (s / "shard-00002-of-00003.safetensors").unlink(), "shard-00002-of-00003.safetensors", "missing"),
        (lambda s: (s / "meta.json").unlink(), "meta.json", "missing"),
        (lambda s: flip(s / "descriptor.json"), "descriptor.json", "does not match"),
        (edit_meta("step", 2), "meta.json", "sha256 mismatch"),
        (edit_meta("rng", [{}]), "meta.json", "descriptor.json says"),
        (edit_meta("task_sampler", {"seed": 0, "epoch": 0, "position": 88}), "meta.json", "sha256 mismatch"),
        (lambda s: flip(s / "trainer_state.json"), "trainer_state.json", "sha256 mismatch"),
    ],
)  # fmt: skip
def test_broken_newest_state_is_named_and_refused(inputs, capsys, damage, culprit, what):
    run = make_run(inputs)
    damage(run / "state003")
    before = tree_digest(run)
    line = refused(inputs, capsys, "--resume", str(run))
    assert f"state003/{culprit}" in line and what in line
    assert "the newest complete state is state002/" in line and "--resume-fallback" in line
    assert tree_digest(run) == before


def test_fallback_resumes_from_the_newest_complete_state_and_says_so(inputs, caplog):
    run = make_run(inputs)
    truncate(run / "state003" / "shard-00001-of-00003.safetensors")
    before = tree_digest(run)
    with caplog.at_level(logging.WARNING):
        accepted(inputs, "--resume", str(run), "--resume-fallback")
    assert "skipping a broken state" in caplog.text and "state003/shard-00001-of-00003" in caplog.text
    assert tree_digest(run) == before  # nothing is written before the model is loaded


def test_no_complete_state_is_refused(inputs, capsys):
    run = make_run(inputs)
    for s in ("state002", "state003"):
        (run / s / "descriptor.sha256").unlink()  # both interrupted before their seal
    before = tree_digest(run)
    line = refused(inputs, capsys, "--resume", str(run))
    assert (
        f"no complete state to resume from in {run}" in line and "state002/descriptor.sha256: missing" in line
    )
    assert tree_digest(run) == before


def test_state_without_its_row_or_weights_is_not_resumed(inputs, capsys):
    run = make_run(inputs)
    rows = (run / "results" / "steps.jsonl").read_text().splitlines()
    (run / "results" / "steps.jsonl").write_text(rows[0] + "\n" + rows[1] + "\n")  # row 3 lost
    before = tree_digest(run)
    assert "steps.jsonl: no row for step 3" in refused(inputs, capsys, "--resume", str(run))
    assert tree_digest(run) == before


# --- item 4: the resolved config against run.json ----------------------------------------------------
@pytest.mark.parametrize(
    "flags, shown",
    [
        (["--learning_rate", "5e-5"], "learning_rate 0.0001 → 5e-05"),
        (["--max_completion_length", "64"], "max_completion_length 160 → 64"),
        (["--seed", "1", "--temperature", "0.7"], "seed 0 → 1"),
        (["--lr_scheduler_type", "linear", "--max_steps", "12"], "max_steps 20 → 12"),
    ],
)
def test_resume_refuses_config_changes_by_name(inputs, capsys, flags, shown):
    run = make_run(inputs)
    before = tree_digest(run)
    line = refused(inputs, capsys, "--resume", str(run), *flags)
    assert "run.json: a resume must keep the run's config" in line and shown in line
    assert tree_digest(run) == before


def test_resume_refuses_another_base_model_or_snapshot(inputs, capsys, tmp_path):
    run = make_run(inputs)
    before = tree_digest(run)
    other = tmp_path / "other-base"
    other.mkdir()
    line = refused(inputs, capsys, "--resume", str(run), "--model_name_or_path", str(other))
    assert f"model_name_or_path '{inputs['base']}' → '{other}'" in line
    inputs["snapshot"].write_text(inputs["snapshot"].read_text().replace('"t000"', '"t999"'))
    assert "snapshot sha256" in refused(inputs, capsys, "--resume", str(run))
    assert tree_digest(run) == before


def test_resume_accepts_harmless_changes(inputs, caplog):
    run = make_run(inputs)
    with caplog.at_level(logging.WARNING):
        accepted(inputs, "--resume", str(run), "--max_steps", "12", "--eval_every", "2", "--keep_states", "3")
    assert "resume accepts changed eval_every, keep_states, max_steps" in caplog.text


def test_resume_event_is_appended_and_the_original_kept(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"config": {"max_steps": 8}, "arm": "S2"}))
    record_resume(tmp_path, {"from_state": "state004", "step": 4, "changed": {"max_steps": [8, 12]}})
    record_resume(tmp_path, {"from_state": "state012", "step": 12, "changed": {}})
    info = json.loads((tmp_path / "run.json").read_text())
    assert info["config"] == {"max_steps": 8} and info["arm"] == "S2"
    assert [e["from_state"] for e in info["resumes"]] == ["state004", "state012"]
    assert info["resumes"][0]["changed"] == {"max_steps": [8, 12]}


# --- item 5: a new run never writes into a non-empty directory --------------------------------------
def test_fresh_run_into_a_non_empty_run_dir_is_refused(inputs, capsys):
    run = make_run(inputs)
    before = tree_digest(run)
    line = refused(inputs, capsys)
    assert (
        f"output_dir {run} is not empty" in line
        and f"--resume {run}" in line
        and "another --output_dir" in line
    )
    assert tree_digest(run) == before
    for d in run.iterdir():  # even a directory holding one stray file is another run's
        if d.name != "run.json":
            __import__("shutil").rmtree(d) if d.is_dir() else d.unlink()
    assert "holds run.json" in refused(inputs, capsys)


def test_resume_and_output_dir_must_agree(inputs, capsys, tmp_path):
    make_run(inputs)
    line = refused(inputs, capsys, "--resume", str(tmp_path / "elsewhere"))
    assert "resume:" in line and "is not output_dir" in line


# --- item 8: the traceback only on request ----------------------------------------------------------
def test_debug_shows_the_traceback(inputs, monkeypatch):
    make_run(inputs)
    with pytest.raises(Exception, match="is not empty"):
        train.main([*argv(inputs), "--debug"])
    monkeypatch.setenv("CAPGRPO_DEBUG", "1")
    with pytest.raises(Exception, match="is not empty"):
        train.main(argv(inputs))


# --- pruning (item 1) --------------------------------------------------------------------------------
def test_pruning_never_keeps_a_broken_state_over_a_verified_one(tmp_path):
    for s in (1, 2, 3, 4, 6):
        save_state(tmp_path / f"state{s:03d}", tensors={"w": torch.full((300,), float(s))}, meta={"step": s},
                   shard_bytes=512)  # fmt: skip
    for s in range(1, 8):
        make_step(tmp_path, s)
    truncate(tmp_path / "state003" / "shard-00000-of-00003.safetensors")  # the case
    flip(tmp_path / "state004" / "shard-00001-of-00003.safetensors")  # only its hash tells
    (tmp_path / "state006" / "descriptor.sha256").unlink()  # newest, never sealed: left for resume to name
    assert not is_verified(tmp_path / "state004") and is_verified(tmp_path / "state002")
    assert (
        prune_states(tmp_path, keep=2) == []
    )  # broken states newer than every verified one: resume names them
    save_state(tmp_path / "state005", tensors={"w": torch.ones(3)}, meta={"step": 5})  # the run goes on
    removed = prune_states(tmp_path, keep=2)
    assert sorted(p.name for p in removed) == ["state001", "state003", "state004"]
    assert sorted(p.name for p in tmp_path.glob("state*")) == ["state002", "state005", "state006"]
    save_state(tmp_path / "state007", tensors={"w": torch.ones(3)}, meta={"step": 7})
    prune_states(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.glob("state*")) == ["state005", "state007"]
    assert len(list(tmp_path.glob("step*"))) == 7  # weights are never pruned


def test_pruning_counts_a_state_with_broken_weights_as_broken(tmp_path):
    """Issue 30, case 2: a truncated step003/model.safetensors made pruning delete state002 and keep state003."""
    for s in (2, 3):
        save_state(tmp_path / f"state{s:03d}", tensors={"w": torch.full((3,), float(s))}, meta={"step": s})
        make_step(tmp_path, s)
    truncate(tmp_path / "step003" / "model.safetensors")
    assert prune_states(tmp_path, keep=1) == []  # state003 is not resumable: left for resume to name
    assert sorted(p.name for p in tmp_path.glob("state*")) == ["state002", "state003"]


# --- issue 30: one writer per run directory, verified weights, torn rows, Ctrl-C, a full disk ---------
HOLD_LOCK = """
import sys, time
from rundir.lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(120)
"""


def hold_lock(run: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(run)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_process_is_refused_by_the_holders_pid_and_a_dead_holders_lock_taken_over(
    inputs, capsys, caplog
):
    """Case 1, with two real processes: a live holder refuses a resume (and a fresh run) by its pid; once it
    is SIGKILLed its lock file stays, and the next resume takes it over, names it, and removes it at the end."""
    run = make_run(inputs)
    before = tree_digest(run)
    holder = hold_lock(run)
    try:
        line = refused(inputs, capsys, "--resume", str(run))
        assert f"{run} is in use by another process (pid {holder.pid}, holding {run / '.lock'})" in line
        assert f"pid {holder.pid}" in refused(inputs, capsys)  # a fresh run into it: the same
    finally:
        holder.kill()
        holder.wait()
    assert (run / ".lock").read_text().split()[0] == str(holder.pid)  # what a SIGKILL leaves
    with caplog.at_level(logging.WARNING):
        accepted(inputs, "--resume", str(run))
    assert f"taking over the lock left by pid {holder.pid}" in caplog.text
    assert tree_digest(run) == before  # the lock file went with its last holder


def test_two_fresh_runs_into_one_empty_directory_one_is_refused(inputs, capsys):
    """Case 1: the window between the empty-directory check and run.json's write is under the lock."""
    holder = hold_lock(inputs["run"])
    try:
        assert f"pid {holder.pid}" in refused(inputs, capsys)
    finally:
        holder.kill()
        holder.wait()


def test_broken_weights_beside_the_newest_state_are_named_with_the_way_on(inputs, capsys):
    """Case 2: a truncated step003/model.safetensors resumed with exit 0 and no warning."""
    run = make_run(inputs)
    truncate(run / "step003" / "model.safetensors")
    before = tree_digest(run)
    line = refused(inputs, capsys, "--resume", str(run))
    assert f"{run / 'step003' / 'model.safetensors'}: size" in line and "(truncated)" in line
    assert "the newest complete state is state002/" in line and "--resume-fallback" in line
    accepted(inputs, "--resume", str(run), "--resume-fallback")
    assert tree_digest(run) == before


def test_a_torn_last_row_is_resumed_past_and_a_torn_middle_row_refused(inputs, capsys):
    """Case 3: what a crash during an append leaves (the row of step 4, past the newest state) is redone;
    an unparseable row before the last one is damage, refused by line."""
    run = make_run(inputs)
    steps = run / "results" / "steps.jsonl"
    good = steps.read_text()
    steps.write_text(good + '{"step": 4, "arm": "S2", "lo')
    accepted(inputs, "--resume", str(run))
    steps.write_text(good.replace('"step": 2,', '"step": 2'))  # row 2 damaged
    line = refused(inputs, capsys, "--resume", str(run))
    assert f"{steps}:2: not valid JSON" in line


def test_ctrl_c_prints_one_line_with_the_step_and_the_resume(inputs, capsys, monkeypatch):
    """Case 8: a KeyboardInterrupt (here while the model loads) ends in one line, status 130."""
    run = make_run(inputs)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(setup, "load_base_model", interrupted)
    with pytest.raises(SystemExit) as exit:
        train.main(argv(inputs, "--resume", str(run)))
    assert exit.value.code == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"interrupted at step 3; resume with --resume {run} (it continues from state003/)"
    assert "Traceback" not in "\n".join(err)


def test_a_full_disk_outside_the_savers_is_one_line_naming_the_file(inputs, capsys, monkeypatch):
    """Case 4: ENOSPC from any writer of a run (here one raised while the model loads)."""
    make_run(inputs)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(inputs["run"] / "runs" / "events.out"))

    monkeypatch.setattr(setup, "load_base_model", full)
    line = refused(inputs, capsys, "--resume", str(inputs["run"]))
    assert (
        line
        == f"error: {inputs['run'] / 'runs' / 'events.out'}: not written, the disk is full (free some space, then resume)"
    )


def test_resume_trains_in_the_runs_recorded_micro_batches(inputs, monkeypatch):
    """The micro-batch a run chose at its start (run.json launch.micro_batch) is the resume's, set before the
    model loads, so a resume never re-sizes it (free GPU memory may differ by then)."""
    run = make_run(inputs)
    info = json.loads((run / "run.json").read_text())
    recorded = {"rows": 16, "checkpointing": False, "tokens_per_row": 220, "basis": "explicit"}
    (run / "run.json").write_text(json.dumps({**info, "launch": {"micro_batch": recorded}}))
    adopted = []

    def built(model, args, *, run, **kwargs):
        adopted.append(run.micro_batch.to_json())
        raise ModelTouched

    monkeypatch.setattr(setup, "load_base_model", lambda *a: (types.SimpleNamespace(config=None), "Stub"))
    monkeypatch.setattr(setup, "refuse_past_positions", lambda *a: None)
    monkeypatch.setattr(setup.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(setup, "CapGRPOTrainer", built)
    accepted(inputs, "--resume", str(run))
    # a run.json from before adamw_state_on_gpu resumes with the state where it was: on the host
    assert adopted == [{**recorded, "adamw_state_on_gpu": False}]


@pytest.mark.parametrize("name", ["step003", "state003"])
def test_a_kill_inside_a_resave_is_put_back_before_the_states_are_judged(inputs, caplog, name):
    """Issue 49: a kill between the two renames of a re-save leaves `.step003.old-<pid>/` and no step003/;
    the resume refused state003 as broken (and offered --resume-fallback, which throws the newest good state
    away) because the put-back ran only after the states were judged."""
    run = make_run(inputs)
    dead = 2**22 + 12345  # above any pid this machine hands out (pid_max 4194304)
    (run / name).rename(run / f".{name}.old-{dead}")
    (run / f".{name}.tmp-{dead}").mkdir()  # the new copy that was being installed
    with caplog.at_level(logging.WARNING):
        accepted(inputs, "--resume", str(run))
    assert (run / name).is_dir() and not (run / f".{name}.old-{dead}").exists()
    assert f"{run / name}: put back" in caplog.text and "skipping a broken state" not in caplog.text


def test_a_run_whose_micro_batch_was_sized_resumes(inputs, tmp_path):
    """A recipe that leaves per_device_train_batch_size unset: run.json's config holds the rows the run chose
    (launch.micro_batch) and the resume compares in those, not the declaration's unset value."""
    import yaml

    recipe = yaml.safe_load((REPO / "configs/embedded.yaml").read_text())
    del recipe["per_device_train_batch_size"]
    (tmp_path / "auto.yaml").write_text(yaml.safe_dump(recipe))
    run = make_run(inputs)  # its config: the 16 rows it trained in
    info = json.loads((run / "run.json").read_text())
    chosen = {"rows": 16, "checkpointing": False, "tokens_per_row": 220, "basis": "cpu: 16384 tokens"}
    (run / "run.json").write_text(json.dumps({**info, "launch": {"micro_batch": chosen}}))
    auto = argv(inputs, "--resume", str(run))
    auto[auto.index("--config") + 1] = str(tmp_path / "auto.yaml")
    with pytest.raises(ModelTouched):
        train.main(auto)
