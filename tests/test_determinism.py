"""`deterministic: true` (issue 47, part 3): the switch's plumbing, on a CPU. That two GPU runs then agree bit for
bit is measured by bench/determinism.py on the GPU machine (docs/gpu.md), not here."""

import json
import os

import pytest
import torch
from test_resume_refusals import ModelTouched, argv, inputs  # noqa: F401  (inputs: a fixture)
from trl import ModelConfig, TrlParser

from engine import kv_writes
from trainer import setup, train
from trainer.backends import decide_backends
from trainer.config import CapGRPOConfig, ConfigError, resume_changes


@pytest.fixture
def observed(monkeypatch):
    """What torch's switches were when the model was about to load; torch's global state put back after."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)  # fmt: skip
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    torch.use_deterministic_algorithms(False)
    seen = {}

    def touched(*args, **kwargs):
        seen.update(algorithms=torch.are_deterministic_algorithms_enabled(),
                    cublas=os.environ.get("CUBLAS_WORKSPACE_CONFIG"), cudnn=torch.backends.cudnn.deterministic,
                    benchmark=torch.backends.cudnn.benchmark, fill=torch.utils.deterministic.fill_uninitialized_memory)  # fmt: skip
        raise ModelTouched

    monkeypatch.setattr(setup, "load_base_model", touched)
    yield seen
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]
    torch.utils.deterministic.fill_uninitialized_memory = True
    os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_the_flag_reaches_torch_before_the_model_loads_and_run_json_records_it(inputs, observed):  # noqa: F811
    with pytest.raises(ModelTouched):
        train.main(argv(inputs, "--deterministic", "true"))
    assert observed == {
        "algorithms": True,
        "cublas": ":4096:8",
        "cudnn": True,
        "benchmark": False,
        "fill": True,
    }
    args, _ = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(
        argv(inputs, "--deterministic", "true")
    )
    assert json.loads(args.to_json_string())["deterministic"] is True  # run.json's `config` is this dump


def test_off_by_default_it_changes_nothing(inputs, observed):  # noqa: F811
    with pytest.raises(ModelTouched):
        train.main(argv(inputs))
    assert observed["algorithms"] is False and observed["cublas"] is None


def test_with_vllm_it_is_refused_by_name():
    args = CapGRPOConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True)
    args.use_vllm, args.deterministic = True, True
    with pytest.raises(ConfigError, match="deterministic: vLLM's generation is not repeatable"):
        args.validate()


def test_a_resume_may_not_change_it():
    refused, _ = resume_changes({"deterministic": False}, {"deterministic": True})
    assert refused == {"deterministic": [False, True]}


def test_compiled_generation_stays_the_default_under_the_flag():
    # bitwise-repeatable with compiled generation on the H200 since the eval-copy fix (SmolLM2 and the 1.82B
    # shape, docs/gpu.md), so the flag neither refuses nor turns off the one-GPU default
    args = CapGRPOConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True)
    args.compiled_generation, args.deterministic = True, True
    args.validate()
    args.compiled_generation, args.use_cpu = None, False
    for deterministic in (True, False):
        args.deterministic = deterministic
        assert decide_backends(args, world=1, cuda=True).compiled_rollouts is True  # one CUDA process


def test_the_memory_fill_can_be_turned_off_for_deterministic_runs(inputs, observed):  # noqa: F811
    with pytest.raises(ModelTouched):
        train.main(argv(inputs, "--deterministic", "true", "--deterministic_fill_memory", "false"))
    assert observed["algorithms"] is True and observed["fill"] is False


def test_kv_writes_by_position_follow_the_flag_and_their_switch(monkeypatch):
    """deterministic_kv_writes reaches engine/kv_writes.py with the other switches, and only with deterministic."""
    monkeypatch.setattr(kv_writes, "POSITION_WRITES", False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)  # fmt: skip
    args = CapGRPOConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True)
    try:
        args.deterministic_kv_writes = True
        setup.apply_determinism(args)  # deterministic off: nothing changes
        assert kv_writes.POSITION_WRITES is False and args.deterministic_kv_writes
        args.deterministic = True
        setup.apply_determinism(args)
        assert kv_writes.POSITION_WRITES is True
        args.deterministic_kv_writes = False
        setup.apply_determinism(args)
        assert kv_writes.POSITION_WRITES is False
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)


def test_a_resume_may_not_change_how_the_cache_is_written():
    refused, _ = resume_changes({"deterministic_kv_writes": False}, {"deterministic_kv_writes": True})
    assert refused == {"deterministic_kv_writes": [False, True]}
