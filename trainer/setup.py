"""One run's setup, in the order its decisions are made: `build_trainer` reads top to bottom like open-r1's
`main()`. The config (trainer/config.py) only declares; every decision is made here, once:

  the process (determinism, threads) → the arm → the run's settings → refusals (inputs, callbacks, a resume's
  exactness) → tasks → backends → model → micro-batch → grader pool → trainer → run.json → callbacks.

A resume adopts the micro-batch its run chose (run.json `launch.micro_batch`); nothing is written back into the
declared config: the trainer gets its own copy with the arm's defaults and the batch arithmetic TRL reads.
"""

import copy
import importlib.util
import json
import os
import warnings
from dataclasses import replace
from pathlib import Path

import torch
import transformers
from accelerate import PartialState
from transformers import AutoConfig, AutoTokenizer
from transformers.utils import logging
from trl import ModelConfig, get_peft_config

from data.eval_sets import extra_evals_by_cap
from data.run_tasks import RunTasks, run_tasks
from engine import kv_writes
from engine.chunked_gated_delta import torch_on_cpu
from engine.micro_batch import MicroBatch, longest_prompt, size_micro_batch
from policy.arms import Arm, resolve_arm
from rewards.grader import GraderPool
from rundir.resume import rewind
from rundir.run_json import read_run_json, record_resume, refuse_non_empty, versions, write_run_json
from rundir.state import put_back_replaced, remove_interrupted_saves
from trainer.backends import decide_backends
from trainer.callbacks import RestoreCallbackState, refuse_unsaved_state, resolve_callbacks
from trainer.checkpoint import CheckpointCallback, Resume, load_resume_state
from trainer.config import (
    CapGRPOConfig,
    ConfigError,
    grader_limits,
    resume_changes,
    set_checkpointing,
)
from trainer.eval_callback import EvalCallback
from trainer.evaluation import EvalSpec, refuse_past_positions
from trainer.finite_gradients import NonFiniteGradientGuard
from trainer.grpo import CapGRPOTrainer, RunSetup
from trainer.steps_log import StepsLog
from trainer.stop_signal import StopOnSignal

logger = logging.get_logger(__name__)


def build_trainer(args: CapGRPOConfig, model_args: ModelConfig, extra_callbacks=()) -> CapGRPOTrainer:
    """`extra_callbacks`: callback objects of a Python caller, beside the recipe's `callbacks:`."""
    run_dir = Path(args.output_dir)
    apply_determinism(args)
    if not torch.cuda.is_available():
        # The embedded model is op-overhead bound: on 2 shared cores one thread generates ~5x faster.
        torch.set_num_threads(args.cpu_threads)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    arm = resolve(args)
    args = settled(args, arm, world)

    # refusals, before anything is written or loaded
    check_inputs(args, model_args)
    callbacks = resolve_callbacks(args.callbacks)
    early = [c.build() for c in callbacks if not c.needs_trainer]  # a failing constructor: before the model
    tasks = run_tasks(args)
    extra = extra_eval_tasks(args, tasks)  # {cap: {set: tasks}} at extra_eval_steps
    resume = recorded = None
    if args.resume:
        resume, recorded = check_resume(run_dir, args, model_args, arm, world, tasks.snapshot, callbacks)
    else:
        refuse_non_empty(run_dir)
        warn_unsaved(callbacks)
    if args.world_size > 1:  # no process writes before every process has checked
        PartialState().wait_for_everyone()

    backends = decide_backends(args, world, torch.cuda.is_available())
    model, arch = load_base_model(model_args.model_name_or_path, model_args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    evaluated = [t["problem"] for t in tasks.tasks.values()] + [
        t["problem"] for file_set in tasks.extra_sets.values() for t in file_set
    ]
    caps = {"max_completion_length": args.max_completion_length, "eval_cap": args.eval_cap,
            "extra_evals": max(extra, default=None)}  # fmt: skip
    where = model_args.model_name_or_path
    refuse_past_positions(model.config, tokenizer, evaluated, args.system_prompt, caps, where, ConfigError)
    if recorded is not None:
        micro_batch = recorded  # a resume trains in the run's own micro-batches
    else:  # sized for the longest rollout a step can hold: the training pool's longest prompt + the cap
        trained = [t["problem"] for t in tasks.training_pool().values()]
        longest = longest_prompt(tokenizer, trained, args.system_prompt)
        micro_batch = size_micro_batch(args, model, longest, backends)
    grader = grader_pool(args)
    run = RunSetup(arm, backends, micro_batch)
    trainer = CapGRPOTrainer(
        model,
        batch_arithmetic(args, micro_batch, world),
        run=run,
        tasks=tasks.training_pool(),
        sampler=tasks.sampler,
        grader=grader,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[*early, *extra_callbacks],
        resume=resume,
    )
    for c in callbacks:  # in the recipe's order, after the early ones (which need no trainer)
        if c.needs_trainer:
            trainer.add_callback(c.build(trainer))
    spec = EvalSpec.from_config(args, backends.eval_generation)
    if args.process_index == 0 and resume is None:
        record_new_run(run_dir, trainer, model_args, arch, tasks, spec, callbacks)
    elif args.process_index == 0:
        record_resume_start(run_dir, resume)
    eval_cb = evaluation_callback(trainer, tasks, spec, grader, extra)
    add_run_callbacks(trainer, run_dir, Path(model_args.model_name_or_path), eval_cb, resume)
    return trainer


def decide(
    args: CapGRPOConfig, model, tokenizer, tasks: dict, world: int = 1
) -> tuple[CapGRPOConfig, RunSetup]:
    """build_trainer's decisions for a model already in memory, in its order: (the trainer's args, what the
    trainer follows). For code that builds CapGRPOTrainer itself (bench/, tests)."""
    arm = resolve(args)
    args = settled(args, arm, world)
    backends = decide_backends(args, world, torch.cuda.is_available())
    problems = [t["problem"] for t in tasks.values()]
    micro_batch = size_micro_batch(
        args, model, longest_prompt(tokenizer, problems, args.system_prompt), backends
    )
    return batch_arithmetic(args, micro_batch, world), RunSetup(arm, backends, micro_batch)


def grader_pool(args: CapGRPOConfig) -> GraderPool:
    """The run's grader pool: its limits come from the config only (`make eval` reads them from run.json)."""
    return GraderPool(**grader_limits(vars(args)), grader=args.grader)


def apply_determinism(args: CapGRPOConfig) -> None:
    """`deterministic: true`, before any CUDA work (the cuBLAS workspace is read when its handle is made). Not the
    Trainer's `full_determinism`: that also sets CUDA_LAUNCH_BLOCKING=1, which would serialise every kernel."""
    if not args.deterministic:
        return
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # PyTorch's randomness notes: CUDA >= 10.2
    torch.use_deterministic_algorithms(True)  # an op with no deterministic kernel raises, naming itself
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.utils.deterministic.fill_uninitialized_memory = args.deterministic_fill_memory
    kv_writes.POSITION_WRITES = args.deterministic_kv_writes


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def resolve(args: CapGRPOConfig) -> Arm:
    """The arm (policy, gate, groups per step) of `arm` and `arms`: the trainer, run.json and the resume check
    all read this one."""
    try:
        return resolve_arm(args.arm, args.arms)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"arm: {e}") from None


def settled(args: CapGRPOConfig, arm: Arm, world: int) -> CapGRPOConfig:
    """The run's settings: a copy of the declaration with the arm's groups per step (and problems per round),
    vLLM only where it is installed, checked against the processes. One optimizer step = exactly
    groups_per_step × G rollouts, generated once and split into gradient-accumulation micro-batches."""
    run = copy.copy(args)
    if run.groups_per_step is None:
        run.groups_per_step = arm.groups_per_step
    if run.problems_per_round is None:
        run.problems_per_round = run.groups_per_step
    if run.use_vllm and not vllm_installed():
        # Recipes for the real run ask for vLLM; without it TRL's transformers generation is used.
        warnings.warn("use_vllm is set but vLLM is not installed: generating with transformers", stacklevel=2)
        run.use_vllm = False
    rollouts = run.groups_per_step * run.num_generations
    steps_of(rollouts, world, run.per_device_train_batch_size or rollouts // world)  # given rows: checked now
    if run.problems_per_round % world:
        raise ConfigError(
            f"problems_per_round={run.problems_per_round} must be divisible by {world} processes"
        )
    return run


def batch_arithmetic(args: CapGRPOConfig, micro_batch: MicroBatch, world: int) -> CapGRPOConfig:
    """What TRL's trainer reads of the micro-batch: a copy of the run's settings with the rows per micro-batch,
    the accumulation steps and checkpointing decided (as GRPOConfig would derive them from given values)."""
    trainer_args = copy.copy(args)
    rollouts = args.groups_per_step * args.num_generations
    trainer_args.per_device_train_batch_size = micro_batch.rows
    trainer_args.gradient_accumulation_steps = steps_of(rollouts, world, micro_batch.rows)
    trainer_args.steps_per_generation = trainer_args.gradient_accumulation_steps
    trainer_args.generation_batch_size = rollouts
    set_checkpointing(trainer_args, micro_batch.checkpointing)
    return trainer_args


def steps_of(rollouts: int, world: int, rows: int) -> int:
    """Gradient-accumulation steps of a step's rollouts over `world` processes in micro-batches of `rows`."""
    if rollouts % (world * rows):
        raise ConfigError(
            f"groups_per_step × num_generations = {rollouts} rollouts must split evenly over {world} "
            f"process(es) × per_device_train_batch_size={rows}"
        )
    return rollouts // (world * rows)


def check_inputs(args: CapGRPOConfig, model_args: ModelConfig) -> None:
    """Launch and path checks that need no file written and no model loaded."""
    # ZeRO-3 partitions weights and optimizer state in DeepSpeed's own layout (FSDP2 is gathered instead);
    # `accelerate launch` announces DeepSpeed in this variable.
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    if deepspeed and (args.eval_every > 0 or args.resume):
        raise ConfigError(
            "eval_every/resume: under DeepSpeed set eval_every: 0 (evaluate checkpoints with `make eval`) and "
            "do not --resume: in-training evaluation and exact resume need 1 process, DDP or FSDP2 (docs/gpu.md)"
        )
    # TRL 1.16 pushes weights to a vLLM server only through vLLM's NCCL weight-transfer engine, and refuses a
    # trainer without CUDA after the model is loaded (NotImplementedError; docs/gpu.md): say so first
    if args.use_vllm and args.vllm_mode == "server" and not torch.cuda.is_available():
        raise ConfigError(
            "vllm_mode: server needs a CUDA device on the trainer: TRL pushes the weights to the server over "
            "NCCL (vLLM's weight-transfer engine); on a CPU use vllm_mode: colocate (docs/gpu.md)"
        )
    for name, path in (args.eval_set_files or {}).items():
        if not Path(path).is_file():
            raise ConfigError(f"eval_set_files: {name}: {path}: no such file")
    if not args.snapshot_path:
        raise ConfigError("snapshot_path: required (a *.tasks.json task snapshot)")
    if not Path(args.snapshot_path).is_file():
        raise ConfigError(f"snapshot_path: {args.snapshot_path}: no such file")
    model = str(model_args.model_name_or_path or "")
    if not Path(model).exists() and (model.startswith((".", "/", "~")) or model.count("/") != 1):
        raise ConfigError(f"model_name_or_path: {model!r}: no such directory (and not a Hub id)")


def warn_unsaved(callbacks) -> None:
    for c in callbacks:
        if c.to_json()["state"] == "unsaved":
            logger.warning(
                "callbacks: %s keeps no state in stateNNN/: --resume of this run will refuse it", c.path
            )


def check_resume(run_dir: Path, args, model_args, arm: Arm, world: int, snapshot: dict, callbacks):
    """A resume's refusals, before anything is written or loaded: the run.json comparison (in the run's own
    micro-batch, run.json `launch.micro_batch`), then the state it picks (every hash verified).
    Returns (the Resume, the recorded MicroBatch or None)."""
    info = read_run_json(run_dir)
    launch = info.get("launch", {})
    saved_by = launch.get("num_processes")
    if saved_by is not None and saved_by != world:  # first: the batch fields it implies differ too
        raise ConfigError(
            f"{run_dir / 'run.json'}: the run was launched with {saved_by} process(es), this launch has "
            f"{world}; resume with --num_processes {saved_by}"
        )
    old = info.get("config", {})
    recorded = MicroBatch(**launch["micro_batch"]) if launch.get("micro_batch") else None
    # compared in the micro-batch this launch would train in: the run's own, unless the launch gives another
    ran = recorded or MicroBatch(
        old.get("per_device_train_batch_size"), old.get("gradient_checkpointing"), 0, ""
    )
    rows = args.per_device_train_batch_size or ran.rows
    checkpointing = ran.checkpointing if args.gradient_checkpointing is None else args.gradient_checkpointing
    now = args
    if rows:
        now = batch_arithmetic(args, replace(ran, rows=rows, checkpointing=checkpointing), world)
    refused, accepted = resume_changes(old, json.loads(now.to_json_string()))
    if info.get("base_model") != model_args.model_name_or_path:
        refused["model_name_or_path"] = [info.get("base_model"), model_args.model_name_or_path]
    if (was := info.get("snapshot", {}).get("sha256")) != snapshot["sha256"]:
        refused["snapshot sha256"] = [was, snapshot["sha256"]]
    if refused:
        shown = ", ".join(f"{k} {old!r} → {v!r}" for k, (old, v) in refused.items())
        raise ConfigError(
            f"{run_dir / 'run.json'}: a resume must keep the run's config, and this launch changes {shown} "
            "(drop those overrides, or start a new run with another --output_dir)"
        )
    if accepted:
        logger.warning("resume accepts changed %s (recorded in run.json)", ", ".join(accepted))
    event = {"changed": accepted}
    if (current := versions()) != info.get("versions"):
        event["versions"] = current
    if args.process_index == 0:  # a kill inside a re-save left `.stepNNN.old-<pid>/`: back before judging
        for restored in put_back_replaced(run_dir):
            logger.warning("%s: put back (a re-save was interrupted between its two renames)", restored)
    if args.world_size > 1:
        PartialState().wait_for_everyone()
    resume = load_resume_state(run_dir, args, arm)
    if resume.state is not None:
        refuse_unsaved_state(callbacks, resume.meta.get("callbacks"))
    return resume._replace(event=event), recorded


def load_base_model(path: str, dtype: str | None = None):
    """Load with the checkpoint's own class: AutoModelForCausalLM would turn Qwen3_5ForConditionalGeneration
    into a text-only model and drop the vision tower from every checkpoint we save."""
    config = AutoConfig.from_pretrained(path)
    arch = (config.architectures or ["AutoModelForCausalLM"])[0]
    torch_dtype = getattr(torch, dtype) if dtype not in (None, "auto") else "auto"
    model = getattr(transformers, arch).from_pretrained(path, dtype=torch_dtype)
    torch_on_cpu(model)  # fla installed: its Triton kernels for CUDA tensors only
    for name, p in model.named_parameters():
        if "visual" in name:  # the vision tower rides along untouched: text-only RL never updates it
            p.requires_grad_(False)
    return model, arch


def record_new_run(run_dir: Path, trainer, model_args, arch: str, tasks: RunTasks, spec: EvalSpec, callbacks):
    """A new run's run.json, in one write, with the launch as the accelerator sees it (FSDP shows only there)."""
    acc, run = trainer.accelerator, trainer.run_setup
    write_run_json(
        run_dir,
        trainer.args,
        arm=run.arm,
        base_model=model_args.model_name_or_path,
        architecture=arch,
        snapshot=tasks.snapshot,
        eval_sets=tasks.eval_sets,
        eval_spec=spec.to_json(),
        extra_evals=recorded_extra_evals(trainer.args, tasks),
        launch={
            "num_processes": acc.num_processes,
            "distributed_type": acc.distributed_type.value,
            # the GPU model: rows are bitwise only on the same one (another's kernels may sum in another order)
            "device": torch.cuda.get_device_name(acc.device)
            if acc.device.type == "cuda"
            else acc.device.type,
            # the optimizer that runs (`optim` is TrainingArguments' field, which CPUAdamW replaces)
            "optimizer": "CPUAdamW"
            if run.backends.cpu_adamw
            else str(getattr(trainer.args.optim, "value", trainer.args.optim)),
            "backends": run.backends.to_json(),
            "micro_batch": run.micro_batch.to_json(),
        },
        callbacks=[c.to_json() for c in callbacks],
    )


def record_resume_start(run_dir: Path, resume: Resume) -> None:
    """A resume's start: dead saves' temp files removed, the event appended to run.json, and the rows of
    steps past the state dropped (they are redone, identically; a state-less run restarts)."""
    steps = sorted(
        d for d in run_dir.glob("step[0-9][0-9][0-9]*") if d.is_dir()
    )  # a killed card write: its temp
    for d in [run_dir, run_dir / "results", *steps]:
        for removed in remove_interrupted_saves(d):
            logger.warning("removed %s (a save interrupted before it completed)", removed)
    state = resume.state.name if resume.state else None
    record_resume(
        run_dir, {"from_state": state, "step": resume.meta["step"], **resume.event, "skipped": resume.skipped}
    )
    rewind(run_dir, after=resume.meta["step"])


def evaluation_callback(trainer, tasks: RunTasks, spec: EvalSpec, grader, extra: dict) -> EvalCallback | None:
    args = trainer.args
    if args.eval_every <= 0:
        return None
    return EvalCallback(
        Path(args.output_dir),
        tasks.eval_tasks(),
        spec,
        eval_every=args.eval_every,
        tokenizer=trainer.processing_class,
        grade_fn=grader.grade_batch,
        log_fn=trainer.log_eval_metrics,
        llm_fn=trainer.synced_vllm_engine if spec.generation == "vllm" else None,
        eval_steps=args.eval_at_steps,
        step0_rows=args.step0_eval_from,
        extra=extra,
        extra_steps=args.extra_eval_steps,
    )


def recorded_extra_evals(args, tasks: RunTasks) -> dict | None:
    """run.json's `extra_evals`: what, when, and the files' hashes (None without extra_evals)."""
    if not args.extra_evals:
        return None
    return {"evals": args.extra_evals, "steps": args.extra_eval_steps, "sets": dict(tasks.extra_files)}


def extra_eval_tasks(args, tasks: RunTasks) -> dict[int, dict[str, list[dict]]]:
    """extra_evals (SET@CAP, checked by the config) as {cap: {set: tasks}}: the run's own sets or eval_set_files'
    (every problem)."""
    by_name = {**tasks.eval_tasks(), **tasks.extra_sets}
    return {
        cap: {n: by_name[n] for n in names} for cap, names in extra_evals_by_cap(args.extra_evals).items()
    }


def add_run_callbacks(trainer, run_dir: Path, base: Path, eval_cb, resume: Resume | None) -> None:
    """Ours, after the recipe's: the Trainer calls callbacks in the order added, and a step's end goes: train
    time closed (StepsLog), then evaluation (EvalCallback), then the row with both (StepsLog.on_log), then
    saving (CheckpointCallback), whose duration the next row reports. The recipe's callbacks come first, so
    one that stops training in on_step_end or on_log has its last step saved."""
    saver = CheckpointCallback(trainer, run_dir, base_dir=base)
    stop = StopOnSignal(trainer.accelerator)
    trainer.add_callback(stop)  # SIGTERM/SIGUSR1: this step saved, then stop
    skip = trainer.args.nonfinite_gradient == "skip"
    trainer.add_callback(NonFiniteGradientGuard(trainer, skip))  # a NaN gradient: stop, or skip its update
    trainer.add_callback(StepsLog(trainer, run_dir, eval_callback=eval_cb, checkpoint_callback=saver))
    if eval_cb is not None:
        trainer.add_callback(eval_cb)
    trainer.add_callback(saver)
    trainer.add_callback(stop.after_save())  # a notice during a checkpoint step's save: stop there
    if (
        resume is not None and resume.state is not None
    ):  # last: after BEMA's on_train_begin builds its buffers
        trainer.add_callback(RestoreCallbackState(trainer, resume.tensors, resume.meta.get("callbacks", {})))
