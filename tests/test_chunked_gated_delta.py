"""Our chunked gated delta rule against transformers' torch fallback: outputs, final states and every input's
gradient, on the CPU (the same function runs on CUDA; bench/gated_delta_rule.py compares it there)."""

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5

from bench.models import padded_tokenizer, random_qwen35
from engine.chunked_gated_delta import NAME, chunked_gated_delta, chunked_gated_delta_rule, compiled_rule

REFERENCE = getattr(modeling_qwen3_5, NAME)


def leaves(rows, length, key_heads, heads, dim, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, length, key_heads, dim, generator=g, dtype=dtype)
    k = torch.randn(rows, length, key_heads, dim, generator=g, dtype=dtype) / dim**0.5  # near unit length
    v = torch.randn(rows, length, heads, dim, generator=g, dtype=dtype)
    decay = -torch.rand(rows, length, heads, generator=g) * 0.5
    beta = torch.rand(rows, length, heads, generator=g, dtype=dtype)
    state = torch.randn(rows, heads, dim, dim, generator=g)
    return [x.requires_grad_() for x in (q, k, v, decay, beta, state)]


def repeated_heads(fn):
    """transformers 5.17's function takes the key heads already repeated to the value heads (5.24 repeats them
    itself); ours repeats them, so the reference gets them repeated."""

    def call(q, k, v, **kw):
        r = v.shape[2] // k.shape[2]
        return fn(q.repeat_interleave(r, dim=2), k.repeat_interleave(r, dim=2), v, **kw)

    return call


def forward_backward(fn, xs, chunk, l2norm, with_state, seed=1):
    for x in xs:
        x.grad = None
    out, final = fn(
        *xs[:3], g=xs[3], beta=xs[4], chunk_size=chunk, initial_state=xs[5] if with_state else None,
        output_final_state=True, use_qk_l2norm_in_kernel=l2norm,
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    loss = (out.float() * torch.randn(out.shape, generator=g)).sum() + (
        final * torch.randn(final.shape, generator=g)
    ).sum()
    loss.backward()
    return out.detach(), final.detach(), [None if x.grad is None else x.grad.clone() for x in xs]


@pytest.mark.parametrize(
    "length, chunk, key_heads, l2norm, with_state",
    [
        (64, 16, 2, True, False),  # whole chunks, key heads repeated for the value heads
        (50, 16, 4, True, True),  # a padded last chunk, a carried-in state
        (37, 64, 4, False, True),  # one partial chunk, no normalization (the function's default)
    ],
)
def test_same_outputs_states_and_gradients_as_transformers(length, chunk, key_heads, l2norm, with_state):
    xs = leaves(2, length, key_heads, 4, 8, torch.float32)
    ours = forward_backward(chunked_gated_delta_rule, xs, chunk, l2norm, with_state)
    theirs = forward_backward(repeated_heads(REFERENCE), xs, chunk, l2norm, with_state)
    torch.testing.assert_close(ours[0], theirs[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ours[1], theirs[1], rtol=1e-4, atol=1e-5)
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), ours[2], theirs[2]):
        assert (a is None) == (b is None), name
        if a is not None:
            torch.testing.assert_close(
                a, b, rtol=1e-4, atol=1e-4, msg=lambda m, name=name: f"grad {name}: {m}"
            )


def token_by_token(q, k, v, decay, beta, state):
    """The rule's definition, one token at a time in float64: S <- d S + k (x) beta (v - d S^T k), o = S^T q."""
    q, k = (
        torch.nn.functional.normalize(x.double(), dim=-1, eps=0).repeat_interleave(2, dim=2) for x in (q, k)
    )
    q = q * q.shape[-1] ** -0.5
    v, d, beta, s = v.double(), decay.double().exp(), beta.double(), state.double()
    outs = []
    for t in range(q.shape[1]):
        s = d[:, t, :, None, None] * s
        delta = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", s, k[:, t]))
        s = s + torch.einsum("bhk,bhv->bhkv", k[:, t], delta)
        outs.append(torch.einsum("bhkv,bhk->bhv", s, q[:, t]))
    return torch.stack(outs, 1), s


def test_chunks_compute_the_token_by_token_rule():
    xs = leaves(2, 45, 2, 4, 8, torch.float32)
    with torch.no_grad():
        out, final = chunked_gated_delta_rule(
            *xs[:3], g=xs[3], beta=xs[4], chunk_size=16, initial_state=xs[5], output_final_state=True,
            use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        want, want_final = token_by_token(*xs)
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(final.double(), want_final, rtol=1e-4, atol=1e-5)


def test_bf16_inputs_give_bf16_outputs_computed_in_float32():
    xs = leaves(1, 40, 2, 2, 8, torch.bfloat16)
    out, final, _ = forward_backward(chunked_gated_delta_rule, xs, 16, True, False)
    ref, ref_final, _ = forward_backward(repeated_heads(REFERENCE), xs, 16, True, False)
    assert out.dtype == torch.bfloat16 and final.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-2, atol=1e-2)


def test_packed_sequences_are_refused():
    xs = leaves(1, 16, 2, 2, 8, torch.float32)
    with pytest.raises(ValueError, match="cu_seqlens"):
        chunked_gated_delta_rule(*xs[:3], g=xs[3], beta=xs[4], cu_seqlens=torch.tensor([0, 8, 16]))


@pytest.fixture
def without_fla(monkeypatch):
    """A machine without fla, where the block runs ours. With fla installed transformers binds fla's rule and the
    block steps aside, asked for or not (tests/test_run_settings.py), so these tests pin the flag."""
    from engine import chunked_gated_delta
    from trainer import backends

    monkeypatch.setattr(chunked_gated_delta, "FLA", False)
    monkeypatch.setattr(backends, "FLA", False)


def test_the_block_puts_ours_in_the_model_forward_and_restores_transformers(without_fla):
    class Args:
        hidden, layers, intermediate, vocab, p_ended, cap, seed = 32, 4, 64, 300, 0, 8, 0

    model = random_qwen35(Args, padded_tokenizer(300), torch.device("cpu"))
    ids = torch.randint(0, 300, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = model(input_ids=ids).logits
        calls = []

        def counting(*args, **kwargs):
            calls.append(1)
            return chunked_gated_delta_rule(*args, **kwargs)

        with chunked_gated_delta(model):
            assert getattr(modeling_qwen3_5, NAME) is chunked_gated_delta_rule
            with chunked_gated_delta(model):  # a block inside a block keeps ours
                pass
            setattr(modeling_qwen3_5, NAME, counting)
            ours = model(input_ids=ids).logits
            setattr(modeling_qwen3_5, NAME, chunked_gated_delta_rule)
    assert getattr(modeling_qwen3_5, NAME) is REFERENCE
    linear = sum(t == "linear_attention" for t in model.config.get_text_config().layer_types)
    assert len(calls) == linear > 0
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)


def test_the_trainer_loss_passes_run_ours_when_the_config_says(tmp_path, monkeypatch, without_fla):
    """`chunked_gated_delta: true` (the GPU default; CPU runs keep transformers') puts ours in every training
    forward of a step, and the step's loss and gradient norm match transformers' rule's within float32."""
    from engine import chunked_gated_delta as module
    from tests.scripted import make_trainer, tiny_random_model

    calls = []
    counting = lambda *a, **kw: calls.append(1) or chunked_gated_delta_rule(*a, **kw)  # noqa: E731
    monkeypatch.setattr(module, "chunked_gated_delta_rule", counting)
    script = {"p1": "CWCW", "p2": "CWWC"}
    logs = {}
    for chunked in (False, True):
        tiny = tiny_random_model()  # the same seeded weights for both runs
        trainer = make_trainer(
            tiny, tmp_path / str(chunked), monkeypatch, "S2", script, chunked_gated_delta=chunked
        )
        assert trainer.run_setup.backends.chunked_gated_delta is chunked
        trainer.train()
        logs[chunked] = next(h for h in trainer.state.log_history if "loss" in h)
        assert getattr(modeling_qwen3_5, NAME) is REFERENCE  # put back after every pass
        linear = sum(t == "linear_attention" for t in tiny[1].config.get_text_config().layer_types)
        assert len(calls) == (trainer.args.gradient_accumulation_steps * linear if chunked else 0)
    assert logs[False]["grad_norm"] > 0
    assert logs[True]["loss"] == pytest.approx(logs[False]["loss"], rel=1e-4, abs=1e-7)
    assert logs[True]["grad_norm"] == pytest.approx(logs[False]["grad_norm"], rel=1e-4)


@pytest.mark.slow
def test_compiled_terms_give_ours_at_every_length_without_compiling_per_length(without_fla):
    # compile_gated_delta_terms: the chunk-parallel part compiled dynamic in the chunk count (the chunk loop
    # stays eager), so new row lengths do not compile again. The first call's sizes can collide (torch's duck
    # sizing: a chunk count equal to another dimension), which costs one recompile, never one per length.
    from torch._dynamo.utils import counters

    counters.clear()
    graphs = []
    for length in (128, 192, 256, 384, 512):
        xs = leaves(5, length, 2, 4, 16, torch.float32, seed=length)
        want, want_final, want_grads = forward_backward(chunked_gated_delta_rule, xs, 64, True, True)
        got, final, grads = forward_backward(compiled_rule(), xs, 64, True, True)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(final, want_final, rtol=1e-5, atol=1e-5)
        for a, b in zip(grads, want_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[1] <= 2 and graphs[-1] == graphs[1], graphs
    model = random_qwen35(
        type("Args", (), dict(hidden=32, layers=4, intermediate=64, vocab=300, p_ended=0, cap=8, seed=0)),
        padded_tokenizer(300),
        torch.device("cpu"),
    )
    with chunked_gated_delta(model, compiled_terms=True):
        assert getattr(modeling_qwen3_5, NAME) is compiled_rule()
    assert getattr(modeling_qwen3_5, NAME) is REFERENCE
