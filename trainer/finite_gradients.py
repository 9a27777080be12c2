"""A non-finite gradient ends the run before the optimizer applies it.

transformers' Trainer clips by the gradient norm and steps whatever it gets: a NaN norm scales every gradient
to NaN, the optimizer writes NaN into every weight, and the run goes on from a model that can no longer sample
(docs/experiment-real/README.md, launch 6: S0-s1's step 12 had a finite loss and a NaN norm, and the next
rollout died on a device assert). Here the run stops at that step with one line instead: the weights are
untouched, and the last saved state stays what `--resume` continues from."""

import torch
from transformers import TrainerCallback


class NonFiniteGradientError(Exception):
    """The step and the norm; the run directory's last state is untouched."""


class StopOnNonFiniteGradient(TrainerCallback):
    def __init__(self, model, accelerator):
        self.model = model
        self.accelerator = accelerator

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros(())
        bad = (~torch.isfinite(norm)).float().reshape(1).to(self.accelerator.device)
        if self.accelerator.num_processes > 1:  # every process stops at the same step, or the others hang
            bad = self.accelerator.reduce(bad, reduction="sum")
        if bad.item():
            raise NonFiniteGradientError(
                f"{args.output_dir}: step {state.global_step + 1}: the gradient norm is {norm.item()} "
                "(not finite); the update was not applied and the run stopped, its last saved state untouched"
            )
        return control
