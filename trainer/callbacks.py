"""Trainer callbacks named in a recipe (`callbacks:`) or on the command line (`--callbacks`), and their state
in `stateNNN/` (docs/training.md, "Reusing TRL callbacks").

An entry is an import path, `trl.BEMACallback`, `transformers.EarlyStoppingCallback` or
`my_pkg.mod:MyCallback`, with keyword arguments as a YAML mapping (`{trl.BEMACallback: {update_freq: 50}}`)
or, on the command line, as JSON after `=` (`'trl.BEMACallback={"update_freq": 50}'`). A class whose
constructor takes `trainer` is built with the trainer, the others before the model loads.

What a callback keeps across a resume is saved with the rest of the state: a transformers `ExportableState`
its `state()` (restored attribute by attribute), BEMA its θ₀, EMA and averaged weights, TRL's
`SyncRefModelCallback` its reference model. A callback of any other class may hold state we cannot see, so a
resume refuses it by name rather than continuing with fresh state.
"""

import importlib
import inspect
import json
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState
from trl.trainer.callbacks import BEMACallback, RichProgressCallback, SyncRefModelCallback

from rundir.state import StateError
from trainer.config import ConfigError

# Classes that cannot work under CapGRPOTrainer, with the reason (the refusal names the entry and says it).
REFUSED = {
    "transformers.trainer_callback.EarlyStoppingCallback": (
        "it acts on Trainer.evaluate's metrics (on_evaluate) and the best metric the Trainer's own checkpoints "
        "record (load_best_model_at_end); our evaluation (EvalCallback) is neither"
    ),
    "trl.trainer.callbacks.LogCompletionsCallback": (
        "it generates from the trainer's eval_dataset, and CapGRPOTrainer has none: evaluation samples "
        "fixed32/heldout300 itself and keeps every completion in results/eval_stepNNN.jsonl"
    ),
    "trl.trainer.callbacks.WeaveCallback": (
        "it needs the `weave` package and generates from the trainer's eval_dataset, which CapGRPOTrainer "
        "does not have (evaluation completions are in results/eval_stepNNN.jsonl)"
    ),
    "trl.trainer.callbacks.SyncRefModelCallback": (
        "set `sync_ref_model: true` (with beta > 0) instead: TRL's GRPOTrainer adds it with its own "
        "reference model, and stateNNN/ saves that model"
    ),
}
# Keep nothing a resume would need: progress display only.
STATELESS = (RichProgressCallback,)


class _Parameters:
    """Stands in for a model whose parameters() are only the named ones, in that order."""

    def __init__(self, model, names: list[str]):
        self.model, self.names = model, names

    def parameters(self):
        return [self.model.get_parameter(n) for n in self.names]


class FrozenSafeBEMACallback(BEMACallback):
    """TRL's BEMACallback, built for an entry `trl.BEMACallback`. TRL 1.16 zips the trainable parameters with
    every parameter of its averaged copy, which misaligns (and fails) once some are frozen, as our vision
    tower is; here the copy shows only the trainable ones while TRL updates it."""

    def _update_bema_weights(self, step: int):
        # hand TRL's update the averaged copy's trainable parameters only, in its own order
        full, self.running_model = self.running_model, _Parameters(self.running_model, self.param_names)
        try:
            super()._update_bema_weights(step)
        finally:
            self.running_model = full


REPLACED = {BEMACallback: FrozenSafeBEMACallback}  # what a named class is built as, and why (its docstring)


@dataclass(frozen=True)
class CallbackEntry:
    path: str  # as the recipe or command line wrote it
    cls: type
    kwargs: dict
    needs_trainer: bool  # built with trainer=, once the trainer exists

    def to_json(self) -> dict:
        return {
            "path": self.path,
            "class": class_path(self.cls),
            "kwargs": self.kwargs,
            "state": state_kind(self.cls),
        }

    def build(self, trainer=None) -> TrainerCallback:
        try:
            return self.cls(**self.kwargs, **({"trainer": trainer} if self.needs_trainer else {}))
        except Exception as e:  # the constructor's own refusal, e.g. a missing eval dataset
            raise ConfigError(f"callbacks: {self.path}: cannot be built: {type(e).__name__}: {e}") from None


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def state_kind(cls: type) -> str:
    """How its state survives a resume: "attributes" (ExportableState), "tensors", "none" or "unsaved"."""
    if issubclass(cls, ExportableState):
        return "attributes"
    if issubclass(cls, (BEMACallback, SyncRefModelCallback)):
        return "tensors"
    if issubclass(cls, STATELESS) or cls.__module__.startswith("transformers.integrations"):
        return "none"  # progress bars; report_to backends reopen their run on resume as report_to does
    return "unsaved"


def _not_json(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_entry(entry: Any) -> tuple[str, dict]:
    """`"path"`, `"path={json kwargs}"` or `{"path": {kwargs}}` -> (path, kwargs)."""
    if isinstance(entry, dict) and len(entry) == 1:
        ((path, kwargs),) = entry.items()
        kwargs = {} if kwargs is None else kwargs
    elif isinstance(entry, str) and "=" in entry:
        path, _, text = entry.partition("=")
        try:  # NaN and Infinity are no JSON (and would land in run.json): refused like any bad value
            kwargs = json.loads(text, parse_constant=_not_json)
        except (json.JSONDecodeError, ValueError) as e:
            raise ConfigError(f"callbacks: {path}: keyword arguments are not JSON ({e})") from None
    elif isinstance(entry, str):
        path, kwargs = entry, {}
    else:
        raise ConfigError(f"callbacks: {entry!r}: expected an import path or {{path: {{keyword: value}}}}")
    if not isinstance(kwargs, dict):
        raise ConfigError(f"callbacks: {path}: keyword arguments must be a mapping, got {kwargs!r}")
    return path.strip(), kwargs


def import_class(path: str) -> type:
    """`pkg.mod:Name` or `pkg.mod.Name` (the longest importable module prefix)."""
    module_name, sep, attr = path.partition(":")
    if not sep:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"callbacks: {path}: not an import path (pkg.module.Class or pkg.module:Class)")
    try:
        obj = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # anything a module raises at import (RuntimeError, SyntaxError): the entry's
        what = " ".join(f"{type(e).__name__}: {e}".split())[:300]  # one line, whatever the message holds
        raise ConfigError(f"callbacks: {path}: cannot be imported ({what})") from None
    if not (isinstance(obj, type) and issubclass(obj, TrainerCallback)):
        raise ConfigError(f"callbacks: {path}: {obj!r} is not a transformers TrainerCallback class")
    return obj


def resolve_callbacks(entries: list | str | None) -> list[CallbackEntry]:
    """Import every entry and check its keyword arguments against its constructor, refusing by name."""
    resolved = []
    for entry in [entries] if isinstance(entries, (str, dict)) else list(entries or []):
        path, kwargs = parse_entry(entry)
        cls = import_class(path)
        cls = REPLACED.get(cls, cls)
        if (reason := REFUSED.get(class_path(cls))) is not None:
            raise ConfigError(f"callbacks: {path}: not supported under CapGRPOTrainer: {reason}")
        needs_trainer = "trainer" in inspect.signature(cls).parameters
        try:
            inspect.signature(cls).bind(**kwargs, **({"trainer": None} if needs_trainer else {}))
        except TypeError as e:
            raise ConfigError(f"callbacks: {path}: {e}") from None
        resolved.append(CallbackEntry(path, cls, kwargs, needs_trainer))
    return resolved


def refuse_unsaved_state(entries: list[CallbackEntry], saved: dict | None) -> None:
    """Before a resume loads anything: every callback's state must be in the state being resumed."""
    for e in entries:
        if state_kind(e.cls) == "unsaved":
            raise ConfigError(
                f"callbacks: {e.path}: its state is not saved in stateNNN/ (it is not a transformers "
                "ExportableState), so a resume would continue it from fresh state: make it one, or start a "
                "new run"
            )
    names = {c["class"] for c in (saved or {}).values()}
    for e in entries:
        if state_kind(e.cls) in ("attributes", "tensors") and class_path(e.cls) not in names:
            raise StateError(f"meta.json of the state: no saved state for callback {e.path}")


# --- state in stateNNN/ -----------------------------------------------------------------------------------
def _keyed(trainer) -> dict[str, TrainerCallback]:
    """Callbacks with state to save, keyed `Class#k` (k-th of its class, in the trainer's order)."""
    out, seen = {}, {}
    for cb in trainer.callback_handler.callbacks:
        if state_kind(type(cb)) in ("attributes", "tensors"):
            k = seen[type(cb).__name__] = seen.get(type(cb).__name__, -1) + 1
            out[f"{type(cb).__name__}#{k}"] = cb
    return out


def _tensor_state(cb) -> dict[str, torch.Tensor]:
    if isinstance(cb, BEMACallback):
        running = dict(cb.running_model.named_parameters())
        return {
            **{f"theta0/{n}": t for n, t in zip(cb.param_names, cb.theta0_params, strict=True)},
            **{f"ema/{n}": t for n, t in zip(cb.param_names, cb.ema_params, strict=True)},
            **{f"running/{n}": running[n].detach() for n in cb.param_names},
        }
    ref = cb.accelerator.unwrap_model(cb.ref_model) if cb.accelerator else cb.ref_model
    return {f"ref/{n}": p.detach() for n, p in ref.named_parameters()}


def export_callback_state(trainer) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors under `callbacks/<key>/...`, {key: {"class", "state"}}) for meta.json."""
    tensors, meta = {}, {}
    for key, cb in _keyed(trainer).items():
        meta[key] = {"class": class_path(type(cb))}
        if isinstance(cb, ExportableState):
            meta[key]["state"] = cb.state()
        else:
            for name, t in _tensor_state(cb).items():
                tensors[f"callbacks/{key}/{name}"] = t.float().cpu().contiguous()
    return tensors, meta


@torch.no_grad()
def restore_callback_state(trainer, tensors: dict[str, torch.Tensor], meta: dict) -> None:
    """The inverse of export_callback_state, after every callback's on_train_begin (BEMA builds its buffers
    there from the resumed weights)."""
    for key, cb in _keyed(trainer).items():
        saved = meta.get(key)
        if saved is None or saved["class"] != class_path(type(cb)):
            raise StateError(
                f"meta.json of the state: no saved state for callback {key} ({class_path(type(cb))})"
            )
        if isinstance(cb, ExportableState):
            for name, value in saved["state"].get("attributes", {}).items():
                setattr(cb, name, value)
            continue
        for name, t in _tensor_state(cb).items():
            t.copy_(tensors[f"callbacks/{key}/{name}"].to(t.device, t.dtype))


class RestoreCallbackState(TrainerCallback):
    """Added after every other callback: restores their saved state once their on_train_begin has run."""

    def __init__(self, trainer, tensors: dict[str, torch.Tensor], meta: dict):
        self.trainer, self.tensors, self.meta = trainer, tensors, meta

    def on_train_begin(self, args, state, control, **kwargs):
        restore_callback_state(self.trainer, self.tensors, self.meta)
