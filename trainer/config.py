"""`CapGRPOConfig`: TRL's `GRPOConfig` plus the fields of a cap-policy experiment (SPEC §3–6)."""

import importlib.util
import json
import os
import warnings
from dataclasses import dataclass, field

from trl import GRPOConfig

from trainer.arms import ARMS, POLICIES, Arm


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


@dataclass
class CapGRPOConfig(GRPOConfig):
    # --- experiment --------------------------------------------------------------------------------
    arm: str = field(default="S2", metadata={"help": "Arm name: S0, S2, S4 or one defined under `arms`."})
    arms: dict | str | None = field(
        default=None,
        metadata={"help": "Extra arms, {name: {policy_id, groups_per_step, note}} (YAML mapping or JSON)."},
    )
    groups_per_step: int | None = field(
        default=None, metadata={"help": "Qualifying groups per step (arm's)."}
    )
    problems_per_round: int | None = field(
        default=None, metadata={"help": "Problems sampled per selection round (default: groups_per_step)."}
    )
    max_sampling_rounds: int = field(default=8, metadata={"help": "Bound on selection rounds per step."})
    task_seed: int | None = field(default=None, metadata={"help": "Task sampler seed (default: seed)."})
    snapshot_path: str = field(default="", metadata={"help": "Task snapshot (*.tasks.json)."})
    snapshot_sha256: str | None = field(default=None, metadata={"help": "Expected sha256 of the snapshot."})
    # --- grader ------------------------------------------------------------------------------------
    grader_workers: int = field(default=2, metadata={"help": "Grader worker processes."})
    grader_timeout_s: float = field(default=10.0, metadata={"help": "Per-item grading timeout."})
    grader_memory_mb: int = field(default=2048, metadata={"help": "Address-space limit per grader worker."})
    # --- evaluation (SPEC §5) ----------------------------------------------------------------------
    eval_every: int = field(
        default=10,
        metadata={"help": "Evaluate at step 0, every N steps and at the end (0: never in training)."},
    )
    eval_cap: int | None = field(default=None, metadata={"help": "Eval token cap (default: training cap)."})
    eval_temperature: float | None = field(default=None, metadata={"help": "Default: training temperature."})
    eval_top_p: float | None = field(default=None, metadata={"help": "Default: training top_p."})
    eval_seed: int = field(default=1234, metadata={"help": "Seed of the per-sample evaluation seeds."})
    eval_set_seed: int = field(default=0, metadata={"help": "Seed choosing fixed32 and heldout300."})
    heldout_size: int = field(default=300, metadata={"help": "Problems in heldout300 (never trained on)."})
    fixed_size: int = field(default=32, metadata={"help": "Problems in fixed32 (from the training pool)."})
    fixed_samples: int = field(default=8, metadata={"help": "Samples per fixed32 problem."})
    heldout_samples: int = field(default=1, metadata={"help": "Samples per heldout300 problem."})
    eval_batch_size: int = field(default=64, metadata={"help": "Sequences per evaluation generate call."})
    # --- checkpoints and resume (SPEC §6) ---------------------------------------------------------
    checkpoint_steps: list[int] = field(default_factory=list, metadata={"help": "Steps saving stepNNN/."})
    checkpoint_every: int = field(default=0, metadata={"help": "Also save every N steps (0: off)."})
    keep_states: int = field(default=2, metadata={"help": "Newest stateNNN/ kept (optimizer state)."})
    cpu_adamw: bool | None = field(
        default=None, metadata={"help": "CPU-offloaded AdamW (default: on for single-process GPU runs)."}
    )
    resume: str | None = field(
        default=None, metadata={"help": "Run dir with stepNNN/ and stateNNN/ to resume."}
    )
    cpu_threads: int = field(
        default=1, metadata={"help": "Intra-op threads on CPU-only runs (tiny models run fastest on one)."}
    )

    def __post_init__(self):
        if isinstance(self.arms, str):
            self.arms = json.loads(self.arms)
        if self.use_vllm and not vllm_installed():
            # Recipes for the real run ask for vLLM; without it TRL's transformers generation is used.
            warnings.warn(
                "use_vllm is set but vLLM is not installed: generating with transformers", stacklevel=2
            )
            self.use_vllm = False
        arm = self.resolved_arm()
        if self.groups_per_step is None:
            self.groups_per_step = arm.groups_per_step
        if self.problems_per_round is None:
            self.problems_per_round = self.groups_per_step
        if self.task_seed is None:
            self.task_seed = self.seed
        if not self.output_dir:
            self.output_dir = f"runs/{self.arm}"
        # One optimizer step = exactly groups_per_step × G rollouts, generated once and split into
        # gradient-accumulation micro-batches; the derived sizes below are what TRL's own checks expect.
        world = int(os.environ.get("WORLD_SIZE", "1"))
        rollouts = self.groups_per_step * (self.num_generations or 8)
        if rollouts % (world * self.per_device_train_batch_size):
            raise ValueError(
                f"groups_per_step × num_generations = {rollouts} rollouts must split evenly over {world} "
                f"process(es) × per_device_train_batch_size={self.per_device_train_batch_size}"
            )
        if self.problems_per_round % world:
            raise ValueError(
                f"problems_per_round={self.problems_per_round} must be divisible by {world} processes"
            )
        self.gradient_accumulation_steps = rollouts // (world * self.per_device_train_batch_size)
        self.steps_per_generation = None
        self.generation_batch_size = None
        self.logging_steps = 1  # steps.jsonl has one row per optimizer step
        self.save_strategy = "no"  # the Trainer's checkpoints pickle the optimizer; ours are safetensors
        super().__post_init__()
        if self.num_iterations != 1:
            raise ValueError("num_iterations must be 1: each step trains once on freshly selected groups")

    def resolved_arm(self) -> Arm:
        arms = dict(ARMS)
        for name, spec in (self.arms or {}).items():
            arms[name] = Arm(name=name, **spec)
        if self.arm not in arms:
            raise ValueError(f"unknown arm {self.arm!r}; known: {sorted(arms)} (add one under `arms:`)")
        arm = arms[self.arm]
        if arm.policy_id not in POLICIES:
            raise ValueError(
                f"arm {arm.name}: unknown policy_id {arm.policy_id!r}; known: {sorted(POLICIES)}"
            )
        return arm
