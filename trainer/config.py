"""`CapGRPOConfig`: TRL's `GRPOConfig` plus the fields of a cap-policy experiment (SPEC §3–6)."""

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

from trl import GRPOConfig

from data.prompt import SYSTEM_PROMPT
from engine.generation import PROMPT_MULTIPLE
from rewards.outcome import GRADER_VERSIONS


class ConfigError(ValueError):
    """A recipe or command-line value we refuse; the message starts with the field's name."""


INT_LIMIT = 2**63  # an integer field must fit in int64: torch, numpy and the RNGs take nothing wider
MAX_STEPS = 10**9  # above this a run never ends (a step takes seconds at least): a typo, not a plan


def refuse_absurd_numbers(config) -> None:
    """Every field of a config dataclass (ours, TRL's, transformers'), nested lists and mappings included: NaN
    and infinities, integers beyond int64, and a float (YAML's `.nan`, `1.0e+20`) in an int field are refused
    by the field's name. A YAML recipe's numbers reach the dataclass unconverted, and `x <= 0` lets NaN through;
    left in, NaN ends in a traceback mid-run and in run.json as `NaN`, which strict JSON readers refuse."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name, None)
        _refuse_in(f.name, value)
        if f.type in (int, int | None) and isinstance(value, float):
            raise ConfigError(f"{f.name}: must be an integer, got {value!r}")


def _refuse_in(name: str, value) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{name}: must be a finite number, got {value!r}")
    if isinstance(value, int) and not -INT_LIMIT <= value < INT_LIMIT:
        raise ConfigError(f"{name}: {value} does not fit in a 64-bit integer")
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_in(f"{name}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _refuse_in(f"{name}[{i}]", item)


GRADER_LIMITS = {
    "grader_workers": "workers",
    "grader_timeout_s": "timeout_s",
    "grader_memory_mb": "memory_mb",
}


def grader_limits(config: dict) -> dict:
    """GraderPool's limits from a config dict (run.json `config`); a field it lacks takes our default."""
    fields = CapGRPOConfig.__dataclass_fields__
    return {arg: config.get(name, fields[name].default) for name, arg in GRADER_LIMITS.items()}


DETERMINISM = ("deterministic", "deterministic_fill_memory", "deterministic_kv_writes")


def recorded_determinism(config: dict) -> SimpleNamespace:
    """The determinism switches of a config dict (run.json `config`), a field it predates at our default: what
    `make eval` applies before it generates, as the run did (trainer/setup.py apply_determinism)."""
    fields = CapGRPOConfig.__dataclass_fields__
    return SimpleNamespace(**{name: config.get(name, fields[name].default) for name in DETERMINISM})


@dataclass
class CapGRPOConfig(GRPOConfig):
    # --- experiment --------------------------------------------------------------------------------
    arm: str = field(default="S2", metadata={"help": "Arm name: S0, S2, S4 or one defined under `arms`."})
    arms: dict | str | None = field(
        default=None,
        metadata={
            "help": "Extra arms, {name: {policy_id, groups_per_step, note, policy_params}} (YAML or JSON)."
        },
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
    system_prompt: str = field(
        default=SYSTEM_PROMPT, metadata={"help": "System message of every prompt (data/prompt.py's default)."}
    )
    # --- grader ------------------------------------------------------------------------------------
    grader_workers: int = field(default=2, metadata={"help": "Grader worker processes."})
    grader_timeout_s: float = field(default=10.0, metadata={"help": "Per-item grading timeout."})
    grader_memory_mb: int = field(default=2048, metadata={"help": "Address-space limit per grader worker."})
    grader: str = field(
        default="v1",
        metadata={
            "help": "Grader: v1 (the seed's: math-verify) or v2 (rewards/v2.py).",
            "choices": ["v1", "v2"],
        },
    )
    # --- evaluation (SPEC §5) ----------------------------------------------------------------------
    eval_every: int = field(
        default=10,
        metadata={"help": "Evaluate at step 0, every N steps and at the end (0: never in training)."},
    )
    eval_at_steps: list[int] = field(
        default_factory=list,
        metadata={"help": "Evaluate at these steps alone (and the last), in place of every eval_every: the "
                  "steps an experiment's plan reads."},
    )  # fmt: skip
    step0_eval_from: str | None = field(
        default=None,
        metadata={"help": "Another run's results/eval_step000.jsonl of the same base, sets and eval settings "
                  "(checked): copied instead of evaluating the base again (the launcher's shared step 0)."},
    )  # fmt: skip
    eval_cap: int | None = field(default=None, metadata={"help": "Eval token cap (default: training cap)."})
    extra_evals: list[str] = field(
        default_factory=list,
        metadata={"help": "More evaluations at extra_eval_steps, each SET@CAP: fixed32, heldout300 or a name of "
                  "eval_set_files, at a token cap (math500@1024, heldout300@1152). At the eval cap their rows join "
                  "eval_stepNNN.jsonl; at another cap they go to eval_stepNNN_capCCCC.jsonl."},
    )  # fmt: skip
    extra_eval_steps: list[int] = field(
        default_factory=list,
        metadata={"help": "Evaluation steps at which extra_evals run (e.g. 0 and the last)."},
    )
    eval_set_files: dict | str | None = field(
        default=None,
        metadata={"help": "Evaluation sets beside fixed32 and heldout300, {name: file} (a *.tasks.json snapshot or "
                  "MATH-format JSONL such as MATH500): every problem, one sample, named in extra_evals."},
    )  # fmt: skip
    eval_temperature: float | None = field(default=None, metadata={"help": "Default: training temperature."})
    eval_top_p: float | None = field(default=None, metadata={"help": "Default: training top_p."})
    eval_seed: int = field(default=1234, metadata={"help": "Seed of the per-sample evaluation seeds."})
    eval_set_seed: int = field(default=0, metadata={"help": "Seed choosing fixed32 and heldout300."})
    heldout_size: int = field(default=300, metadata={"help": "Problems in heldout300 (never trained on)."})
    heldout_subject: str = field(
        default="",
        metadata={"help": "Draw heldout300 only from tasks whose subject starts with this, none trained on "
                  "(data/gsm_symbolic.py: gsm_symbolic/heldout or math500/); empty: any task."},
    )  # fmt: skip
    fixed_size: int = field(default=32, metadata={"help": "Problems in fixed32 (from the training pool)."})
    fixed_samples: int = field(default=8, metadata={"help": "Samples per fixed32 problem."})
    heldout_samples: int = field(default=1, metadata={"help": "Samples per heldout300 problem."})
    eval_batch_size: int = field(default=64, metadata={"help": "Sequences per evaluation generate call."})
    # --- generation on one GPU (engine/generation.py) ------------------------------------------------
    compiled_generation: bool | None = field(
        default=None,
        metadata={"help": "Static cache + compiled decode (default: on for one CUDA process without vLLM)."},
    )
    generation_rows: int | None = field(
        default=None, metadata={"help": "Sequences per compiled generate call (default: one round's)."}
    )
    prompt_multiple: int = field(
        default=PROMPT_MULTIPLE, metadata={"help": "Compiled generation: prompt width bucket."}
    )
    chunked_gated_delta: bool | None = field(
        default=None,
        metadata={
            "help": "Qwen3.5's linear attention in the training pass: our chunked rule instead of transformers' "
            "torch fallback (default: on CUDA; fla's kernels, when installed, come first either way)."
        },
    )
    fla_causal_conv: bool | None = field(
        default=None,
        metadata={
            "help": "Qwen3.5's causal conv in the training pass through flash-linear-attention's Triton kernel "
            "instead of transformers' torch fallback (default: on CUDA when fla is installed; engine/fla_conv.py)."
        },
    )
    # --- checkpoints and resume (SPEC §6) ---------------------------------------------------------
    checkpoint_steps: list[int] = field(default_factory=list, metadata={"help": "Steps saving stepNNN/."})
    checkpoint_every: int = field(default=0, metadata={"help": "Also save every N steps (0: off)."})
    save_last_step: bool = field(
        default=True,
        metadata={"help": "Save the last step's stepNNN/ and stateNNN/ (false: a launcher that drops finished "
                  "runs' weights; its rows and evaluation are written first)."},
    )  # fmt: skip
    keep_states: int = field(default=2, metadata={"help": "Newest stateNNN/ kept (optimizer state)."})
    nonfinite_gradient: str = field(
        default="stop",
        metadata={
            "help": "A step whose gradient norm is NaN or inf: stop the run there, or skip its update.",
            "choices": ["stop", "skip"],
        },
    )
    cpu_adamw: bool | None = field(
        default=None, metadata={"help": "CPU-offloaded AdamW (default: on for single-process GPU runs)."}
    )
    compile_gated_delta_terms: bool = field(
        default=False,
        metadata={
            "help": "Compile the chunk-parallel part of our chunked gated delta rule (one graph for every "
            "length; its chunk loop stays eager). Off until measured in whole steps (docs/PERFORMANCE.md)."
        },
    )
    compile_norms_mlp: bool = field(
        default=False,
        metadata={
            "help": "Compile the training forward's RMSNorms, gated norms and MLPs (one graph per class, dynamic "
            "in tokens; engine/compiled_parts.py). Off until measured in whole steps (docs/PERFORMANCE.md)."
        },
    )
    gpu_memory_share: float = field(
        default=1.0,
        metadata={"help": "Share of the GPU's memory this run sizes its micro-batch and optimizer state for "
                  "(several runs on one GPU: the launcher's budget.gpu_memory_share)."},
    )  # fmt: skip
    adamw_state_on_gpu: bool | None = field(
        default=None,
        metadata={
            "help": "CPUAdamW's fp32 state on the GPU instead of the host (default: when the memory estimate "
            "that sizes the micro-batch has room for it at the same micro-batch, or at a smaller one that still "
            "saturates the matmuls: engine/micro_batch.py place_state; run.json launch.micro_batch)."
        },
    )
    resume: str | None = field(
        default=None,
        metadata={
            "help": "Run dir with stepNNN/ and stateNNN/ to resume (in place; output_dir defaults to it)."
        },
    )
    resume_fallback: bool = field(
        default=False,
        metadata={"help": "Resume from the newest complete state even when a newer one is broken (named)."},
    )
    callbacks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Trainer callbacks: import paths (trl.BEMACallback, my_pkg.mod:MyCallback), keyword "
            "arguments as {path: {...}} in YAML or 'path={json}' (trainer/callbacks.py)."
        },
    )
    cpu_threads: int = field(
        default=1, metadata={"help": "Intra-op threads on CPU-only runs (tiny models run fastest on one)."}
    )
    deterministic: bool = field(
        default=False,
        metadata={
            "help": "Bitwise-repeatable GPU training: torch's deterministic algorithms, a fixed cuBLAS workspace, "
            "deterministic cuDNN (trainer/setup.py apply_determinism; docs/gpu.md). Refused with vLLM."
        },
    )
    deterministic_fill_memory: bool = field(
        default=True,
        metadata={"help": "With deterministic: torch's fill of every new tensor's memory (a guard against kernels "
                  "that read memory nobody wrote; a fill kernel per allocation, also inside CUDA graphs). "
                  "false: the suspect of deterministic generation's 1.7x on the H200, not yet measured."},
    )  # fmt: skip
    deterministic_kv_writes: bool = field(
        default=True,
        metadata={"help": "With deterministic: compiled generation writes the static KV cache with one plain copy "
                  "kernel per write (positions never repeat, so it is deterministic by construction) instead of "
                  "the deterministic index_put Inductor falls back to, twice per attention layer and token "
                  "(engine/kv_writes.py). The same tokens; the 1.5B's decode step 7.68 -> 6.10 ms on the H200."},
    )  # fmt: skip
    # --- training micro-batch (engine/micro_batch.py): unset, the trainer sizes it at init ---------------
    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Rollouts per training micro-batch (default: sized by the trainer, run.json launch)."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Activation checkpointing (default: decided with the micro-batch).", "nargs": "?",
                  "const": True},
    )  # fmt: skip

    def __post_init__(self):
        """A declaration: recipe values parsed and checked, nothing decided (trainer/setup.py decides)."""
        for name in ("arms", "eval_set_files"):  # a mapping given on the command line is JSON
            if isinstance(value := getattr(self, name), str):
                try:
                    setattr(self, name, json.loads(value))
                except json.JSONDecodeError as e:
                    raise ConfigError(f"{name}: not a JSON mapping ({e})") from None
        refuse_absurd_numbers(self)  # first: every check below compares numbers
        if self.task_seed is None:
            self.task_seed = self.seed
        if not self.output_dir:
            self.output_dir = self.resume or f"runs/{self.arm}"
        self.validate()
        # TRL's own checks need a batch to check; the run's comes from setup (trainer/setup.py batch_arithmetic),
        # so these stand-ins (one group per micro-batch) are dropped again below
        rows = self.per_device_train_batch_size
        ckpt = self.gradient_checkpointing
        if ckpt is None:
            ckpt = getattr(self, "activation_checkpointing", None)
        self.per_device_train_batch_size, self.gradient_accumulation_steps = self.num_generations, 1
        self.steps_per_generation = self.generation_batch_size = None
        self.logging_steps = 1  # steps.jsonl has one row per optimizer step
        self.save_strategy = "no"  # the Trainer's checkpoints pickle the optimizer; ours are safetensors
        super().__post_init__()
        if self.num_iterations != 1:
            raise ConfigError("num_iterations: must be 1 (each step trains once on freshly selected groups)")
        self.per_device_train_batch_size = rows
        self.gradient_accumulation_steps = self.steps_per_generation = self.generation_batch_size = None
        set_checkpointing(self, ckpt)  # unset: decided with the micro-batch

    def _validate_extra_evals(self) -> None:
        files = self.eval_set_files or {}
        if not isinstance(files, dict) or not all(isinstance(v, str) and v for v in files.values()):
            raise ConfigError(f"eval_set_files: a mapping of set names to files, got {files!r}")
        if taken := sorted({"fixed32", "heldout300"} & set(files)):
            raise ConfigError(f"eval_set_files: {taken[0]} is the run's own set; give the file another name")
        known = {"fixed32", "heldout300", *files}
        for entry in self.extra_evals:
            name, _, cap = str(entry).rpartition("@")
            if name not in known or not cap.isdigit() or int(cap) <= 0:
                raise ConfigError(f"extra_evals: {entry!r} is not SET@CAP with SET one of {sorted(known)} and a "
                                  "positive token cap")  # fmt: skip
        if len(set(self.extra_evals)) != len(self.extra_evals):
            raise ConfigError(f"extra_evals: an entry given twice in {self.extra_evals!r}")
        if bool(self.extra_evals) != bool(self.extra_eval_steps):
            raise ConfigError(
                "extra_evals and extra_eval_steps: give both (what to evaluate, and when) or neither"
            )
        for step in self.extra_eval_steps:
            due = (
                step in self.eval_at_steps
                if self.eval_at_steps
                else self.eval_every and step % self.eval_every == 0
            )
            if not isinstance(step, int) or step < 0 or not (due or step == self.max_steps):
                raise ConfigError(f"extra_eval_steps: {step!r} is not an evaluation step of this run "
                                  "(eval_at_steps, a multiple of eval_every, or max_steps)")  # fmt: skip

    def validate(self) -> None:
        """Our fields (and the TRL ones we depend on) checked before any model or file is touched."""
        for name in ("groups_per_step", "problems_per_round"):  # unset: the arm's (trainer/setup.py)
            if (value := getattr(self, name)) is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
        positive = ("max_sampling_rounds", "max_completion_length",
                    "eval_batch_size", "fixed_samples", "heldout_samples",
                    "grader_workers", "grader_memory_mb", "cpu_threads", "prompt_multiple")  # fmt: skip
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
        rows = self.per_device_train_batch_size
        if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0):
            raise ConfigError(f"per_device_train_batch_size: must be a positive integer, got {rows!r}")
        for name in ("eval_every", "checkpoint_every", "keep_states", "heldout_size", "fixed_size"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be 0 or more, got {getattr(self, name)!r}")
        if not 0 < self.gpu_memory_share <= 1:
            raise ConfigError(f"gpu_memory_share: a share in (0, 1], got {self.gpu_memory_share!r}")
        if self.eval_at_steps and (self.eval_every == 0 or any(
                not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in self.eval_at_steps)):  # fmt: skip
            raise ConfigError(f"eval_at_steps: steps >= 0, with eval_every > 0 (0 turns evaluation off), got "
                              f"{self.eval_at_steps!r}")  # fmt: skip
        self._validate_extra_evals()
        if self.num_generations is None or self.num_generations < 2:
            raise ConfigError(
                f"num_generations: a group needs at least 2 rollouts, got {self.num_generations!r}"
            )
        if self.max_steps == 0 or self.max_steps < -1:
            raise ConfigError(
                f"max_steps: must be positive (or -1 for num_train_epochs), got {self.max_steps!r}"
            )
        if self.max_steps > MAX_STEPS:
            raise ConfigError(f"max_steps: at most {MAX_STEPS:,} steps, got {self.max_steps:,}")
        if self.deterministic and self.use_vllm:  # its batched sampling depends on what else is in the batch
            raise ConfigError(
                "deterministic: vLLM's generation is not repeatable run to run; set use_vllm: false"
            )
        if bad := [s for s in self.checkpoint_steps if s <= 0]:
            raise ConfigError(f"checkpoint_steps: steps are numbered from 1, got {bad}")
        if self.generation_rows is not None and self.generation_rows <= 0:
            raise ConfigError(f"generation_rows: must be a positive integer, got {self.generation_rows!r}")
        if self.eval_cap is not None and self.eval_cap <= 0:
            raise ConfigError(f"eval_cap: must be a positive token count, got {self.eval_cap!r}")
        for name in ("temperature", "eval_temperature", "grader_timeout_s"):
            if (value := getattr(self, name)) is not None and not value > 0:
                raise ConfigError(f"{name}: must be positive, got {value!r}")
        for name in ("top_p", "eval_top_p"):
            if (value := getattr(self, name)) is not None and not 0 < value <= 1:
                raise ConfigError(f"{name}: must be in (0, 1], got {value!r}")
        if self.learning_rate < 0:
            raise ConfigError(f"learning_rate: must be 0 or more, got {self.learning_rate!r}")
        if self.resume and os.path.abspath(self.resume) != os.path.abspath(self.output_dir):
            raise ConfigError(
                f"resume: {self.resume} is not output_dir {self.output_dir}: a resume continues that run "
                f"in place (drop --output_dir, or set it to {self.resume})"
            )
        if self.resume_fallback and not self.resume:
            raise ConfigError("resume_fallback: only meaningful with --resume")
        # TRL saves its adaptive-entropy controller in entropy_ctrl_state.json of its own checkpoints only
        if self.use_adaptive_entropy:
            raise ConfigError(
                "use_adaptive_entropy: not supported: stateNNN/ does not hold TRL's entropy controller, "
                "so a resume would not be exact"
            )
        if self.save_on_each_node:  # only the global main process writes (rundir/lock.py require_shared)
            raise ConfigError(
                "save_on_each_node: not supported: the run directory is written once, by the global main "
                "process; give every node one output_dir on a shared filesystem (docs/gpu.md)"
            )
        if self.nonfinite_gradient not in ("stop", "skip"):
            raise ConfigError(
                f"nonfinite_gradient: must be 'stop' or 'skip', got {self.nonfinite_gradient!r}"
            )
        if self.grader not in GRADER_VERSIONS:  # the command line checks `choices`; a YAML recipe does not
            raise ConfigError(f"grader: must be one of {sorted(GRADER_VERSIONS)}, got {self.grader!r}")


def set_checkpointing(args, value: bool | None) -> None:
    """transformers >= 5.2x renamed gradient_checkpointing to activation_checkpointing (the old name kept, mirrored
    at __post_init__); the GPU machine's 5.17 has only the old one."""
    args.gradient_checkpointing = value
    if hasattr(args, "activation_checkpointing"):
        args.activation_checkpointing = value


# --- resume: which differences from the run's own config keep a resume exact ----------------------------
# Changing these alters no rollout, gradient or RNG draw: cadence of evaluation/checkpoints/logging, the
# number of steps (under a constant learning rate), grader parallelism (grading is deterministic), training
# threads (generation runs on one; the training pass gives the same logits and gradients at 1 and 2) and where
# results are reported or pushed.
RESUME_MAY_CHANGE = frozenset(
    {"max_steps", "eval_every", "eval_at_steps", "extra_evals", "extra_eval_steps", "eval_set_files", "step0_eval_from", "save_last_step", "gpu_memory_share", "checkpoint_steps", "checkpoint_every", "keep_states", "grader_workers",
     "cpu_threads", "report_to", "disable_tqdm", "run_name", "project", "log_level", "log_level_replica",
     "log_on_each_node", "logging_first_step", "logging_nan_inf_filter", "log_completions",
     "num_completions_to_print", "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push",
     "hub_revision", "log_completions_hub_repo"}
)  # fmt: skip
# Not compared at all: the resume flags, and output_dir (validate() ties it to --resume).
RESUME_ONLY = frozenset({"resume", "resume_fallback", "output_dir"})


def resume_changes(old: dict, new: dict) -> tuple[dict, dict]:
    """(refused, accepted): {field: [old, new]} between the run's recorded config and this launch's.

    Any field not known to be harmless is refused. A field missing from the old config (added to the code
    since) is not compared."""
    refused, accepted = {}, {}
    for name in sorted(set(old) & set(new) - RESUME_ONLY):
        if old[name] == new[name]:
            continue
        harmless = name in RESUME_MAY_CHANGE
        if name == "max_steps" and new.get("lr_scheduler_type") != "constant":
            harmless = False  # the schedule is built from max_steps: another length is another curve
        (accepted if harmless else refused)[name] = [old[name], new[name]]
    return refused, accepted
