"""bench/training_pass.py on a CPU: the benchmark's own logic, which a GPU call should not be the first to run.
Its gated-delta timing calls transformers' chunk function with the key heads repeated to the value heads (the
benchmark's model has twice as many value heads): transformers 5.17's function needs them so (the H200's
version, where the first call with the key heads alone failed), 5.24's accepts both."""

import importlib.util
import json

import pytest

from bench import training_pass


@pytest.mark.parametrize("rule", ["transformers", "ours"])
def test_the_smoke_run_times_the_pass_and_the_gated_delta_rule(tmp_path, rule):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    reference = modeling_qwen3_5.torch_chunk_gated_delta_rule
    args = "--hidden 64 --layers 4 --intermediate 128 --vocab 600 --rows 8 --prompt 8 --completion 24"
    result = training_pass.main(
        [*args.split(), "--micro-batch", "4", "--repeats", "1", "--rule", rule, "--out", str(tmp_path)]
    )
    assert modeling_qwen3_5.torch_chunk_gated_delta_rule is reference  # put back for the rest of the process
    text = json.loads((tmp_path / "training_pass.json").read_text())
    assert text["gated_delta_rule_s"] == result["gated_delta_rule_s"] > 0
    assert len(text["pass_s"]) == 1 and text["pass_s"][0] > 0
    # the floor's seconds are its FLOPs at the H200's dense bf16 rate
    assert text["floor_s"] == pytest.approx(text["floor_tflop"] * 1e12 / training_pass.H200_BF16_FLOPS)


def test_transformers_rule_is_the_torch_reference_even_where_fla_is_bound(monkeypatch):
    """With fla importable, transformers binds a dispatcher to fla under the reference's name; the benchmark's
    `transformers` rule must still be the torch reference (its `__wrapped__`), `fla` must be fla's own, and the
    bound name must come back after the block."""
    import functools
    import types

    def reference(*args, **kwargs):
        return "reference"

    @functools.wraps(reference)
    def bound(*args, **kwargs):
        return "fla"

    module = types.SimpleNamespace(**{training_pass.NAME: bound})
    monkeypatch.setattr(training_pass, "gdn_module", lambda model: module)
    with training_pass.rule_in_place(None, "transformers"):
        assert getattr(module, training_pass.NAME)() == "reference"
    assert getattr(module, training_pass.NAME) is bound
    with training_pass.rule_in_place(None, "ours"):
        assert getattr(module, training_pass.NAME) is training_pass.chunked_gated_delta_rule
    assert getattr(module, training_pass.NAME) is bound


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="fla is installed here")
def test_the_fla_rule_without_fla_stops_naming_it():
    with pytest.raises(ModuleNotFoundError, match="fla"):
        training_pass.fla_rule()
    assert training_pass.fla_versions() == {"fla-core": None, "tilelang": None}


def test_fla_conv_where_it_cannot_run_stops_with_one_line():
    args = "--hidden 64 --layers 4 --intermediate 128 --vocab 600 --rows 8 --prompt 8 --completion 24"
    with pytest.raises(SystemExit, match="--fla-conv: needs flash-linear-attention"):
        training_pass.main([*args.split(), "--fla-conv"])
