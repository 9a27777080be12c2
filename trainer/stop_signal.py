"""A scheduler's notice to stop: SIGTERM or SIGUSR1 ends the run after the step in progress, with that step
saved (CheckpointCallback saves the step a stopping callback ends on), so `--resume` continues from it
exactly. SLURM (`--signal`), Kubernetes and the experiment launchers send one of the two before they kill a
job; Ctrl-C (SIGINT) still stops at once and keeps the last state saved before it."""

import signal

import torch
from transformers import TrainerCallback
from transformers.utils import logging

from trainer.checkpoint import is_checkpoint_step

logger = logging.get_logger(__name__)
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class StopOnSignal(TrainerCallback):
    def __init__(self, accelerator):
        self.accelerator = accelerator
        self.received: int | None = None
        self.previous: dict[int, object] = {}

    def _note(self, signum, _frame) -> None:
        self.received = signum

    def on_train_begin(self, args, state, control, **kwargs):
        for s in SIGNALS:
            try:
                self.previous[s] = signal.signal(s, self._note)
            except ValueError:  # not the main thread (a Python caller's worker thread): nothing to catch
                return

    def on_train_end(self, args, state, control, **kwargs):
        for s, handler in self.previous.items():  # a Python caller gets its own handlers back
            signal.signal(s, handler)
        self.previous.clear()

    # A step's end goes: on_step_end (evaluation runs here), on_log (the row, then CheckpointCallback saves);
    # a notice may come in any of them, so it is looked at before the save and after it, not at the next step.
    def on_step_end(self, args, state, control, **kwargs):
        return self._stop_if_asked(state, control)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:  # the step's row: before CheckpointCallback, which saves a stopping step
            return self._stop_if_asked(state, control)

    def after_save(self) -> "AfterSave":
        """A callback to add after CheckpointCallback: a notice that came during the save of a checkpoint step
        stops the run there (that step is saved), not after the next one."""
        return AfterSave(self)

    def _stop_if_asked(self, state, control):
        if control.should_training_stop:
            return control
        asked = self.received is not None
        if self.accelerator.num_processes > 1:  # every process stops at the same step, or the others hang
            flag = torch.tensor([float(asked)], device=self.accelerator.device)
            asked = bool(self.accelerator.reduce(flag, reduction="sum").item())
        if asked:
            name = signal.Signals(self.received).name if self.received else "another process's signal"
            logger.warning("stopping after step %d on %s: it is saved; --resume continues from it",
                           state.global_step, name)  # fmt: skip
            control.should_training_stop = True
        return control


class AfterSave(TrainerCallback):
    def __init__(self, stop: StopOnSignal):
        self.stop = stop

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and is_checkpoint_step(state.global_step, args):  # this step is saved
            return self.stop._stop_if_asked(state, control)
