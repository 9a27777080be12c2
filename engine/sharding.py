"""Full (unsharded) copies of an FSDP2-sharded model and its AdamW state, for stateNNN/ and evaluation.

Under FSDP2 each process holds DTensor shards. Gathering is a collective: every process calls these
functions; with `cpu_offload` only the main process receives the tensors (the others get empty dicts).
DDP and single-process models are whole on every process and never come here.
"""

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule

GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)


def is_sharded(model) -> bool:
    return isinstance(model, FSDPModule)


def full_parameters(model) -> dict[str, torch.Tensor]:
    """Every parameter as a full CPU tensor, by name (main process; empty elsewhere). Collective."""
    names = {n for n, _ in model.named_parameters()}
    return {k: v for k, v in get_model_state_dict(model, options=GATHER).items() if k in names}


def full_adamw_state(model, optimizer) -> dict[str, dict]:
    """AdamW's per-parameter state ({step, exp_avg, exp_avg_sq}) by parameter name. Collective."""
    return get_optimizer_state_dict(model, optimizer, options=GATHER).get("state", {})


def load_full_parameters(model, tensors: dict[str, torch.Tensor]) -> None:
    """Each process takes its shards of the named full tensors; parameters not named keep their values."""
    set_model_state_dict(model, tensors, options=StateDictOptions(full_state_dict=True, strict=False))


def load_full_adamw_state(model, optimizer, state: dict[str, dict]) -> None:
    # set_optimizer_state_dict wants param_groups keyed by name too; before the first step the state is empty
    groups = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    set_optimizer_state_dict(
        model,
        optimizer,
        {"state": state, "param_groups": groups["param_groups"]},
        options=StateDictOptions(full_state_dict=True),
    )


def unsharded_copy(model, tensors: dict[str, torch.Tensor], dtype: torch.dtype):
    """A plain (unsharded) model of `model`'s own class on its device, holding `tensors` in `dtype`; buffers
    are built as `from_pretrained` builds them. For evaluating on the main process alone."""
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))  # fully_shard subclasses it
    device = next(iter(model.parameters())).device
    with torch.device(device):
        plain = cls._from_config(model.config, dtype=dtype)
    result = plain.load_state_dict({k: v.to(dtype) for k, v in tensors.items()}, strict=False)
    params = dict(plain.named_parameters())
    if missing := [k for k in result.missing_keys if k in params]:
        raise ValueError(f"unsharded copy: gathered state lacks parameters {missing[:3]}")
    plain.generation_config = model.generation_config
    return plain.eval()
