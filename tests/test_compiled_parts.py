"""compile_norms_mlp (engine/compiled_parts.py): the training forward's norms and MLPs compiled, the same
numbers as eager at every row length without compiling per length, scoped to the block, and in the trainer's
loss passes when the config says so."""

from argparse import Namespace

import pytest
import torch

from bench.models import padded_tokenizer, random_qwen35
from engine import compiled_parts as module
from engine.compiled_parts import compiled_parts, parts


def tiny_qwen35():
    a = Namespace(hidden=32, layers=4, intermediate=64, vocab=300, seed=0, p_ended=0, cap=8)
    model = random_qwen35(a, padded_tokenizer(a.vocab), torch.device("cpu"))
    return model.train()


def forward_backward(model, length: int, on: bool):
    model.zero_grad()
    ids = torch.randint(0, 300, (2, length), generator=torch.Generator().manual_seed(length))
    with compiled_parts(model, on):
        logits = model(input_ids=ids).logits
    logits.float().square().mean().backward()  # the backward runs after the block, as TRL's does
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.slow
def test_compiled_parts_give_eager_numbers_at_every_length_without_compiling_per_length():
    from torch._dynamo.utils import counters

    model = tiny_qwen35()
    names = {type(m).__name__ for m in parts(model)}
    assert names == {"Qwen3_5RMSNorm", "Qwen3_5RMSNormGated", "Qwen3_5MLP"}
    counters.clear()
    graphs = []
    for length in (24, 40, 72, 136, 264, 100):
        want, want_grads = forward_backward(model, length, False)
        got, grads = forward_backward(model, length, True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert len(grads) == len(want_grads)
        for a, b in zip(grads, want_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
        graphs.append(counters["stats"]["unique_graphs"])
        assert not any("forward" in vars(m) for m in parts(model))  # the class's own forward again
    # one graph per class and input layout, not per length; CPU Inductor may add one more, once, when a norm's
    # rows pass 4096 (its `need_use_acc_helper` guard, seen with torch 2.11 on the H200 host's 16 threads)
    assert graphs[0] > 0 and len(set(graphs[2:])) == 1 and graphs[2] - graphs[0] <= 1, graphs


def test_off_leaves_the_model_alone():
    model = tiny_qwen35()
    with compiled_parts(model, on=False):
        assert not any("forward" in vars(m) for m in parts(model))
    with compiled_parts(model):
        assert all("forward" in vars(m) for m in parts(model))


@pytest.mark.slow
def test_the_trainer_loss_passes_run_compiled_parts_when_the_config_says(tmp_path, monkeypatch):
    from tests.scripted import make_trainer, tiny_random_model

    entered = []
    real = module.compiled_parts
    monkeypatch.setattr(
        "trainer.grpo.compiled_parts", lambda model, on=True: entered.append(on) or real(model, on)
    )
    logs = {}
    for on in (False, True):
        entered.clear()
        trainer = make_trainer(
            tiny_random_model(), tmp_path / str(on), monkeypatch, "S2", {"p1": "CWCW"}, compile_norms_mlp=on
        )
        trainer.train()
        assert entered and set(entered) == {on}
        logs[on] = next(h for h in trainer.state.log_history if "loss" in h)
    assert logs[False]["grad_norm"] > 0
    assert logs[True]["loss"] == pytest.approx(logs[False]["loss"], rel=1e-4, abs=1e-7)
    assert logs[True]["grad_norm"] == pytest.approx(logs[False]["grad_norm"], rel=1e-4)
