"""The static KV cache's writes under deterministic algorithms (engine/kv_writes.py), on the CPU.

What the compiled decode step runs is read from Inductor's generated code, which is the same decision on every
device: under `torch.use_deterministic_algorithms(True)` each cache write becomes a call of torch's
deterministic `index_put_` (on CUDA a sort and several kernels), and with position writes it is one call of our
op on the cache itself. The time either costs is measured on the GPU (`python -m bench.generation
--deterministic [--kv-writes]`), not here."""

import os
import re

import pytest
import torch
from torch._inductor.utils import run_and_get_code
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, StaticCache
from transformers.cache_utils import StaticLayer

from engine import generation, kv_writes

LAYERS, ROWS, PROMPT, CACHE = 3, 4, 8, 32


def tiny_qwen2() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture
def deterministic(monkeypatch):
    """torch's deterministic algorithms on for the test, and put back after, with the switch."""
    before = torch.are_deterministic_algorithms_enabled()
    monkeypatch.setattr(kv_writes, "POSITION_WRITES", False)
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(before)


def decode(model, position_writes: bool, steps: int = 6):
    """A prefill, then `steps` greedy tokens through a compiled decode step: the first step's generated code,
    the tokens, and the cache (a fresh compile: dynamo reset, Inductor's caches off)."""
    cache = StaticCache(config=model.config, max_cache_len=CACHE)
    if position_writes:
        for layer in cache.layers:
            layer.__class__ = kv_writes.PositionWriteLayer
    ids = torch.randint(0, 256, (ROWS, PROMPT), generator=torch.Generator().manual_seed(1))
    tokens = []
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        step = torch.compile(model.forward, dynamic=False, fullgraph=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        out, code = run_and_get_code(step, input_ids=token, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            token = out.logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token.flatten().tolist())
            out = step(input_ids=token, past_key_values=cache, use_cache=True)
    torch._dynamo.reset()
    return "\n".join(code), tokens, cache


def calls(code: str, op: str) -> list[str]:
    """The first argument of every call of `op` in the generated code (comments left out)."""
    lines = [line for line in code.splitlines() if not line.lstrip().startswith("#")]
    return re.findall(re.escape(op) + r"\((\w+)", "\n".join(lines))


@pytest.mark.slow
def test_deterministic_algorithms_turn_every_cache_write_into_torchs_index_put(deterministic):
    """The cost under the flag: Inductor falls back to aten.index_put_ for the keys and the values of every
    attention layer; without the flag there is no such call (the write is fused)."""
    model = tiny_qwen2()
    code, tokens, _ = decode(model, position_writes=False)
    assert len(calls(code, "aten.index_put_")) == 2 * LAYERS
    torch.use_deterministic_algorithms(False)
    free, free_tokens, _ = decode(model, position_writes=False)
    assert calls(free, "aten.index_put_") == []
    assert free_tokens == tokens


@pytest.mark.slow
def test_position_writes_replace_the_fallback_in_place_with_the_same_tokens_and_cache(deterministic):
    model = tiny_qwen2()
    fallback, tokens, cache = decode(model, position_writes=False)
    code, position_tokens, position_cache = decode(model, position_writes=True)
    assert calls(code, "aten.index_put_") == []
    written = calls(code, "torch.ops.capgrpo.write_positions.default")
    assert len(written) == 2 * LAYERS
    assert all(re.fullmatch(r"arg\d+_1", name) for name in written)  # the cache itself, not a copy of it
    assert position_tokens == tokens
    for ours, theirs in zip(position_cache.layers, cache.layers, strict=True):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
        assert int(ours.cumulative_length) == int(theirs.cumulative_length) == PROMPT + 7


def test_the_position_write_layer_updates_as_transformers_does():
    """Same positions, same tensors, same running length as the installed transformers' StaticLayer, through a
    prefill and three tokens (eager: the layer's own arithmetic, on whatever transformers is installed)."""
    g = torch.Generator().manual_seed(2)
    theirs, ours = StaticLayer(max_cache_len=12), kv_writes.PositionWriteLayer(max_cache_len=12)
    for length in (5, 1, 1, 1):
        keys, values = torch.randn(2, 3, length, 4, generator=g), torch.randn(2, 3, length, 6, generator=g)
        got, want = ours.update(keys, values), theirs.update(keys, values)
        assert got[0] is ours.keys and got[1] is ours.values
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert int(ours.cumulative_length) == int(theirs.cumulative_length)
    assert int(ours.cumulative_length) == 8 and torch.count_nonzero(ours.keys[:, :, 8:]) == 0


def test_the_op_writes_distinct_positions_and_leaves_torchs_switch_as_it_was(deterministic):
    cache = torch.zeros(2, 3, 6, 4)
    states = torch.randn(2, 3, 2, 4)
    torch.use_deterministic_algorithms(True, warn_only=True)
    kv_writes.write_positions(cache, torch.tensor([4, 1]), states)
    assert torch.equal(cache[:, :, 4], states[:, :, 0]) and torch.equal(cache[:, :, 1], states[:, :, 1])
    assert torch.count_nonzero(cache[:, :, [0, 2, 3, 5]]) == 0
    assert (
        torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    )


@pytest.mark.parametrize(("switch", "algorithms"), [(True, True), (True, False), (False, True)])
def test_layers_write_by_position_only_under_the_switch_and_torchs_flag(switch, algorithms, monkeypatch):
    monkeypatch.setattr(kv_writes, "POSITION_WRITES", switch)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(algorithms)
    try:

        class Other(StaticLayer):  # someone's own layer kind stays as it is
            pass

        cache = StaticCache(config=tiny_qwen2().config, max_cache_len=CACHE)
        cache.layers[0] = Other(max_cache_len=CACHE)
        kv_writes.use_position_writes(cache)
    finally:
        torch.use_deterministic_algorithms(before)
    kinds = [type(layer) for layer in cache.layers]
    swapped = kv_writes.PositionWriteLayer if switch and algorithms else StaticLayer
    assert kinds == [Other] + [swapped] * (LAYERS - 1)


def test_compiled_calls_keep_a_cache_that_writes_by_position_and_sample_the_same_tokens(deterministic):
    """generate_call's kept static cache (on the CPU transformers runs it eagerly) under the switch: its layers
    write by position, and the greedy tokens are those of transformers' own writes."""
    model = tiny_qwen2()
    prompts = torch.randint(3, 256, (3, 7), generator=torch.Generator().manual_seed(3)).tolist()
    shapes = generation.FixedShapes(rows=4, prompt_multiple=8, max_new_tokens=6)
    greedy = GenerationConfig(do_sample=False, max_new_tokens=6, eos_token_id=None, pad_token_id=0)
    config = generation.compiled_config(greedy, shapes, longest_prompt=7)
    want = generation.generate_call(model, prompts, config, shapes, pad_id=0)
    kv_writes.POSITION_WRITES = True
    got = generation.generate_call(model, prompts, config, shapes, pad_id=0)
    (_, kept), *_ = generation._kept_caches[model].values()
    assert {type(layer) for layer in kept.layers} == {kv_writes.PositionWriteLayer}
    assert got == want


def test_the_generation_bench_applies_the_switches_before_it_measures(deterministic, monkeypatch, tmp_path):
    """`python -m bench.generation --deterministic --kv-writes` (a CPU smoke run of a tiny random Qwen3.5):
    the switches are on when it generates, and its figures record them."""
    from bench import generation as bench

    if "CUBLAS_WORKSPACE_CONFIG" in os.environ:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    torch.use_deterministic_algorithms(False)
    seen = []
    call = generation.generate_call

    def observed(*args, **kwargs):
        seen.append((torch.are_deterministic_algorithms_enabled(), kv_writes.POSITION_WRITES))
        return call(*args, **kwargs)

    monkeypatch.setattr(generation, "generate_call", observed)
    small = ["--hidden", "64", "--layers", "4", "--intermediate", "128", "--vocab", "512"]
    result = bench.main([*small, "--batch", "2", "--prompt", "8", "--new", "2,4", "--backends", "compiled",
                         "--deterministic", "--kv-writes", "--out", str(tmp_path)])  # fmt: skip
    torch.utils.deterministic.fill_uninitialized_memory = True
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)  # set by apply_determinism; absent before
    assert seen and set(seen) == {(True, True)}
    assert result["args"]["deterministic"] and result["args"]["deterministic_kv_writes"]
    # both lengths timed, figures written (the times are the bench's output, not asserted: on a busy CPU the
    # 2-token difference can come out negative; bench/generation.py says so)
    assert set(result["compiled"]["seconds"]) == {2, 4} and (tmp_path / "generation.json").exists()
