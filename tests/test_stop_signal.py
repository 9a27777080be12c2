"""trainer/stop_signal.py: a scheduler's notice stops the run after the step in progress, whatever phase of the
step it arrives in (issue 49: one that came during evaluation or a save was acted on a step late)."""

import signal
from types import SimpleNamespace

from transformers import TrainerControl

from trainer.stop_signal import StopOnSignal

ROW = {"loss": 0.1}  # the step's row (what CheckpointCallback saves on)


def _stop():
    stop = StopOnSignal(SimpleNamespace(num_processes=1, device="cpu"))
    return stop, stop.after_save()


def _args(checkpoint_steps):
    return SimpleNamespace(checkpoint_steps=checkpoint_steps, checkpoint_every=0, max_steps=10)


def test_a_notice_during_evaluation_stops_before_the_save_so_the_step_is_saved():
    stop, _ = _stop()
    state, control = SimpleNamespace(global_step=3), TrainerControl()
    stop.on_step_end(None, state, control)  # the step ends: no notice yet
    assert not control.should_training_stop
    stop._note(signal.SIGTERM, None)  # ... it comes while the step is evaluated (EvalCallback.on_step_end)
    stop.on_log(_args([5]), state, control, logs=ROW)  # before CheckpointCallback.on_log
    assert control.should_training_stop  # so CheckpointCallback saves step 3 and the Trainer stops after it


def test_a_notice_during_a_checkpoint_save_stops_after_that_step():
    stop, after = _stop()
    state, control = SimpleNamespace(global_step=5), TrainerControl()
    stop.on_step_end(None, state, control)
    stop.on_log(_args([5]), state, control, logs=ROW)
    assert not control.should_training_stop
    stop._note(signal.SIGTERM, None)  # ... it comes while CheckpointCallback saves step 5
    after.on_log(_args([5]), state, control, logs=ROW)
    assert control.should_training_stop


def test_after_a_step_that_was_not_saved_the_notice_waits_for_the_next_step():
    """A notice after the row of a step that is not a checkpoint step: stopping there would lose the step, so
    the next step's end stops (and its save)."""
    stop, after = _stop()
    state, control = SimpleNamespace(global_step=4), TrainerControl()
    stop.on_log(_args([5]), state, control, logs=ROW)
    stop._note(signal.SIGTERM, None)
    after.on_log(_args([5]), state, control, logs=ROW)
    assert not control.should_training_stop
    state.global_step = 5
    stop.on_step_end(None, state, control)
    assert control.should_training_stop
