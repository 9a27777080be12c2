"""Checkpoints (SPEC §6): `stepNNN/` bf16 weights with a generated card, `stateNNN/` exact-resume state.

Saving happens right after a step's row is in steps.jsonl, so a state never exists without its row.
Resume goes through the Trainer's own resume path with three overrides in `CapGRPOTrainer`
(`_load_from_checkpoint`, `_load_optimizer_and_scheduler`, `_load_rng_state`) that read `stateNNN/`.
"""

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.utils import logging

from cards.cleanup import scrub_checkpoint_dir
from cards.run_card import write_run_card
from data.atomic import FILE_MODE, disk_full, is_disk_full
from data.eval_sets import HELDOUT
from engine import sharding
from engine.cpu_adamw import CPUAdamW
from rundir.files import Run, read_jsonl, state_dir, state_name, step_dir, steps_path
from rundir.run_json import update_run_json
from rundir.state import (
    SEAL,
    StateError,
    capture_rng_state,
    check_free_space,
    check_state,
    install_dir,
    load_state,
    save_state,
    state_dirs,
    verify_state,
)
from rundir.step import mark_verified, step_verified, verify_step, write_manifest
from trainer.callbacks import export_callback_state

logger = logging.get_logger(__name__)


def is_checkpoint_step(step: int, args) -> bool:
    every = args.checkpoint_every
    return step in set(args.checkpoint_steps) or bool(every and step % every == 0) or step == args.max_steps


# --- optimizer state, keyed by parameter name ---------------------------------------------------------
def export_optimizer(trainer) -> tuple[dict[str, torch.Tensor], dict]:
    """fp32 masters + exp_avg + exp_avg_sq per trainable parameter, whichever AdamW is in use.

    Every process calls it (under FSDP2 it gathers the shards); only the main process's result is complete.
    """
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if isinstance(opt, CPUAdamW):
        return opt.export_state()
    model = trainer.accelerator.unwrap_model(trainer.model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if sharding.is_sharded(model):
        params, states = sharding.full_parameters(model), sharding.full_adamw_state(model, opt)
    else:
        params = {n: p.detach() for n, p in named}
        states = {n: opt.state.get(p, {}) for n, p in named}
    tensors, steps = {}, {}
    for name, _ in named:
        if name not in params:  # a process other than the main one, under FSDP2
            continue
        tensors[f"master/{name}"] = params[name].float().cpu().contiguous()
        if st := states.get(name):
            tensors[f"exp_avg/{name}"] = st["exp_avg"].detach().float().cpu().contiguous()
            tensors[f"exp_avg_sq/{name}"] = st["exp_avg_sq"].detach().float().cpu().contiguous()
            steps[name] = float(st["step"])
    return tensors, {"optimizer": type(opt).__name__, "steps": steps}


def import_optimizer(trainer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    if isinstance(opt, CPUAdamW):
        opt.import_state(tensors, meta)
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    if sharding.is_sharded(model):
        state = {
            name: {
                "step": torch.tensor(step),
                "exp_avg": tensors[f"exp_avg/{name}"],
                "exp_avg_sq": tensors[f"exp_avg_sq/{name}"],
            }
            for name, step in meta["steps"].items()
        }
        sharding.load_full_adamw_state(model, opt, state)
        return
    # torch's fused and capturable AdamW keep `step` on the parameter's device (as its load_state_dict restores it)
    on_device = {
        id(q) for g in opt.param_groups if g.get("fused") or g.get("capturable") for q in g["params"]
    }
    for name, p in model.named_parameters():
        if name in meta["steps"]:
            device = p.device if id(p) in on_device else "cpu"
            opt.state[p] = {
                "step": torch.tensor(meta["steps"][name], dtype=torch.float32, device=device),
                "exp_avg": tensors[f"exp_avg/{name}"].to(p.device, p.dtype),
                "exp_avg_sq": tensors[f"exp_avg_sq/{name}"].to(p.device, p.dtype),
            }


def load_masters_into_model(model, tensors: dict[str, torch.Tensor]) -> None:
    """Weights come from the fp32 masters, not from the bf16 stepNNN/: that is what makes resume exact."""
    masters = {k.removeprefix("master/"): v for k, v in tensors.items() if k.startswith("master/")}
    if sharding.is_sharded(model):
        sharding.load_full_parameters(model, masters)
        return
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in masters:
                p.copy_(masters[name].to(p.dtype))


# --- saving -------------------------------------------------------------------------------------------
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json", "processor_config.json")


def _weights_bytes(bf16: dict[str, torch.Tensor], base: str) -> int:
    """What a save writes, estimated from above before writing: the tensors, 256 bytes per tensor for its
    safetensors header entry (name, dtype, shape, offsets: ~150), and for config, tokenizer and manifest the
    size of the base's own non-weight files plus 64 KiB."""
    files = [p for p in Path(base).glob("*") if p.is_file() and p.suffix != ".safetensors"] if base else []
    return (
        sum(v.nbytes for v in bf16.values()) + 256 * len(bf16) + sum(p.stat().st_size for p in files) + 2**16
    )


def save_weights(trainer, target: Path) -> None:
    """bf16 safetensors + config (the base's own architecture) + tokenizer + generation config + card.

    Written to `.stepNNN.tmp-<pid>/`, hashed into its manifest.json (rundir/step.py), and installed like a
    state (`install_dir`): an existing stepNNN/ is replaced only once the new one is complete; a failed save
    removes its temp dir."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    state = trainer.accelerator.get_state_dict(trainer.model)  # gathers sharded (FSDP/ZeRO-3) weights
    if not trainer.accelerator.is_main_process:
        return
    bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}
    needed = _weights_bytes(bf16, model.name_or_path)
    target.parent.mkdir(parents=True, exist_ok=True)
    check_free_space(target, needed)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    dtype, model.config.dtype = model.config.dtype, torch.bfloat16
    try:
        model.save_pretrained(tmp, state_dict=bf16, safe_serialization=True)
        trainer.processing_class.save_pretrained(tmp)
        for name in PROCESSOR_FILES:  # the base's; vLLM builds Qwen3.5's image processor even for text
            if (src := Path(model.name_or_path) / name).is_file():
                shutil.copy(src, tmp / name)
        for f in tmp.rglob("*"):
            if f.is_file():
                f.chmod(FILE_MODE)  # safetensors' writer leaves model.safetensors private (0600)
        write_manifest(tmp)
    except BaseException as e:
        full = disk_full(target, needed) if is_disk_full(e) else None  # the free space as the save met it
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise full from None
        raise
    finally:
        model.config.dtype = dtype
    install_dir(tmp, target)
    mark_verified(target)  # hashed on the way by this process


def save_state_dir(trainer, run_dir: Path, step: int) -> Path | None:
    """Every process calls it (FSDP2 gathers shards, each process has its own RNG streams); the main one
    writes stateNNN/ and returns its path."""
    acc = trainer.accelerator
    if trainer.is_deepspeed_enabled:  # its optimizer partitions state its own way; see docs/gpu.md
        logger.warning("stateNNN/ is not written under DeepSpeed: exact resume needs 1 process, DDP or FSDP2")
        return None
    tensors, opt_meta = export_optimizer(trainer)
    callback_tensors, callback_meta = export_callback_state(
        trainer
    )  # e.g. BEMA's averages (trainer/callbacks.py)
    rng = gather_object([capture_rng_state()])  # one entry per process, in process order
    if not acc.is_main_process:
        return None
    arm = trainer.arm
    meta = {
        "step": step,
        "checkpoint_id": f"{Path(run_dir).name}/{state_name(step)}",
        "arm": arm.name,
        "policy_id": arm.policy_id,
        "num_processes": acc.num_processes,
        "task_sampler": trainer.task_sampler.state_dict(),
        "rng": rng,
        "scheduler": trainer.lr_scheduler.state_dict(),
        "optimizer": opt_meta,
        "callbacks": callback_meta,
    }
    target = save_state(
        state_dir(run_dir, step),
        tensors=tensors | callback_tensors,
        meta=meta,
        extra_json={"trainer_state.json": dataclasses.asdict(trainer.state)},  # as TrainerState.save_to_json
    )
    _verified.add(_seal(target))  # written and hashed on the way by this process
    return target


# --- which states are verified: hashing a 100 GB state costs a minute, so each is hashed once per process
_verified: set[tuple[str, str]] = set()


def _seal(state: Path) -> tuple[str, str]:
    return str(Path(state).resolve()), (Path(state) / SEAL).read_text().strip()


def is_verified(state: Path) -> bool:
    """The state and the stepNNN/ beside it (what a resume from it needs): structure and sizes checked every
    time, the sha256 of each once per process (then cached by seal or manifest)."""
    try:
        check_state(state)
        if _seal(state) not in _verified:
            verify_state(state)
            _verified.add(_seal(state))
    except (StateError, OSError):
        return False
    return step_verified(step_dir(state.parent, _number(state)))


def prune_states(run_dir: Path, keep: int) -> list[Path]:
    """Keep the newest `keep` verified states (0: all); delete the states older than those, and broken ones
    older than the newest verified (named in a warning). A state whose stepNNN/ does not verify counts as
    broken. A broken state is never kept in place of a good one; broken states newer than every verified
    one are left for resume to name. stepNNN/ weights are never deleted."""
    if keep <= 0:
        return []
    kept: list[Path] = []
    doomed: list[Path] = []
    for d in reversed(state_dirs(run_dir)):
        if len(kept) == keep:
            doomed.append(d)  # past the window, verified or not: not hashed just to be deleted
        elif is_verified(d):
            kept.append(d)
        elif kept:
            logger.warning("removing %s: not a complete, verified state (superseded by %s)", d, kept[0])
            doomed.append(d)
    for d in doomed:
        shutil.rmtree(d)
    return doomed


class CheckpointCallback(TrainerCallback):
    """Saves stepNNN/ (+ its card) and stateNNN/ at the configured steps, after the step's row is written."""

    def __init__(self, trainer, run_dir: Path, base_dir: Path):
        self.trainer, self.run_dir, self.base_dir = trainer, Path(run_dir), Path(base_dir)
        self.last_seconds = 0.0  # the last save's duration, until StepsLog puts it in the next row

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        # a callback that stops training (control.should_training_stop) gets its last step saved
        if (
            not logs
            or "loss" not in logs
            or not (is_checkpoint_step(step, args) or control.should_training_stop)
        ):
            return
        t0 = time.perf_counter()
        if step == args.max_steps and not args.save_last_step and step not in set(args.checkpoint_steps):
            # nothing would read it: the launcher drops a finished run's weights (0.5B: ~18 s, 1.5B: ~50 s)
            if self.trainer.accelerator.is_main_process:
                update_run_json(self.run_dir, best_step=Run(self.run_dir).best_step(HELDOUT))
                write_run_card(self.run_dir)
            return
        save_weights(self.trainer, step_dir(self.run_dir, step))
        save_state_dir(self.trainer, self.run_dir, step)
        if self.trainer.accelerator.is_main_process:
            prune_states(self.run_dir, args.keep_states)
            update_run_json(self.run_dir, best_step=Run(self.run_dir).best_step(HELDOUT))
            scrub_checkpoint_dir(step_dir(self.run_dir, step), self.base_dir)  # also writes our card
            write_run_card(self.run_dir)
        self.trainer.accelerator.wait_for_everyone()
        self.last_seconds = time.perf_counter() - t0


# --- resume -------------------------------------------------------------------------------------------
def _number(state: Path) -> int:
    return int(state.name.removeprefix("state"))


class Resume(NamedTuple):
    state: Path | None  # None: no state yet, the run starts over from step 0
    tensors: dict[str, torch.Tensor]
    meta: dict
    skipped: list[str]  # broken newer states passed over under --resume-fallback, with what is wrong
    event: dict = {}  # run.json's resume event: the accepted config changes, new versions (trainer/setup.py)


def _usable(run_dir: Path, state: Path, steps_logged: set[int]) -> tuple[dict[str, torch.Tensor], dict]:
    """Load `state` if it is complete and consistent with the run; StateError naming what is wrong."""
    step = _number(state)
    weights = step_dir(run_dir, step)
    if not weights.is_dir():
        raise StateError(f"{weights}: missing (resume needs the stepNNN/ beside {state.name}/)")
    verify_step(weights)
    tensors, meta = load_state(state)  # every byte verified before anything is loaded
    if meta.get("step") != step:
        raise StateError(f"{state / 'meta.json'}: step {meta.get('step')!r}, the directory says {step}")
    if step not in steps_logged:
        raise StateError(
            f"{run_dir / 'results' / 'steps.jsonl'}: no row for step {step} ({state.name}/ has one)"
        )
    _verified.add(_seal(state))
    return tensors, meta


def load_resume_state(run_dir: Path, args, arm) -> Resume:
    """The newest complete stateNNN/ of `run_dir` with its stepNNN/, every hash verified before the model is
    touched. A newer broken state is named and refused unless `args.resume_fallback`. A run with no state
    at all (killed before its first one) starts over from step 0 (`state` None)."""
    run_dir = Path(run_dir)
    states = state_dirs(run_dir)
    if not states:
        logger.warning(
            "%s: no stateNNN/ yet (stopped before its first state): starting over from step 0", run_dir
        )
        return Resume(None, {}, {"step": 0}, [])
    path = steps_path(run_dir)  # a torn last row is a step past every state: dropped, redone
    steps_logged = {r.get("step") for r in read_jsonl(path, torn_tail="drop")} if path.is_file() else set()
    broken, chosen = [], None
    for state in reversed(states):
        try:
            tensors, meta = _usable(run_dir, state, steps_logged)
        except StateError as e:
            broken.append(str(e))
            continue
        chosen = state
        break
    way_on = (
        "add --resume-fallback to resume from it (the broken state or checkpoint is replaced when its step is "
        "saved again)"
    )
    if chosen is None and not args.resume_fallback:
        raise StateError(
            f"no complete state to resume from in {run_dir}: "
            + "; ".join(broken)
            + " (--resume-fallback starts over from step 0)"
        )
    if broken and not args.resume_fallback:
        raise StateError(f"{broken[0]}; the newest complete state is {chosen.name}/: {way_on}")
    for reason in broken:
        logger.warning("--resume-fallback: skipping a broken state: %s", reason)
    if chosen is None:
        return Resume(None, {}, {"step": 0}, broken)
    for field, value in (("arm", arm.name), ("policy_id", arm.policy_id)):
        if meta.get(field) != value:  # another arm's state: never a fallback
            raise StateError(
                f"{chosen / 'meta.json'}: field {field!r} is {meta.get(field)!r}, expected {value!r}"
            )
    if isinstance(meta.get("rng"), dict):  # written before states held one RNG entry per process
        meta["rng"] = [meta["rng"]]
    saved_by = len(meta.get("rng", []))
    if saved_by != args.world_size:  # rollouts and RNG streams are per process: another split is another run
        raise StateError(
            f"{chosen}: saved by {saved_by} process(es), this launch has {args.world_size}; "
            f"resume with --num_processes {saved_by}"
        )
    return Resume(chosen, tensors, meta, broken)
