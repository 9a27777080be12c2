"""LoRA weight pushes to vLLM that never write into the training model, and push the checkpoint's weights.

TRL 1.16 pushes a PEFT model by merging the adapters into the base weights in place (`merge_adapter`),
reading every weight, and unmerging (`unmerge_adapter`): W + Δ - Δ is not W in floating point, so each push
moves the frozen base weights a little (bf16: a whole ulp in about 3% of an adapted layer's weights for a
Δ of 1e-3; tests/test_lora_push.py), the drift adds up over the run, and a push that fails half-way leaves
the model merged. Here each adapted layer's weight is pushed as a new tensor W + Δ, rounded once in the
base's dtype as PEFT's in-place add rounds it, with Δ computed from the adapters as stepNNN/ stores them
(bf16): the engine then holds exactly the base merged with the saved adapter, so its evaluation rows are
what `python -m trainer.eval_checkpoints` gives on the checkpoint, as for a full fine-tune (whose engine holds
the bf16 weights stepNNN/ stores). The rounding is of the order of the bf16 rounding vLLM applies anyway.
"""

import torch
from accelerate.utils import is_peft_model
from peft.utils.other import transpose
from trl.generation.vllm_generation import VLLMGeneration


def lora_layers(model) -> dict[str, object]:
    """Parameter name of each adapted layer's base weight -> its PEFT LoRA layer."""
    from peft.tuners.lora import LoraLayer

    return {f"{n}.base_layer.weight": m for n, m in model.named_modules() if isinstance(m, LoraLayer)}


def stored(t: torch.Tensor) -> torch.Tensor:
    """`t` as a checkpoint keeps it: rounded to bf16, in its own dtype."""
    return t.to(torch.bfloat16).to(t.dtype)


def merged_weight(layer, weight):
    """W + Δ over the layer's active adapters, as a new tensor rounded once to W's dtype, as PEFT's in-place
    `W += Δ` rounds it; Δ = B·A·scaling of the stored adapter, what PEFT's merge computes from a loaded one."""
    out = weight
    for adapter in layer.active_adapters:
        if adapter in layer.lora_A:
            a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
            out = out + transpose(stored(b) @ stored(a), layer.fan_in_fan_out) * layer.scaling[adapter]
    return out.to(weight.dtype)


def plain_lora(model) -> bool:
    """Adapters this push handles: LoRA without bias, modules_to_save or a variant (DoRA)."""
    layers = lora_layers(model).values()
    config = model.peft_config[model.active_adapter]
    return (
        bool(layers)
        and not getattr(config, "modules_to_save", None)
        and not any(layer.lora_variant or any(layer.lora_bias.values()) for layer in layers)
    )


class UnmergedLoRAPush(VLLMGeneration):
    def _iter_named_params(self):
        # TRL merges and unmerges in place, which moves the frozen base (module docstring); sharded models
        # (FSDP, ZeRO-3) and other adapter kinds keep TRL's path
        model = self.model
        if not is_peft_model(model) or self._dist.is_fsdp or self._dist.is_zero3 or not plain_lora(model):
            yield from super()._iter_named_params()
            return
        layers = lora_layers(model)
        for name, param in model.named_parameters():
            if model.prefix in name:  # the adapters themselves: vLLM gets them merged
                continue
            value = merged_weight(layers[name], param.data) if name in layers else param.data
            name = name.removeprefix("base_model.model.").replace(".base_layer", "")
            yield self._fix_param_name_to_vllm(name), value


def install(trainer) -> None:
    """vLLM with a PEFT model: pushes through `UnmergedLoRAPush` (the engine object stays the one TRL built)."""
    engine = getattr(trainer, "vllm_generation", None)
    if isinstance(engine, VLLMGeneration) and is_peft_model(engine.model):
        engine.__class__ = UnmergedLoRAPush
