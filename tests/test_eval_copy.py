"""In-training evaluation runs a bf16-rounded copy of the training model (trainer/eval_callback.py
`checkpoint_weights`). transformers keeps its compiled decode call on the model (`get_compiled_call`), and
deepcopy shares functions, so a copy made after the rollouts compiled it would decode with the training
model's own weights after prefilling with its own. Shown here on a CPU (nothing compiles until called)."""

import copy

import torch
from transformers import CompileConfig

from tests.scripted import tiny_random_model
from trainer.eval_callback import checkpoint_weights, refreshed_weights

CONFIG = CompileConfig(dynamic=False, mode="reduce-overhead")  # engine/generation.py compiled_config's


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


def test_a_later_evaluation_reuses_the_copy_with_the_new_weights_and_its_compiled_call():
    _, model = tiny_random_model()
    rounded = checkpoint_weights(model)
    own = rounded.get_compiled_call(CONFIG)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)  # a training step
    again = refreshed_weights(rounded, model)
    fresh = checkpoint_weights(model)
    assert again is rounded and again.get_compiled_call(CONFIG) is own
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), fresh.parameters(), strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(again.parameters(), model.parameters(), strict=True))
