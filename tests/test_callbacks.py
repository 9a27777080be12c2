"""Callbacks under CapGRPOTrainer (trainer/callbacks.py, docs/training.md "Reusing TRL callbacks"): entries of
`callbacks:` / `--callbacks` resolved or refused by name before the model loads; every TRL 1.16 callback class
runs or is refused with its reason; stock callbacks and a `report_to` backend see our per-step metrics; a
user callback from a module path; callback state saved in stateNNN/ and restored; a stopping callback."""

import json
import os
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file
from scripted import make_trainer, tiny_random_model
from short_run import BEMA, EVALUATED, run, same_run, train_args, train_cmd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from transformers import AutoTokenizer
from trl.trainer.callbacks import BEMACallback, RichProgressCallback, SyncRefModelCallback

from rundir.state import StateError, load_state
from trainer import setup, train
from trainer.callbacks import (
    FrozenSafeBEMACallback,
    export_callback_state,
    refuse_unsaved_state,
    resolve_callbacks,
    restore_callback_state,
)
from trainer.config import ConfigError

REPO = Path(__file__).resolve().parent.parent

OURS = (
    "capgrpo/groups/qualified",
    "capgrpo/groups/sampled",
    "capgrpo/gate_stat",
    "capgrpo/outcomes/truncated",
)


class Recorder:
    """Wraps a stock callback's on_log, keeping what it was given."""

    def __init__(self, callback):
        self.logs: list[dict] = []
        original = callback.on_log

        def on_log(args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))
            return original(args, state, control, logs=logs, **kwargs)

        callback.on_log = on_log


@pytest.mark.slow
def test_rich_progress_and_tensorboard_receive_capgrpo_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))  # transformers 5's knob
    progress = RichProgressCallback()
    seen = Recorder(progress)
    script = {"p0": "CWTX", "p1": "CTTT", "p2": "CFWW", "p3": "WWWW"}
    trainer = make_trainer(
        tiny_random_model(),
        tmp_path,
        monkeypatch,
        "S2",
        script,
        max_steps=2,
        report_to=["tensorboard"],
        disable_tqdm=False,
    )
    trainer.add_callback(progress)
    trainer.train()

    steps = [log for log in seen.logs if "loss" in log]
    assert len(steps) == 2
    for log in steps:
        assert all(k in log for k in OURS), sorted(log)
        assert log["capgrpo/groups/qualified"] >= 1
    events = list((tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events, "the tensorboard backend wrote nothing"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {f"train/{k}" for k in OURS} <= tags, sorted(tags)
    assert [e.step for e in acc.Scalars("train/capgrpo/groups/qualified")] == [1, 2]


# --- entries: resolved, or refused by name before the model loads ----------------------------------------
def test_entries_resolve_from_every_form():
    got = resolve_callbacks(
        [
            "trl.RichProgressCallback",
            {"trl.BEMACallback": {"update_freq": 2}},
            'tests.callback_examples:StopAtStep={"step": 3}',
            {"tests.callback_examples:HookLog": {"path": "x.jsonl"}},
        ]
    )
    assert [e.to_json() for e in got] == [
        {"path": "trl.RichProgressCallback", "class": "trl.trainer.callbacks.RichProgressCallback",
         "kwargs": {}, "state": "none"},
        {"path": "trl.BEMACallback", "class": "trainer.callbacks.FrozenSafeBEMACallback",
         "kwargs": {"update_freq": 2}, "state": "tensors"},
        {"path": "tests.callback_examples:StopAtStep", "class": "tests.callback_examples.StopAtStep",
         "kwargs": {"step": 3}, "state": "attributes"},
        {"path": "tests.callback_examples:HookLog", "class": "tests.callback_examples.HookLog",
         "kwargs": {"path": "x.jsonl"}, "state": "unsaved"},
    ]  # fmt: skip
    assert [e.needs_trainer for e in got] == [False, False, False, True]
    assert resolve_callbacks("trl.BEMACallback")[0].cls is FrozenSafeBEMACallback  # a bare string: one entry


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            "no_such_pkg.mod:Thing",
            "callbacks: no_such_pkg.mod:Thing: cannot be imported (ModuleNotFoundError",
        ),
        ("trl.NoSuchCallback", "callbacks: trl.NoSuchCallback: cannot be imported (AttributeError"),
        ("BEMACallback", "callbacks: BEMACallback: not an import path"),
        (
            "json.JSONDecoder",
            "callbacks: json.JSONDecoder: <class 'json.decoder.JSONDecoder'> is not a trans",
        ),
        ('trl.BEMACallback={"update_freq": 2', "callbacks: trl.BEMACallback: keyword arguments are not JSON"),
        (
            {"trl.BEMACallback": {"every": 2}},
            "callbacks: trl.BEMACallback: got an unexpected keyword argument",
        ),
        (
            {"tests.callback_examples:StopAtStep": None},
            "callbacks: tests.callback_examples:StopAtStep: missing",
        ),
        ({"trl.BEMACallback": [2]}, "callbacks: trl.BEMACallback: keyword arguments must be a mapping"),
        (
            'trl.BEMACallback={"update_freq": NaN}',
            "callbacks: trl.BEMACallback: keyword arguments are not JSON (NaN is not a JSON number)",
        ),
    ],
)
def test_an_entry_that_cannot_be_imported_or_built_is_refused_by_name(entry, says):
    with pytest.raises(ConfigError) as e:
        resolve_callbacks([entry])
    assert str(e.value).startswith(says), str(e.value)


@pytest.mark.parametrize(
    "path, reason",
    [
        ("transformers.EarlyStoppingCallback", "on_evaluate"),
        ("trl.LogCompletionsCallback", "eval_dataset"),
        ("trl.WeaveCallback", "needs the `weave` package"),
        ("trl.SyncRefModelCallback", "set `sync_ref_model: true`"),
    ],
)
def test_callbacks_that_cannot_work_under_our_trainer_are_refused_with_the_reason(path, reason):
    with pytest.raises(
        ConfigError, match=f"callbacks: {path}: not supported under CapGRPOTrainer: .*{reason}"
    ):
        resolve_callbacks([path])


def test_a_refused_entry_is_one_line_before_the_model_loads(tmp_path, monkeypatch, capsys):
    def touched(*args, **kwargs):
        raise AssertionError("the model was loaded before the callbacks were checked")

    monkeypatch.setattr(setup, "load_base_model", touched)
    out = tmp_path / "run"
    argv = ["--config", str(REPO / "configs/embedded.yaml"), "--output_dir", str(out), "--report_to", "none",
            "--callbacks", "trl.RichProgressCallback", "my_pkg.nowhere:MyCallback"]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and err[-1].startswith("error: callbacks: my_pkg.nowhere:MyCallback: cannot be")
    assert "Traceback" not in "\n".join(err) and not out.exists()


@pytest.mark.parametrize(
    "source, says",
    [
        ('raise RuntimeError("no GPU here\\nsecond line")', "(RuntimeError: no GPU here second line)"),
        ("def broken(:\n", "(SyntaxError: "),
        ("import os\nos.environ['CAPGRPO_NO_SUCH']  # KeyError at import\n", "(KeyError: 'CAPGRPO_NO_SUCH')"),
    ],
    ids=["runtime-error", "syntax-error", "key-error"],
)
def test_a_callback_module_raising_at_import_is_one_line_naming_it(
    tmp_path, monkeypatch, capsys, source, says
):
    """Anything a user's module raises at import, not only ImportError, is the entry's refusal (issue 61)."""
    (tmp_path / "raising_cb.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "run"
    argv = ["--config", str(REPO / "configs/embedded.yaml"), "--output_dir", str(out), "--report_to", "none",
            "--callbacks", "raising_cb:MyCallback"]  # fmt: skip
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("error: callbacks: raising_cb:MyCallback: cannot be imported " + says), err
    assert not out.exists()


def test_a_resume_refuses_a_callback_whose_state_is_not_saved():
    hooks, stop = resolve_callbacks(
        [
            {"tests.callback_examples:HookLog": {"path": "x"}},
            {"tests.callback_examples:StopAtStep": {"step": 1}},
        ]
    )
    with pytest.raises(
        ConfigError, match="callbacks: tests.callback_examples:HookLog: its state is not saved"
    ):
        refuse_unsaved_state([stop, hooks], {})
    with pytest.raises(StateError, match="no saved state for callback tests.callback_examples:StopAtStep"):
        refuse_unsaved_state([stop], {})  # a state written without it
    refuse_unsaved_state([stop], {"StopAtStep#0": {"class": "tests.callback_examples.StopAtStep"}})


# --- BEMA under a frozen vision tower, and its state --------------------------------------------------------
class Frozen(torch.nn.Module):
    """A frozen first parameter (as our vision tower), then trainable ones; BEMA rebuilds it from `config`."""

    def __init__(self, config=None):
        super().__init__()
        self.config = config
        self.visual = torch.nn.Parameter(torch.ones(3), requires_grad=False)
        self.a = torch.nn.Parameter(torch.zeros(2))
        self.b = torch.nn.Parameter(torch.zeros(4))


def bema_steps(cb, model, steps: int):
    args, control = SimpleNamespace(), SimpleNamespace()
    cb.on_train_begin(args, SimpleNamespace(global_step=0), control, model=model)
    for step in range(1, steps + 1):
        with torch.no_grad():
            model.a.add_(1.0)
            model.b.sub_(2.0)
        cb.on_step_end(args, SimpleNamespace(global_step=step), control, model=model)


def test_trls_bema_fails_with_a_frozen_parameter_and_ours_averages_the_trainable_ones():
    with pytest.raises(RuntimeError):  # when TRL fixes this, FrozenSafeBEMACallback can go
        bema_steps(BEMACallback(update_freq=1), Frozen(), 1)
    cb, model = FrozenSafeBEMACallback(update_freq=1, lag=1, ema_power=0.5, bias_power=0.0), Frozen()
    bema_steps(cb, model, 1)
    # step 1: beta = (1 + 1)^-0.5, alpha = 1: ema = (1 - beta)·θ₀ + beta·θ₁, running = ema + (θ₁ - θ₀)
    beta = 2**-0.5
    assert torch.allclose(cb.running_model.a, torch.full((2,), beta * 1.0 + 1.0))
    assert torch.allclose(cb.running_model.b, torch.full((4,), beta * -2.0 - 2.0))
    assert torch.equal(cb.running_model.visual, torch.ones(3))


def test_callback_state_round_trips_and_a_missing_one_is_refused():
    from tests.callback_examples import StopAtStep

    def trainer_with(*cbs):
        return SimpleNamespace(callback_handler=SimpleNamespace(callbacks=list(cbs)))

    cb, stop = FrozenSafeBEMACallback(update_freq=1), StopAtStep(step=1)
    bema_steps(cb, Frozen(), 2)
    stop.stopped = True
    tensors, meta = export_callback_state(trainer_with(RichProgressCallback(), cb, stop))
    assert sorted(meta) == ["FrozenSafeBEMACallback#0", "StopAtStep#0"]
    assert meta["StopAtStep#0"]["state"] == {"args": {"step": 1}, "attributes": {"stopped": True}}
    assert sorted(tensors) == [f"callbacks/FrozenSafeBEMACallback#0/{k}/{n}" for k in ("ema", "running", "theta0")
                               for n in ("a", "b")]  # fmt: skip

    fresh, fresh_stop = FrozenSafeBEMACallback(update_freq=1), StopAtStep(step=1)
    bema_steps(fresh, Frozen(), 0)  # on_train_begin of a resumed run, from other weights
    restore_callback_state(trainer_with(fresh, fresh_stop), tensors, meta)
    assert fresh_stop.stopped is True
    for mine, saved in ((fresh.ema_params, cb.ema_params), (fresh.theta0_params, cb.theta0_params)):
        assert all(torch.equal(x, y) for x, y in zip(mine, saved, strict=True))
    assert torch.equal(fresh.running_model.b, cb.running_model.b)
    with pytest.raises(StateError, match=r"no saved state for callback StopAtStep#0"):
        restore_callback_state(trainer_with(fresh_stop), tensors, {})


# --- end to end on the shipped embedded base (subprocesses, as `make train` runs) ----------------------------
# The session's shared short run (conftest.py `short_run`, tests/short_run.py): 3 steps, a state at each of
# steps 1-3 (2 kept), evaluation at steps 0, 2 and 3, BEMA averaging every step, a stop that never fires, and
# a hook log built with the trainer. SIGKILL and resume with BEMA: tests/test_train_e2e.py
# ::test_sigkill_then_resume_is_bitwise_identical (it compares BEMA's averaged model and buffers too).
@pytest.mark.slow
def test_a_user_callback_sees_our_metrics_and_evaluation_through_on_log(short_run):
    info = json.loads((short_run / "run.json").read_text())
    assert [c["class"] for c in info["callbacks"]] == [
        "trainer.callbacks.FrozenSafeBEMACallback", "tests.callback_examples.StopAtStep",
        "tests.callback_examples.HookLog"]  # fmt: skip
    assert "trl.BEMACallback" in (short_run / "README.md").read_text()
    seen = [json.loads(line) for line in (short_run.parent / "hooks.jsonl").read_text().splitlines()]
    assert seen[0] == {"hook": "on_train_begin", "step": 0, "trainer": "CapGRPOTrainer"}
    assert {s["hook"] for s in seen} == {
        "on_train_begin",
        "on_step_end",
        "on_log",
        "on_train_end",
    }  # no on_evaluate
    logs = {s["step"]: s["keys"] for s in seen if s["hook"] == "on_log" and "train_runtime" not in s["keys"]}
    assert sorted(logs) == [0, 1, 2, 3]
    for step in EVALUATED:  # step 0's evaluation has a log of its own; later ones join their step's
        assert "eval/heldout300/accuracy" in logs[step], step
    for step in (1, 2, 3):
        assert {"loss", "capgrpo/gate_stat", "capgrpo/groups/qualified", "capgrpo/outcomes/truncated"} <= set(
            logs[step]
        )
    assert "eval/heldout300/accuracy" not in logs[1]


@pytest.mark.slow
def test_resume_refuses_a_callback_whose_state_is_not_saved(short_run, tiny_base, embedded_snapshot, capsys):
    before = {p: p.read_bytes() for p in sorted(short_run.rglob("*")) if p.is_file()}
    info = json.loads((short_run / "run.json").read_text())
    argv = train_args(tiny_base, embedded_snapshot, callbacks=info["config"]["callbacks"])
    argv += ["--output_dir", str(short_run), "--resume", str(short_run)]
    with pytest.raises(
        SystemExit
    ) as exit:  # `python -m trainer.train` in this process: refused before the model
        train.main(argv)
    err = capsys.readouterr().err
    assert exit.value.code == 1 and "Traceback" not in err
    assert (
        err.strip()
        .splitlines()[-1]
        .startswith("error: callbacks: tests.callback_examples:HookLog: its state is not saved in stateNNN/")
    )
    assert {p: p.read_bytes() for p in sorted(short_run.rglob("*")) if p.is_file()} == before


@pytest.mark.slow
def test_a_stopping_callback_ends_the_run_cleanly_and_it_resumes_exactly(
    short_run, tiny_base, embedded_snapshot, tmp_path
):
    out, stop = tmp_path / "S", 'tests.callback_examples:StopAtStep={"step": 1}'
    run(train_cmd(tiny_base, embedded_snapshot, out, callbacks=(BEMA, stop)))
    steps = [json.loads(line)["step"] for line in (out / "results/steps.jsonl").read_text().splitlines()]
    assert steps == [1] and not (out / "step002").exists()
    assert (out / "step001/model.safetensors").is_file() and (
        out / "README.md"
    ).is_file()  # saved, card written
    _, meta = load_state(out / "state001")  # the stop is in the state: the resumed run does not stop again
    assert meta["callbacks"]["StopAtStep#0"]["state"]["attributes"] == {"stopped": True}
    run(train_cmd(tiny_base, embedded_snapshot, out, callbacks=(BEMA, stop), resume=out))
    same_run(out, short_run)


@pytest.mark.slow
def test_sync_ref_model_with_beta_runs_and_stateNNN_holds_the_reference(tiny_base, tmp_path, monkeypatch):
    """`sync_ref_model: true` (beta > 0): TRL adds SyncRefModelCallback with its reference model, which one
    step mixes toward the policy; export_callback_state saves that reference for the resume."""
    model, _ = setup.load_base_model(str(tiny_base), "float32")
    tok = AutoTokenizer.from_pretrained(tiny_base, padding_side="left")
    script = {"p0": "CWTX", "p1": "CWWC", "p2": "CFWW", "p3": "WWWW"}
    trainer = make_trainer((tok, model), tmp_path, monkeypatch, "S2", script, beta=0.04, sync_ref_model=True,
                           ref_model_sync_steps=1, ref_model_mixup_alpha=0.5)  # fmt: skip
    assert [type(cb) for cb in trainer.callback_handler.callbacks].count(SyncRefModelCallback) == 1
    before = {n: p.detach().clone() for n, p in trainer.ref_model.named_parameters()}
    trainer.train()
    policy, ref = dict(trainer.model.named_parameters()), dict(trainer.ref_model.named_parameters())
    moved = [n for n in before if not torch.equal(before[n], policy[n])]
    assert moved, "the step moved no weight: the test would prove nothing"
    for n in moved:  # ref ← (1 − α)·ref + α·policy
        assert torch.allclose(ref[n], 0.5 * before[n] + 0.5 * policy[n])
    tensors, meta = export_callback_state(trainer)
    assert meta == {"SyncRefModelCallback#0": {"class": "trl.trainer.callbacks.SyncRefModelCallback"}}
    assert all(torch.equal(tensors[f"callbacks/SyncRefModelCallback#0/ref/{n}"], ref[n].float()) for n in ref)


@pytest.mark.slow
def test_sigterm_ends_the_run_after_its_step_saved_and_resume_is_bitwise_identical(
    short_run, tiny_base, embedded_snapshot, tmp_path
):
    """trainer/stop_signal.py: a scheduler's SIGTERM at step 1 (not a checkpoint step here) ends the run with
    status 0 after step 1, saved; the resume finishes it exactly as the uninterrupted shared run."""
    out, signal_at = tmp_path / "T", 'tests.callback_examples:SignalAtStep={"step": 1}'
    launch = dict(callbacks=(BEMA, signal_at), checkpoint_steps="2")
    proc = run(train_cmd(tiny_base, embedded_snapshot, out, **launch))
    assert "stopping after step 1 on SIGTERM" in proc.stderr
    assert json.loads((out / "run.json").read_text())["config"]["checkpoint_steps"] == [2]
    assert (out / "state001").is_dir() and (out / "step001").is_dir() and not (out / "step002").exists()
    rows = (out / "results/steps.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in rows] == [1]
    run(train_cmd(tiny_base, embedded_snapshot, out, resume=out, **launch))
    same_run(out, short_run)


def _guarded_linear(skip: bool):
    from trainer.finite_gradients import NonFiniteGradientGuard
    from trainer.step_record import StepRecord

    model = torch.nn.Linear(3, 2)
    trainer = SimpleNamespace(
        model=model, accelerator=SimpleNamespace(device="cpu", num_processes=1), step_record=StepRecord()
    )
    return model, trainer, NonFiniteGradientGuard(trainer, skip=skip)


def test_a_nan_gradient_is_not_applied_and_stops_the_run_in_one_line():
    """nonfinite_gradient: stop: a NaN or inf norm raises before the optimizer step; finite ones pass."""
    from trainer.finite_gradients import NonFiniteGradientError

    model, _, guard = _guarded_linear(skip=False)
    args, state = SimpleNamespace(output_dir="runs/x"), SimpleNamespace(global_step=4)
    guard.on_pre_optimizer_step(args, state, None)  # no gradients yet: nothing to check
    model(torch.ones(1, 3)).sum().backward()
    guard.on_pre_optimizer_step(args, state, None)
    for bad in (float("nan"), float("inf")):
        model.weight.grad[0, 0] = bad
        with pytest.raises(NonFiniteGradientError, match=r"runs/x: step 5: the gradient norm is (nan|inf)"):
            guard.on_pre_optimizer_step(args, state, None)


@pytest.mark.parametrize("fused", [False, True])
def test_a_skipped_nan_step_leaves_weights_and_adamw_state_as_they_were(fused):
    """nonfinite_gradient: skip: the step's gradients are dropped, so AdamW moves nothing (weights, moments,
    step count), the row says update_skipped; a finite step after it updates as usual."""
    model, trainer, guard = _guarded_linear(skip=True)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused)
    args, state = SimpleNamespace(output_dir="runs/x"), SimpleNamespace(global_step=4)

    def step(poison: bool) -> None:
        model(torch.ones(1, 3)).sum().backward()
        if poison:
            model.bias.grad[0] = float("nan")
        guard.on_pre_optimizer_step(args, state, None)
        opt.step()
        opt.zero_grad()

    step(poison=False)
    before = [t.clone() for t in (model.weight, model.bias)]
    moments = {k: {n: v.clone() for n, v in s.items()} for k, s in enumerate(opt.state.values())}
    step(poison=True)
    assert trainer.step_record.update_skipped
    assert all(torch.equal(a, b) for a, b in zip(before, (model.weight, model.bias), strict=True))
    after = {k: s for k, s in enumerate(opt.state.values())}
    assert all(torch.equal(moments[k][n], after[k][n]) for k in moments for n in moments[k])
    trainer.step_record = type(trainer.step_record)()
    step(poison=False)
    assert not trainer.step_record.update_skipped and not torch.equal(before[0], model.weight)
    assert all(s["step"].item() == 2 for s in opt.state.values())


@pytest.mark.slow
def test_a_run_whose_gradient_turns_nan_stops_there_with_its_last_state_intact(
    tiny_base, embedded_snapshot, tmp_path
):
    out = tmp_path / "N"
    nan = 'tests.callback_examples:NaNGradientAtStep={"step": 2}'
    proc = subprocess.run(train_cmd(tiny_base, embedded_snapshot, out, callbacks=(nan,)), cwd=REPO,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 1, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {out}: step 2: the gradient norm is nan"), last
    steps = [json.loads(line)["step"] for line in (out / "results/steps.jsonl").read_text().splitlines()]
    assert steps == [1] and not (out / "state002").exists()
    tensors, meta = load_state(out / "state001")  # what --resume continues from: step 1's, finite
    assert meta["step"] == 1 and all(
        torch.isfinite(t).all() for t in tensors.values() if t.is_floating_point()
    )


@pytest.mark.slow
def test_a_run_told_to_skip_nan_updates_skips_that_step_and_goes_on(tiny_base, embedded_snapshot, tmp_path):
    """nonfinite_gradient: skip: step 2's NaN gradient is not applied (step 2's weights are step 1's), its row
    says so, and step 3 trains from there."""
    out = tmp_path / "K"
    nan = 'tests.callback_examples:NaNGradientAtStep={"step": 2}'
    cmd = train_cmd(tiny_base, embedded_snapshot, out, callbacks=(nan,), nonfinite_gradient="skip")
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True,
                          text=True, timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{out}: step 2: the gradient norm is nan (not finite): its update is skipped" in proc.stderr
    rows = [json.loads(line) for line in (out / "results/steps.jsonl").read_text().splitlines()]
    assert [(r["step"], r["update_skipped"]) for r in rows] == [(1, False), (2, True), (3, False)]
    assert all(r["nonfinite_losses"] == 0 for r in rows)  # the NaN comes after the loss (NaNGradientAtStep)

    def weights(step: int) -> dict:
        return {
            k: v
            for f in sorted((out / f"step{step:03d}").glob("*.safetensors"))
            for k, v in load_file(f).items()
        }

    one, two, three = weights(1), weights(2), weights(3)
    assert all(torch.equal(one[k], two[k]) for k in one)
    assert any(not torch.equal(two[k], three[k]) for k in two)
