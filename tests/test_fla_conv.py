"""engine/fla_conv.py on a CPU: the plumbing between transformers' conv contract ([B, C, T]) and fla's ([B, T, C]).
fla's Triton kernel needs CUDA, so here a stand-in with fla's documented contract (x [B, T, D], weight [D, W],
bias [D], activation 'silu' or None -> (y [B, T, D], final state)) computes the causal conv tap by tap; the model's
logits and gradients must be those of transformers' own conv, and the module's function must come back after."""

import functools
import importlib.util
import inspect
import sys
import types
from argparse import Namespace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bench.models import padded_tokenizer, random_qwen35
from engine import chunked_gated_delta
from engine import fla_conv as module

ROOT = Path(__file__).resolve().parent.parent


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


def forward_backward(model, ids, on: bool):
    model.zero_grad()
    with module.fla_conv(model, on):
        logits = model(input_ids=ids).logits
    logits.float().square().mean().backward()
    return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


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
        run = trainer.run_setup
        trainer.run_setup = dataclasses.replace(run, backends=dataclasses.replace(run.backends, fla_conv=on))
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


# --- issue 61, class 8: CPU models where fla is installed ----------------------------------------------------
# what transformers' Qwen3.5 layers call by name, each bound to fla's (or causal-conv1d's) kernel when it imports
KERNEL_NAMES = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                "causal_conv1d_update")  # fmt: skip


@pytest.fixture
def fla_bound_on_every_device(monkeypatch):
    """transformers 5.17 with fla installed: each name bound to fla's kernel whatever the inputs' device (5.25
    checks the device itself, so the lock's transformers alone would not show it). The stand-in fails on CPU
    tensors as fla's Triton kernels do there, and records every call with its inputs' device."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    calls = []
    for name in KERNEL_NAMES:

        def fla_kernel(*args, _name=name, **kwargs):
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            calls.append((_name, tensors[0].device.type))
            raise RuntimeError("0 active drivers ([]). There should only be one.")  # Triton without a GPU

        reference = inspect.unwrap(getattr(modeling_qwen3_5, name))  # transformers' torch function
        monkeypatch.setattr(modeling_qwen3_5, name, functools.wraps(reference)(fla_kernel))
    monkeypatch.setattr(chunked_gated_delta, "FLA", True)
    return modeling_qwen3_5, calls


def _loaded(how: str):
    from trainer import eval_checkpoints, setup

    if how == "make train":
        return setup.load_base_model(str(ROOT / "embedded/base"), "float32")[0]
    if how == "make eval --device cpu":
        return eval_checkpoints.load_checkpoint(ROOT / "embedded/base", "cpu")[0]
    a = Namespace(hidden=32, layers=4, intermediate=64, vocab=300, seed=0, p_ended=0, cap=8)
    return random_qwen35(a, padded_tokenizer(a.vocab), torch.device("cpu"))  # the bench's and tests' model


@pytest.mark.parametrize("how", ["make train", "make eval --device cpu", "bench"])
def test_with_fla_bound_on_every_device_cpu_models_run_transformers_torch_reference(
    fla_bound_on_every_device, monkeypatch, how
):
    """A CPU forward and generation of a Qwen3.5 model (the embedded default, as `make train` and `make eval`
    load it) never reach fla's kernels, and give transformers' torch reference's numbers; tensors on another
    device still go to fla's kernel (a GPU model in the same process keeps it)."""
    modeling, calls = fla_bound_on_every_device
    model = _loaded(how).eval()
    ids = torch.tensor([[5, 17, 42, 8, 99, 23, 7, 64, 3, 11]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits  # the scoring/training pass: chunked rule and conv
        tokens = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)  # decode: recurrent, update
    assert calls == []
    q = torch.zeros(1, 3, 2, 4, device="meta")
    with pytest.raises(RuntimeError, match="active drivers"):
        getattr(modeling, KERNEL_NAMES[0])(q, q, q, g=q[..., 0], beta=q[..., 0])
    assert calls == [(KERNEL_NAMES[0], "meta")]
    for name in KERNEL_NAMES:  # transformers' torch functions themselves, for the numbers
        monkeypatch.setattr(modeling, name, inspect.unwrap(getattr(modeling, name)))
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, logits)
        assert torch.equal(model.generate(input_ids=ids, max_new_tokens=4, do_sample=False), tokens)
