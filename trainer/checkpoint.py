"""Checkpoints (SPEC §6): `stepNNN/` bf16 weights with a generated card, `stateNNN/` exact-resume state.

Saving happens right after a step's row is in steps.jsonl, so a state never exists without its row.
Resume goes through the Trainer's own resume path with three overrides in `CapGRPOTrainer`
(`_load_from_checkpoint`, `_load_optimizer_and_scheduler`, `_load_rng_state`) that read `stateNNN/`.
"""

import json
import os
import re
import shutil
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from transformers.utils import logging

from cards.card import scrub_checkpoint_dir, write_run_card
from data.eval_sets import HELDOUT
from trainer import sharding
from trainer.cpu_adamw import CPUAdamW
from trainer.evaluation import summarize
from trainer.run_dir import read_jsonl, update_run_json
from trainer.state_shard import StateError, capture_rng_state, latest_state, load_state, save_state

logger = logging.get_logger(__name__)
STEP_DIR = re.compile(r"^step(\d{3,})$")


def step_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"step{step:03d}"


def state_dir(run_dir: Path, step: int) -> Path:
    return Path(run_dir) / f"state{step:03d}"


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
    for name, p in model.named_parameters():
        if name in meta["steps"]:
            opt.state[p] = {
                "step": torch.tensor(meta["steps"][name]),
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
def save_weights(trainer, target: Path) -> None:
    """bf16 safetensors + config (the base's own architecture) + tokenizer + generation config + card."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    state = trainer.accelerator.get_state_dict(trainer.model)  # gathers sharded (FSDP/ZeRO-3) weights
    if not trainer.accelerator.is_main_process:
        return
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    bf16 = {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in state.items()}
    dtype, model.config.dtype = model.config.dtype, torch.bfloat16
    try:
        model.save_pretrained(tmp, state_dict=bf16, safe_serialization=True)
    finally:
        model.config.dtype = dtype
    trainer.processing_class.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def save_state_dir(trainer, run_dir: Path, step: int) -> Path | None:
    """Every process calls it (FSDP2 gathers shards, each process has its own RNG streams); the main one
    writes stateNNN/ and returns its path."""
    acc = trainer.accelerator
    if trainer.is_deepspeed_enabled:  # its optimizer partitions state its own way; see docs/gpu.md
        logger.warning("stateNNN/ is not written under DeepSpeed: exact resume needs 1 process, DDP or FSDP2")
        return None
    tensors, opt_meta = export_optimizer(trainer)
    rng = gather_object([capture_rng_state()])  # one entry per process, in process order
    if not acc.is_main_process:
        return None
    arm = trainer.arm
    meta = {
        "step": step,
        "checkpoint_id": f"{Path(run_dir).name}/state{step:03d}",
        "arm": arm.name,
        "policy_id": arm.policy_id,
        "num_processes": acc.num_processes,
        "task_sampler": trainer.task_sampler.state_dict(),
        "rng": rng,
        "scheduler": trainer.lr_scheduler.state_dict(),
        "optimizer": opt_meta,
    }
    trainer.state.save_to_json(str(Path(run_dir) / ".trainer_state.json"))
    trainer_state = json.loads((Path(run_dir) / ".trainer_state.json").read_text())
    (Path(run_dir) / ".trainer_state.json").unlink()
    return save_state(
        state_dir(run_dir, step), tensors=tensors, meta=meta, extra_json={"trainer_state.json": trainer_state}
    )


def prune_states(run_dir: Path, keep: int) -> None:
    states = sorted(p for p in Path(run_dir).glob("state[0-9][0-9][0-9]*") if p.is_dir())
    for old in states[:-keep] if keep > 0 else []:
        shutil.rmtree(old)


def best_heldout_step(run_dir: Path) -> dict | None:
    """The evaluated step with the highest heldout accuracy (earliest on ties), from the eval files."""
    best = None
    for path in sorted((Path(run_dir) / "results").glob("eval_step[0-9][0-9][0-9].jsonl")):
        acc = summarize(read_jsonl(path)).get(HELDOUT, {}).get("accuracy")
        if acc is not None and (best is None or acc > best["accuracy"]):
            best = {"set": HELDOUT, "step": int(path.stem.removeprefix("eval_step")), "accuracy": acc}
    return best


class CheckpointCallback(TrainerCallback):
    """Saves stepNNN/ (+ its card) and stateNNN/ at the configured steps, after the step's row is written."""

    def __init__(self, trainer, run_dir: Path, base_dir: Path):
        self.trainer, self.run_dir, self.base_dir = trainer, Path(run_dir), Path(base_dir)

    def on_log(self, args, state, control, logs=None, **kwargs):
        step = state.global_step
        if not logs or "loss" not in logs or not is_checkpoint_step(step, args):
            return
        t0 = time.perf_counter()
        save_weights(self.trainer, step_dir(self.run_dir, step))
        save_state_dir(self.trainer, self.run_dir, step)
        if self.trainer.accelerator.is_main_process:
            prune_states(self.run_dir, args.keep_states)
            update_run_json(self.run_dir, best_step=best_heldout_step(self.run_dir))
            scrub_checkpoint_dir(step_dir(self.run_dir, step), self.base_dir)  # also writes our card
            write_run_card(self.run_dir)
        self.trainer.accelerator.wait_for_everyone()
        self.trainer.last_save_seconds = time.perf_counter() - t0


# --- resume -------------------------------------------------------------------------------------------
def load_resume_state(run_dir: Path, args) -> tuple[Path, dict[str, torch.Tensor], dict]:
    """The newest stateNNN/ of `run_dir` with its stepNNN/: every hash verified before the model is touched."""
    state = latest_state(run_dir)
    if state is None:
        raise StateError(f"{run_dir}: no stateNNN/ directory to resume from")
    weights = step_dir(run_dir, int(state.name.removeprefix("state")))
    if not any((weights / f).is_file() for f in ("config.json", "adapter_config.json")):
        raise StateError(f"{weights}: missing (resume needs the stepNNN/ beside {state.name}/)")
    arm = args.resolved_arm()
    tensors, meta = load_state(state, expect={"arm": arm.name, "policy_id": arm.policy_id})
    if isinstance(meta.get("rng"), dict):  # written before states held one RNG entry per process
        meta["rng"] = [meta["rng"]]
    saved_by = len(meta.get("rng", []))
    if saved_by != args.world_size:  # rollouts and RNG streams are per process: another split is another run
        raise StateError(
            f"{state}: saved by {saved_by} process(es), this launch has {args.world_size}; "
            f"resume with --num_processes {saved_by}"
        )
    return state, tensors, meta
