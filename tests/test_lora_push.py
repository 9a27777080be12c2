"""engine/lora_push.py against TRL's own LoRA push, without an engine: the same names and values reach vLLM,
and the training model's base weights stay as they were (TRL's in-place merge and unmerge move them).
The real engine: tests/real_vllm/test_vllm_lora.py (`make test-vllm`)."""

from types import SimpleNamespace

import pytest
import torch
import yaml
from peft import LoraConfig, get_peft_model
from trl.distributed import DistributedBackend
from trl.generation.vllm_generation import VLLMGeneration

from engine.lora_push import UnmergedLoRAPush, lora_layers
from tests.scripted import tiny_random_model

RECIPE = yaml.safe_load(open("configs/mimo9b-lora.yaml"))


@pytest.fixture()
def peft_model():
    """The tiny Qwen3.5 in the recipe's dtype with the recipe's adapters, every lora_B non-zero (as after a
    step: at init B = 0 and the merge adds nothing), every adapter value one that bf16 holds (as loaded from
    a checkpoint), so that TRL's merge and ours compute the same Δ."""
    torch.manual_seed(0)
    _, model = tiny_random_model()
    config = LoraConfig(
        r=RECIPE["lora_r"],
        lora_alpha=RECIPE["lora_alpha"],
        lora_dropout=RECIPE["lora_dropout"],
        target_modules=RECIPE["lora_target_modules"][0],
    )
    model = get_peft_model(model.to(getattr(torch, RECIPE["dtype"])), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
            if "lora_" in name:
                p.copy_(p.to(torch.bfloat16))
    return model


def push_of(cls, model) -> dict[str, torch.Tensor]:
    """What `cls._iter_named_params` hands vLLM, each value copied as `load_weights` copies it."""
    engine = object.__new__(cls)  # the push needs only the model and the backend, not an engine
    engine.model = model
    engine._dist = DistributedBackend(SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=None)))
    return {name: value.clone() for name, value in engine._iter_named_params()}


def test_the_push_is_trls_merge_without_touching_the_model(peft_model):
    layers = lora_layers(peft_model)
    assert layers and all("language_model" in n for n in layers)
    before = {n: p.detach().clone() for n, p in peft_model.named_parameters()}

    ours = push_of(UnmergedLoRAPush, peft_model)
    assert all(torch.equal(p, before[n]) for n, p in peft_model.named_parameters())  # bitwise untouched
    assert not any(layer.merged for layer in layers.values())

    trls = push_of(VLLMGeneration, peft_model)
    assert ours.keys() == trls.keys() and not any("lora_" in n for n in ours)
    assert all(torch.equal(ours[n], trls[n]) for n in ours)  # same W + Δ, rounded once in bf16
    for name in layers:  # every adapted layer reaches vLLM with its Δ in it
        assert not torch.equal(
            ours[name.removeprefix("base_model.model.").replace(".base_layer", "")], before[name]
        )

    # TRL's W += Δ; W -= Δ leaves the model unmerged, but not as it was: the frozen base moved
    moved = [n for n in layers if not torch.equal(peft_model.get_parameter(n), before[n])]
    assert moved and not any(layer.merged for layer in layers.values())
