"""Train one arm: `python -m trainer.train --config configs/embedded.yaml --arm S2 [--field value ...]`.

Every field of `CapGRPOConfig` (TRL's `GRPOConfig` + ours) and TRL's `ModelConfig` can be set in the YAML
recipe or overridden on the command line (`TrlParser`).

Refusals (a bad field, a non-empty output_dir, a run directory another process holds, a resume that would
not be exact, a broken state or checkpoint, a full, read-only or forbidden disk) print one `error: ...` line
naming the path and exit with status 1, before anything is written; `--debug` or CAPGRPO_DEBUG=1 shows the
traceback instead. Ctrl-C prints one line
with the step reached and the resume command (status 130).
"""

import contextlib
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

# Threads waiting for work sleep instead of spinning: on a CPU shared with other work the spinning threads of a
# two-thread training pass (cpu_threads: 2) stalled it ~4x (bench/cpu_profile.py --threads). Read at torch load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import transformers
import yaml
from accelerate import PartialState
from transformers import AutoConfig, AutoTokenizer
from transformers.utils import logging
from trl import ModelConfig, TrlParser, get_peft_config
from trl.generation.vllm_generation import VLLMGeneration

from data.atomic import DiskFullError, is_disk_full, refused_write
from data.eval_sets import FIXED, HELDOUT, choose_eval_sets, heldout_pool_of
from data.sampler import TaskSampler
from data.snapshot import SnapshotError, load_snapshot, snapshot_sha256
from rundir.files import RunFileError
from rundir.lock import RunLock, RunLockedError, require_shared
from rundir.resume import interrupted, rewind
from rundir.run_json import (
    RunDirError,
    read_run_json,
    record_resume,
    refuse_non_empty,
    update_run_json,
    versions,
    write_run_json,
)
from rundir.state import StateError, put_back_replaced, remove_interrupted_saves
from trainer.callbacks import CallbackEntry, RestoreCallbackState, refuse_unsaved_state, resolve_callbacks
from trainer.checkpoint import CheckpointCallback, Resume, load_resume_state
from trainer.chunked_gated_delta import torch_on_cpu
from trainer.config import CapGRPOConfig, ConfigError, refuse_absurd_numbers, resume_changes
from trainer.eval_callback import EvalCallback
from trainer.evaluation import EvalSpec, refuse_past_positions
from trainer.finite_gradients import NonFiniteGradientError, NonFiniteGradientGuard
from trainer.grpo import CapGRPOTrainer
from trainer.micro_batch import MicroBatch
from trainer.steps_log import StepsLog
from trainer.stop_signal import StopOnSignal


class VLLMServerError(Exception):
    """The vLLM server (`vllm_mode: server`) cannot be reached or stopped answering; the message says where the
    run stands."""


REFUSALS = (
    ConfigError, RunDirError, RunLockedError, RunFileError, StateError, DiskFullError, SnapshotError,
    VLLMServerError, NonFiniteGradientError,
)  # fmt: skip
logger = logging.get_logger(__name__)


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
    refuse_server_without_cuda(args)
    if not args.snapshot_path:
        raise ConfigError("snapshot_path: required (a *.tasks.json task snapshot)")
    if not Path(args.snapshot_path).is_file():
        raise ConfigError(f"snapshot_path: {args.snapshot_path}: no such file")
    model = str(model_args.model_name_or_path or "")
    if not Path(model).exists() and (model.startswith((".", "/", "~")) or model.count("/") != 1):
        raise ConfigError(f"model_name_or_path: {model!r}: no such directory (and not a Hub id)")


def refuse_server_without_cuda(args: CapGRPOConfig) -> None:
    """TRL 1.16 pushes weights to a vLLM server only through vLLM's NCCL weight-transfer engine, and refuses
    a trainer without CUDA after the model is loaded (NotImplementedError; docs/gpu.md): say so first."""
    if args.use_vllm and args.vllm_mode == "server" and not torch.cuda.is_available():
        raise ConfigError(
            "vllm_mode: server needs a CUDA device on the trainer: TRL pushes the weights to the server over "
            "NCCL (vLLM's weight-transfer engine); on a CPU use vllm_mode: colocate (docs/gpu.md)"
        )


def server_lost(args: CapGRPOConfig, e: OSError, trainer) -> VLLMServerError | None:
    """A connection error from TRL's vLLM client (requests, or its own ConnectionError at start) in server
    mode, as one line: where the server was and where the run stands. None for any other error."""
    client = type(e).__module__.startswith(("requests", "urllib3")) or isinstance(e, ConnectionError)
    if not (args.use_vllm and args.vllm_mode == "server" and client):
        return None
    url = args.vllm_server_base_url or f"http://{args.vllm_server_host}:{args.vllm_server_port}"
    what = " ".join(f"{type(e).__name__}: {e}".split())[:300]
    if trainer is None:  # TRL's client waits vllm_server_timeout seconds for the server at trainer init
        return VLLMServerError(
            f"vLLM server {url}: not reachable ({what}); start it first (`trl vllm-serve`, docs/gpu.md); "
            "nothing was written"
        )
    return VLLMServerError(
        f"vLLM server {url}: stopped answering ({what}); the run stopped, {interrupted(args.output_dir)} "
        "once the server is back"
    )


def resume_event(run_dir: Path, args: CapGRPOConfig, model_args: ModelConfig, snapshot: dict) -> dict:
    """Compare this launch with the run's run.json: refuse (by name, old → new) what would break exactness,
    return the accepted changes for the resume event."""
    info = read_run_json(run_dir)
    saved_by = info.get("launch", {}).get("num_processes")
    if saved_by is not None and saved_by != args.world_size:  # first: the batch fields it implies differ too
        raise ConfigError(
            f"{run_dir / 'run.json'}: the run was launched with {saved_by} process(es), this launch has "
            f"{args.world_size}; resume with --num_processes {saved_by}"
        )
    new = json.loads(args.to_json_string())
    refused, accepted = resume_changes(info.get("config", {}), new)
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
    if (now := versions()) != info.get("versions"):
        event["versions"] = now
    return event


class Launch(NamedTuple):
    callbacks: list[CallbackEntry]  # the recipe's, resolved
    snapshot: dict  # {"path", "sha256"}
    resume: Resume | None  # None: a new run
    event: dict | None  # the resume event for run.json


def check_launch(args: CapGRPOConfig, model_args: ModelConfig) -> Launch:
    """Every refusal, before anything is written or loaded: inputs and callbacks, then for a resume the
    run.json comparison and the state it picks (every hash verified), else an empty output_dir. A resume
    adopts the run's own micro-batch (run.json launch.micro_batch)."""
    run_dir = Path(args.output_dir)
    check_inputs(args, model_args)
    callbacks = resolve_callbacks(args.callbacks)
    snapshot = {"path": str(args.snapshot_path), "sha256": snapshot_sha256(args.snapshot_path)}
    if not args.resume:
        refuse_non_empty(run_dir)
        for c in callbacks:
            if c.to_json()["state"] == "unsaved":
                logger.warning(
                    "callbacks: %s keeps no state in stateNNN/: --resume of this run will refuse it", c.path
                )
        return Launch(callbacks, snapshot, None, None)
    event = resume_event(run_dir, args, model_args, snapshot)
    if args.process_index == 0:  # a kill inside a re-save left `.stepNNN.old-<pid>/`: back before judging
        for restored in put_back_replaced(run_dir):
            logger.warning("%s: put back (a re-save was interrupted between its two renames)", restored)
    if args.world_size > 1:
        PartialState().wait_for_everyone()
    resume = load_resume_state(run_dir, args)
    if resume.state is not None:
        refuse_unsaved_state(callbacks, resume.meta.get("callbacks"))
    if chosen := read_run_json(run_dir).get("launch", {}).get("micro_batch"):
        args.set_micro_batch(MicroBatch(**chosen))  # a resume trains in the run's own micro-batches
    return Launch(callbacks, snapshot, resume, event)


def record_launch(
    run_dir: Path, args, model_args, trainer, arch, snapshot, eval_sets, spec, callbacks
) -> None:
    """A new run's run.json, with the launch as the accelerator sees it (FSDP shows only there)."""
    write_run_json(
        run_dir,
        args,
        base_model=model_args.model_name_or_path,
        architecture=arch,
        snapshot=snapshot,
        eval_sets=eval_sets,
        eval_spec=spec.to_json(),
    )
    acc = trainer.accelerator
    update_run_json(
        run_dir,
        launch={
            "num_processes": acc.num_processes,
            "distributed_type": acc.distributed_type.value,
            # the optimizer that runs (`optim` is TrainingArguments' field, which CPUAdamW replaces)
            "optimizer": "CPUAdamW"
            if trainer.uses_cpu_adamw()
            else str(getattr(args.optim, "value", args.optim)),
            "backends": args.resolved_backends().to_json(),
            "micro_batch": args.resolved_micro_batch().to_json(),  # decided at trainer init
        },
        callbacks=[c.to_json() for c in callbacks],
    )


def record_resume_start(run_dir: Path, resume: Resume, event: dict) -> None:
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
        run_dir, {"from_state": state, "step": resume.meta["step"], **event, "skipped": resume.skipped}
    )
    rewind(run_dir, after=resume.meta["step"])


def evaluation_callback(trainer, args, tasks: dict, eval_sets, spec: EvalSpec, grader) -> EvalCallback | None:
    if args.eval_every <= 0:
        return None
    return EvalCallback(
        Path(args.output_dir),
        {FIXED: [tasks[t] for t in eval_sets.fixed], HELDOUT: [tasks[t] for t in eval_sets.heldout]},
        spec,
        eval_every=args.eval_every,
        tokenizer=trainer.processing_class,
        grade_fn=grader.grade_batch,
        log_fn=trainer.log_eval_metrics,
        llm_fn=trainer.synced_vllm_engine if spec.generation == "vllm" else None,
        eval_steps=args.eval_at_steps,
        step0_rows=args.step0_eval_from,
    )


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


def apply_determinism(args: CapGRPOConfig) -> None:
    """`deterministic: true`, before any CUDA work (the cuBLAS workspace is read when its handle is made). Not the
    Trainer's `full_determinism`: that also sets CUDA_LAUNCH_BLOCKING=1, which would serialise every kernel."""
    if not args.deterministic:
        return
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"  # PyTorch's randomness notes: CUDA >= 10.2
    torch.use_deterministic_algorithms(True)  # an op with no deterministic kernel raises, naming itself
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.utils.deterministic.fill_uninitialized_memory = args.deterministic_fill_memory


def build_trainer(args: CapGRPOConfig, model_args: ModelConfig, extra_callbacks=()) -> CapGRPOTrainer:
    """`extra_callbacks`: callback objects of a Python caller, beside the recipe's `callbacks:`."""
    run_dir = Path(args.output_dir)
    apply_determinism(args)
    if not torch.cuda.is_available():
        # The embedded model is op-overhead bound: on 2 shared cores one thread generates ~5x faster.
        torch.set_num_threads(args.cpu_threads)
    launch = check_launch(args, model_args)
    callbacks, resume = launch.callbacks, launch.resume
    early = [c.build() for c in callbacks if not c.needs_trainer]  # a failing constructor: before the model
    if args.world_size > 1:  # no process writes before every process has checked
        PartialState().wait_for_everyone()

    tasks_ds = load_snapshot(args.snapshot_path, expected_sha256=args.snapshot_sha256)
    tasks = {row["id"]: row for row in tasks_ds}
    eval_sets = choose_eval_sets(
        list(tasks),
        seed=args.eval_set_seed,
        heldout_size=args.heldout_size,
        fixed_size=args.fixed_size,
        heldout_pool=heldout_pool_of(tasks.values(), args.heldout_subject),
    )
    model, arch = load_base_model(model_args.model_name_or_path, model_args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(model_args.model_name_or_path, padding_side="left")
    problems = [t["problem"] for t in tasks.values()]
    caps = {"max_completion_length": args.max_completion_length, "eval_cap": args.eval_cap}
    refuse_past_positions(
        model.config,
        tokenizer,
        problems,
        args.system_prompt,
        caps,
        model_args.model_name_or_path,
        ConfigError,
    )
    spec = EvalSpec.from_config(args)
    grader = args.grader_pool()
    trainer = CapGRPOTrainer(
        model,
        args,
        tasks={t: tasks[t] for t in eval_sets.train_pool},
        sampler=TaskSampler(list(eval_sets.train_pool), seed=args.task_seed),
        grader=grader,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
        callbacks=[*early, *extra_callbacks],
        resume=resume,
    )
    for c in callbacks:  # in the recipe's order, after the early ones (which need no trainer)
        if c.needs_trainer:
            trainer.add_callback(c.build(trainer))
    if args.process_index == 0 and resume is None:
        record_launch(run_dir, args, model_args, trainer, arch, launch.snapshot, eval_sets, spec, callbacks)
    elif args.process_index == 0:
        record_resume_start(run_dir, resume, launch.event)
    eval_cb = evaluation_callback(trainer, args, tasks, eval_sets, spec, grader)
    add_run_callbacks(trainer, run_dir, Path(model_args.model_name_or_path), eval_cb, resume)
    return trainer


class Interrupted(Exception):
    """Ctrl-C: the message is the step reached and the resume command."""


class RecipeParser(TrlParser):
    """TrlParser whose refusals are one line: argparse's own error prints the whole usage (~220 lines)."""

    def error(self, message: str):
        raise CommandLineError(f"{message} (python -m trainer.train --help lists every field)")


class CommandLineError(ValueError):
    """A command line or recipe we cannot parse; the message names the flag, file, line or key. Exit 2."""


def check_recipe(argv: list[str]) -> None:
    """The --config recipe, checked before TrlParser reads it: there, a missing file, bad YAML or a file that is
    no mapping end in tracebacks, and an unknown key (a typo: `max_stepz: 3`) is silently ignored."""
    if "--config" not in argv:
        return
    i = argv.index("--config")
    if i + 1 == len(argv) or argv[i + 1].startswith("--"):
        raise CommandLineError("--config: expected a recipe file")
    path = Path(argv[i + 1])
    try:
        recipe = yaml.safe_load(path.read_text())
    except OSError as e:
        raise CommandLineError(f"{path}: cannot read the recipe ({e.strerror})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise CommandLineError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(recipe, dict):
        kind = "empty" if recipe is None else f"a {type(recipe).__name__}"
        raise CommandLineError(f"{path}: a recipe is a mapping of config fields, this one is {kind}")
    known = {f.name for cls in (CapGRPOConfig, ModelConfig) for f in dataclasses.fields(cls)} | {"env"}
    if unknown := sorted(set(recipe) - known):
        raise CommandLineError(
            f"{path}: unknown key(s) {', '.join(unknown)} (not a field of CapGRPOConfig or ModelConfig)"
        )


def split_config_flag(argv: list[str]) -> list[str]:
    """`--config=FILE` as `--config FILE`: TrlParser looks for the bare flag only, and argparse let the `=` form
    through unread, so the run went on with the defaults and failed elsewhere. Given twice: refused (TrlParser
    would read the first)."""
    out = []
    for arg in argv:
        out += ["--config", arg.removeprefix("--config=")] if arg.startswith("--config=") else [arg]
    if out.count("--config") > 1:
        raise CommandLineError(
            "--config: given more than once (one recipe per run; override fields with flags)"
        )
    if "--config" in out and out[out.index("--config") + 1 :][:1] == [""]:
        raise CommandLineError("--config: expected a recipe file")
    return out


def parse(argv: list[str] | None) -> tuple[CapGRPOConfig, ModelConfig]:
    argv = split_config_flag(list(sys.argv[1:] if argv is None else argv))
    check_recipe(argv)
    try:
        return RecipeParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(argv)
    except ValueError as e:
        # HfArgumentParser's "Some specified arguments are not used…: ['--no_such_flag', '3']"
        if "not used by the HfArgumentParser" not in str(e):
            raise
        raise CommandLineError(f"unknown argument(s): {str(e).split(': ', 1)[-1]}") from None


def train(argv: list[str] | None) -> None:
    args, model_args = parse(argv)
    refuse_absurd_numbers(model_args)  # CapGRPOConfig's own fields are checked as it is built
    lock = RunLock(args.output_dir) if args.process_index == 0 else contextlib.nullcontext()
    trainer = None
    try:
        with lock:  # one writer per run directory, from before its first byte to the end
            if args.world_size > 1:  # every node reads (and resumes from) the directory rank 0 writes
                require_shared(args.output_dir)
            trainer = build_trainer(args, model_args)
            trainer.train(resume_from_checkpoint=str(trainer.resume_state) if trainer.resume_state else None)
    except KeyboardInterrupt:
        raise Interrupted(interrupted(args.output_dir)) from None
    except OSError as e:
        if (lost := server_lost(args, e, trainer)) is not None:
            raise lost from None
        raise
    trainer.accelerator.wait_for_everyone()  # processes leave together: an early exit can abort the others'
    close_vllm(trainer)
    trainer.accelerator.end_training()  # gloo/NCCL teardown (destroys the process group)


def close_vllm(trainer) -> None:
    """A colocated engine's teardown destroys vLLM's process groups, then the default one. Left to the
    interpreter's exit, it ran after end_training had destroyed the default group, and every process of a
    multi-process run ended on a traceback ("Invalid process group specified"; docs/gpu.md)."""
    engine = getattr(trainer, "vllm_generation", None)
    if isinstance(engine, VLLMGeneration) and engine.mode == "colocate":
        engine.llm.llm_engine.engine_core.shutdown()


def _pop_debug(argv: list[str]) -> bool:
    """A bare `--debug` is ours (TrainingArguments' own --debug takes a value)."""
    for i, arg in enumerate(argv):
        if arg == "--debug" and (i + 1 == len(argv) or argv[i + 1].startswith("-")):
            del argv[i]
            return True
    return False


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = _pop_debug(argv) or os.environ.get("CAPGRPO_DEBUG", "") not in ("", "0")
    try:
        train(argv)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every rank, after its last collective: left to interpreter exit, gloo's threads sometimes abort the
            # exiting process ("terminate called without an active exception"; docs/gpu.md)
            torch.distributed.destroy_process_group()
    except Interrupted as e:
        print(e, file=sys.stderr)
        sys.exit(130)
    except CommandLineError as e:
        if debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (*REFUSALS, OSError) as e:
        full = is_disk_full(e) and not isinstance(e, DiskFullError)  # a write outside our savers
        # a read-only or forbidden run directory (the lock, run.json, a save): the path, not a traceback
        refused = None if isinstance(e, REFUSALS) or full else refused_write(e)
        if debug or not (isinstance(e, REFUSALS) or full or refused):
            raise
        if full:
            e = f"{e.filename or 'a file of the run'}: not written, the disk is full (free some space, then resume)"
        print(f"error: {refused or e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
