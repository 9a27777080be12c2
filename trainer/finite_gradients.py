"""A non-finite gradient never reaches the weights: the run stops there, or that step's update is skipped.

transformers' Trainer clips by the gradient norm and steps whatever it gets: a NaN norm scales every gradient
to NaN, the optimizer writes NaN into every weight, and the run goes on from a model that can no longer sample
(docs/experiment-real/README.md, launch 6: S0-s1's step 12 had a NaN norm, and the next rollout died on a
device assert). `nonfinite_gradient: stop` (the default) ends the run at that step with one line, the weights
untouched and the last saved state what `--resume` continues from. `skip` drops the step's gradients, so the
optimizer leaves every parameter and its state as they were (torch's optimizers and CPUAdamW pass over a
parameter without a gradient), as torch's GradScaler does with an overflowed step; the learning-rate schedule
still advances. The step's row says `update_skipped: true`, and the run goes on with the next rollouts."""

import sys

import torch
from transformers import TrainerCallback


class NonFiniteGradientError(Exception):
    """The step and the norm; the run directory's last state is untouched."""


class NonFiniteGradientGuard(TrainerCallback):
    def __init__(self, trainer, skip: bool):
        self.trainer, self.skip = trainer, skip

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        params = [p for p in self.trainer.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.zeros(())
        accelerator = self.trainer.accelerator
        bad = (~torch.isfinite(norm)).float().reshape(1).to(accelerator.device)
        if accelerator.num_processes > 1:  # every process acts at the same step, or the others hang
            bad = accelerator.reduce(bad, reduction="sum")
        if not bad.item():
            return control
        where = f"{args.output_dir}: step {state.global_step + 1}: the gradient norm is {norm.item()} (not finite)"
        if not self.skip:
            raise NonFiniteGradientError(
                f"{where}; the update was not applied and the run stopped, its last saved state untouched"
            )
        for p in params:
            p.grad = None
        self.trainer.step_record.update(update_skipped=True)
        print(f"{where}: its update is skipped (nonfinite_gradient: skip)", file=sys.stderr, flush=True)
        return control
