"""Callbacks of a user's own module, named by path in tests (`tests.callback_examples:StopAtStep`)."""

import json
import os
import signal
from pathlib import Path

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState


class StopAtStep(TrainerCallback, ExportableState):
    """Stops training once, at the end of step `step` (its `stopped` flag is saved and restored on resume)."""

    def __init__(self, step: int):
        self.step, self.stopped = step, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.stopped:
            self.stopped = control.should_training_stop = True

    def state(self) -> dict:
        return {"args": {"step": self.step}, "attributes": {"stopped": self.stopped}}


class SignalAtStep(TrainerCallback, ExportableState):
    """Sends its own process SIGTERM once, at the end of step `step`, as a scheduler would (saved like StopAtStep)."""

    def __init__(self, step: int):
        self.step, self.sent = step, False

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)

    def state(self) -> dict:
        return {"args": {"step": self.step}, "attributes": {"sent": self.sent}}


class HookLog(TrainerCallback):
    """Appends every hook it is called with (and on_log's keys) to a JSON-lines file; built with the trainer.
    It declares no saved state, so a resume refuses it."""

    def __init__(self, trainer, path: str):
        self.trainer, self.path = trainer, Path(path)

    def _write(self, hook: str, state, **extra) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"hook": hook, "step": state.global_step, **extra}) + "\n")

    def on_train_begin(self, args, state, control, **kwargs):
        self._write("on_train_begin", state, trainer=type(self.trainer).__name__)

    def on_step_end(self, args, state, control, **kwargs):
        self._write("on_step_end", state)

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._write("on_log", state, keys=sorted(logs or {}))

    def on_evaluate(self, args, state, control, **kwargs):
        self._write("on_evaluate", state)

    def on_save(self, args, state, control, **kwargs):
        self._write("on_save", state)

    def on_train_end(self, args, state, control, **kwargs):
        self._write("on_train_end", state)


class NaNGradientAtStep(TrainerCallback):
    """Makes one gradient NaN just before the optimizer step of step `step`: a backward pass gone bad."""

    def __init__(self, trainer, step: int):
        self.trainer, self.step = trainer, step

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step + 1 == self.step:
            next(p for p in self.trainer.model.parameters() if p.grad is not None).grad.view(-1)[0] = float(
                "nan"
            )
