"""`StepRecord`: steps.jsonl's row of the step in progress, as CapGRPOTrainer fills it (docs/CONTRACTS.md lists
the row's fields). The selection rounds add their timings and grader failures as they run; the selection's
summary comes once the step's batch is chosen; StepsLog writes it with TRL's loss and what the evaluation and
the previous save report."""

import dataclasses
from collections import Counter
from dataclasses import dataclass, field


def _seconds() -> Counter:
    return Counter(generate=0.0, grade=0.0, grade_lost=0.0, train=0.0, eval=0.0, save=0.0)


@dataclass
class StepRecord:
    seconds: Counter = field(default_factory=_seconds)  # wall time per phase of the step
    grader: Counter = field(default_factory=Counter)  # where the grader failed, summed over rounds
    groups: dict | None = None  # sampled, qualified, trained, rounds, bound_hit, rejected (by reason)
    gate_stat: float | None = (
        None  # share of sampled groups with a correct, unresolved and no completed wrong
    )
    outcomes_sampled: dict[str, int] | None = None
    outcomes_trained: dict[str, int] | None = None
    reward_mean: float | None = None  # share correct among graded samples (not the policy's shaped reward)
    completion_length: dict | None = None  # median, mean, max over sampled rollouts
    tokens_trained: int | None = None
    task_ids_trained: list[str] = field(default_factory=list)
    sampler: dict | None = None  # the task sampler's state after the step's draws
    # micro-batches whose loss was NaN or inf (the Trainer's logged loss hides them)
    nonfinite_losses: int = 0
    # a non-finite gradient norm, the update not applied (trainer/finite_gradients.py, `skip`)
    update_skipped: bool = False
    # vLLM's log-probs of the sampled tokens against the trainer's after the step's push
    # (trainer/sampler_agreement.py); None without sampler log-probs
    sampler_agreement: dict | None = None
    # GPU memory of the step (StepsLog): peak allocated, device used at the row, vLLM sleep mode; None on CPU
    gpu_memory: dict | None = None

    def update(self, **fields) -> None:
        """Set these fields (by name: a misspelt one raises rather than adding a column)."""
        for name, value in fields.items():
            if name not in self.__dataclass_fields__:
                raise AttributeError(f"StepRecord has no field {name!r}")
            setattr(self, name, value)

    def to_row(self) -> dict:
        """The fields in declaration order, as steps.jsonl has them (asdict would rebuild the Counters from
        their items, miscounting them)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
