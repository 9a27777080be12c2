"""trainer/fla_conv.py on a CPU: the plumbing between transformers' conv contract ([B, C, T]) and fla's ([B, T, C]).
fla's Triton kernel needs CUDA, so here a stand-in with fla's documented contract (x [B, T, D], weight [D, W],
bias [D], activation 'silu' or None -> (y [B, T, D], final state)) computes the causal conv tap by tap; the model's
logits and gradients must be those of transformers' own conv, and the module's function must come back after."""

import importlib.util
import sys
import types
from argparse import Namespace

import pytest
import torch
import torch.nn.functional as F

from bench.grpo_step import padded_tokenizer, random_qwen35
from trainer import fla_conv as module


def taps(x, weight, bias=None, activation=None, **kwargs):
    """fla's `causal_conv1d` contract, written out: y_t = sum_w weight[:, w] * x_{t - W + 1 + w} (+ bias)."""
    width = weight.shape[1]
    padded = F.pad(x, (0, 0, width - 1, 0))  # zeros before the first token
    y = sum(padded[:, w : w + x.shape[1]] * weight[:, w] for w in range(width))
    y = y + bias if bias is not None else y
    assert activation in (None, "silu", "swish")
    return (F.silu(y) if activation else y), None


@pytest.fixture
def fake_fla(monkeypatch):
    calls = []
    fake = types.ModuleType("fla.modules.causal_conv1d")
    fake.causal_conv1d = lambda *a, **k: calls.append(a[0].shape) or taps(*a, **k)
    for name in ("fla", "fla.modules"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "fla.modules.causal_conv1d", fake)
    monkeypatch.setattr(module, "FLA", True)
    return calls


REAL_FLA = importlib.util.find_spec("fla") is not None
# with fla installed transformers binds fla's gated delta rule for CPU tensors too, and its Triton kernels fail
# there: the stand-in's CPU tests need a machine without fla (the kernel's own test below needs one with it)
needs_no_fla = pytest.mark.skipif(
    REAL_FLA, reason="fla installed: Qwen3.5 forwards on a CPU run fla's CUDA rule"
)


def forward_backward(model, ids, on: bool):
    model.zero_grad()
    with module.fla_conv(model, on):
        logits = model(input_ids=ids).logits
    logits.float().square().mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


@needs_no_fla
def test_the_layers_run_fla_conv_with_transformers_numbers_and_get_theirs_back(fake_fla):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    reference = getattr(modeling_qwen3_5, module.NAME)
    a = Namespace(hidden=32, layers=4, intermediate=64, vocab=300, seed=0, p_ended=0, cap=8)
    model = random_qwen35(a, padded_tokenizer(a.vocab), torch.device("cpu")).train()
    ids = torch.randint(0, 300, (2, 19), generator=torch.Generator().manual_seed(0))
    want, want_grads = forward_backward(model, ids, on=False)
    assert fake_fla == []  # off: transformers' conv
    got, grads = forward_backward(model, ids, on=True)
    linear = sum(t == "linear_attention" for t in model.config.get_text_config().layer_types)
    assert len(fake_fla) == linear and all(s[:2] == (2, 19) for s in fake_fla)  # [B, T, C] handed to fla
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, w in zip(grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
    assert getattr(modeling_qwen3_5, module.NAME) is reference


def test_without_fla_the_block_leaves_the_model_alone(monkeypatch):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    monkeypatch.setattr(module, "FLA", False)
    reference = getattr(modeling_qwen3_5, module.NAME)
    a = Namespace(hidden=32, layers=4, intermediate=64, vocab=300, seed=0, p_ended=0, cap=8)
    model = random_qwen35(a, padded_tokenizer(a.vocab), torch.device("cpu"))
    with module.fla_conv(model, on=True):
        assert getattr(modeling_qwen3_5, module.NAME) is reference


@pytest.mark.slow
@needs_no_fla
def test_the_trainer_loss_passes_run_fla_conv_when_the_backends_say(tmp_path, monkeypatch, fake_fla):
    """run.json's `fla_conv` (on by default where fla and CUDA are) puts fla's conv in every training forward of a
    step, and the step's loss and gradient norm are transformers' conv's."""
    import dataclasses

    from tests.scripted import make_trainer, tiny_random_model

    script = {"p1": "CWCW", "p2": "CWWC"}
    logs = {}
    for on in (False, True):
        fake_fla.clear()
        trainer = make_trainer(tiny_random_model(), tmp_path / str(on), monkeypatch, "S2", script)
        # this CPU cannot resolve it on (fla's kernel needs CUDA): the backends as a GPU run with fla records them
        trainer.args._backends = dataclasses.replace(trainer.args.resolved_backends(), fla_conv=on)
        trainer.train()
        logs[on] = next(h for h in trainer.state.log_history if "loss" in h)
        assert bool(fake_fla) is on
    assert logs[False]["grad_norm"] > 0
    assert logs[True]["loss"] == pytest.approx(logs[False]["loss"], rel=1e-4, abs=1e-7)
    assert logs[True]["grad_norm"] == pytest.approx(logs[False]["grad_norm"], rel=1e-4)


@pytest.mark.skipif(
    not (REAL_FLA and torch.cuda.is_available()), reason="needs CUDA and flash-linear-attention"
)
@pytest.mark.parametrize("length", [1, 3, 257, 1152])
def test_fla_kernel_gives_transformers_conv_in_bf16_on_cuda(length):
    """fla's Triton kernel itself through the adapter, against transformers' torch conv on the same bf16 inputs
    and a strided [B, C, T] view as the layer passes it: the output and the input and weight gradients agree
    to a few bf16 steps (fla accumulates in float32, transformers' conv1d in bf16)."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    g = torch.Generator(device="cuda").manual_seed(length)
    channels, width = 1024, 4
    mixed = torch.randn(2, length, channels, device="cuda", generator=g, dtype=torch.bfloat16)
    weight = (torch.randn(channels, width, device="cuda", generator=g) / 2).to(torch.bfloat16)
    out_grad = torch.randn(2, channels, length, device="cuda", generator=g, dtype=torch.bfloat16)
    results = []
    for fn in (getattr(modeling_qwen3_5, module.NAME), module.fla_causal_conv):
        x, w = mixed.clone().requires_grad_(), weight.clone().requires_grad_()
        out = fn(
            x.transpose(1, 2), w, None, activation="silu"
        )  # [B, C, T], a view: as the layer hands it over
        out.backward(out_grad)
        results.append((out.float(), x.grad.float(), w.grad.float()))
    for want, got in zip(*results, strict=True):
        assert got.shape == want.shape
        scale = want.abs().max().clamp_min(1.0)
        assert (got - want).abs().max() / scale <= 3 * 2**-8, (got - want).abs().max() / scale
