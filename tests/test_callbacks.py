"""Stock TRL/Trainer callbacks and a `report_to` backend see our per-step metrics."""

import pytest
from scripted import make_trainer, tiny_random_model
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from trl.trainer.callbacks import RichProgressCallback

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
