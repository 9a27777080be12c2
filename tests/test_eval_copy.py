"""In-training evaluation runs a bf16-rounded copy of the training model (trainer/evaluation.py
`checkpoint_weights`). transformers keeps its compiled decode call on the model (`get_compiled_call`), and
deepcopy shares functions, so a copy made after the rollouts compiled it would decode with the training
model's own weights after prefilling with its own. Shown here on a CPU (nothing compiles until called)."""

import copy

import torch
from transformers import CompileConfig

from tests.scripted import tiny_random_model
from trainer.evaluation import checkpoint_weights

CONFIG = CompileConfig(dynamic=False, mode="reduce-overhead")  # trainer/generation.py compiled_config's


def runs_model(call, model) -> bool:
    return call.__wrapped__.__self__ is model  # torch.compile's wrapper of the bound `model.__call__`


def test_a_plain_deepcopy_shares_the_compiled_call_of_the_original():
    _, model = tiny_random_model()
    compiled = model.get_compiled_call(CONFIG)
    shared = copy.deepcopy(model)
    assert shared.get_compiled_call(CONFIG) is compiled and runs_model(compiled, model)


def test_the_evaluation_copy_compiles_its_own_call_and_leaves_the_original_alone():
    _, model = tiny_random_model()
    compiled = model.get_compiled_call(CONFIG)
    rounded = checkpoint_weights(model)
    assert rounded is not model and "_compiled_call" not in vars(rounded)
    own = rounded.get_compiled_call(CONFIG)
    assert own is not compiled and runs_model(own, rounded)
    assert model.get_compiled_call(CONFIG) is compiled
    assert all(
        p.dtype == torch.float32 for p in rounded.parameters()
    )  # bf16 values held in the CPU's float32
    assert all(torch.equal(p, p.to(torch.bfloat16).float()) for p in rounded.parameters())
