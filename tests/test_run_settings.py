"""Settings decided once, in the config: the backends and the grader limits, in training and in `make eval`."""

import json

import pytest

from data.eval_sets import FIXED, HELDOUT
from data.snapshot import snapshot_sha256, write_snapshot
from rewards.grader import Grade
from rewards.outcome import GRADER_VERSIONS, Outcome
from tests.scripted import tiny_random_model
from trainer import eval_checkpoints, setup
from trainer.backends import decide_backends
from trainer.config import CapGRPOConfig, ConfigError, grader_limits
from trainer.evaluation import EvalSpec

TASKS = [{"id": f"t{i}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(3)]


class RecordingPool:
    """Stands in for GraderPool: records the limits it was built with; every completion is wrong."""

    built: list[dict] = []

    def __init__(self, **kwargs):
        RecordingPool.built.append(kwargs)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def grade_batch(self, completions, references, truncated):
        return [Grade(Outcome.WRONG, None) for _ in completions]


def write_run(folder, **fields) -> None:
    """A run.json `make eval` can evaluate (step 0 of a stand-in base) over TASKS, with `fields` on top."""
    snapshot = folder / "tasks.json"
    write_snapshot(TASKS, snapshot)
    spec = EvalSpec(cap=4, temperature=1.0, top_p=1.0, seed=1, samples={FIXED: 1, HELDOUT: 1})
    run = {
        "snapshot": {"path": str(snapshot), "sha256": snapshot_sha256(snapshot)},
        "base_model": "unused: load_checkpoint is replaced",
        "eval_sets": {FIXED: ["t0"], HELDOUT: ["t1", "t2"]},
        "eval": spec.to_json(),
        **fields,
    }
    (folder / "run.json").write_text(json.dumps(run))


def test_make_eval_grades_with_the_runs_grader_limits(tmp_path, monkeypatch):
    """`python -m trainer.eval_checkpoints` builds its pool from run.json's config, as training built its own."""
    tok, model = tiny_random_model()
    write_run(tmp_path, grader_version=GRADER_VERSIONS["v2"],
              config={"grader_workers": 3, "grader_timeout_s": 7.5, "grader_memory_mb": 3000})  # fmt: skip
    monkeypatch.setattr(eval_checkpoints, "GraderPool", RecordingPool)
    monkeypatch.setattr(eval_checkpoints, "load_checkpoint", lambda path, device: (model.float(), tok))
    RecordingPool.built.clear()
    assert eval_checkpoints.main([str(tmp_path), "--steps", "0", "--device", "cpu"]) == 0
    assert RecordingPool.built == [{"workers": 3, "timeout_s": 7.5, "memory_mb": 3000, "grader": "v2"}]
    rows = (tmp_path / "results" / "eval_step000.jsonl").read_text().splitlines()
    assert {json.loads(r)["outcome"] for r in rows} == {"wrong"} and len(rows) == 3


def test_training_builds_its_pool_from_the_config(tmp_path, monkeypatch):
    monkeypatch.setattr(setup, "GraderPool", RecordingPool)
    RecordingPool.built.clear()
    args = CapGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, use_cpu=True, bf16=False, report_to="none",
        grader="v2", grader_timeout_s=3.0, grader_memory_mb=512, grader_workers=1,
    )  # fmt: skip
    setup.grader_pool(args)
    assert RecordingPool.built == [{"workers": 1, "timeout_s": 3.0, "memory_mb": 512, "grader": "v2"}]


def test_grader_limits_default_to_the_configs(tmp_path):
    args = CapGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, use_cpu=True, bf16=False, report_to="none"
    )
    ours = {
        "workers": args.grader_workers,
        "timeout_s": args.grader_timeout_s,
        "memory_mb": args.grader_memory_mb,
    }
    assert grader_limits({}) == ours == grader_limits(json.loads(args.to_json_string()))
    assert ours == {"workers": 2, "timeout_s": 10.0, "memory_mb": 2048}  # an old run.json without them


@pytest.mark.parametrize(
    ("fields", "cuda", "world", "want"),
    [
        ({}, False, 1, (False, False, "eager", False, False)),  # CPU
        ({}, True, 1, (True, True, "compiled", True, False)),  # one GPU
        ({}, True, 2, (False, False, "eager", True, False)),  # several GPUs: FSDP2 shards plain AdamW
        (
            {"use_cpu": True},
            True,
            1,
            (False, False, "eager", False, False),
        ),  # a CPU recipe on a GPU machine: as on a CPU
        (
            {"compiled_generation": True, "cpu_adamw": False},
            False,
            1,
            (True, False, "compiled", False, False),
        ),
        ({"chunked_gated_delta": True}, False, 1, (False, False, "eager", True, False)),
        ({"chunked_gated_delta": False}, True, 1, (True, True, "compiled", False, False)),
    ],
)
def test_backends_are_decided_once_by_the_setup(tmp_path, monkeypatch, fields, cuda, world, want):
    args = CapGRPOConfig(output_dir=str(tmp_path), num_generations=2, bf16=False, report_to="none", **fields)
    b = decide_backends(args, world=world, cuda=cuda, fla=False)  # on such a machine, without fla
    assert (b.compiled_rollouts, b.cpu_adamw, b.eval_generation, b.chunked_gated_delta, b.fla_conv) == want
    names = ("compiled_rollouts", "cpu_adamw", "eval_generation", "chunked_gated_delta", "fla_conv")
    assert b.to_json() == dict(zip(names, want))


def test_with_fla_installed_a_gpu_run_records_that_ours_is_not_in_the_training_pass(tmp_path, monkeypatch):
    """transformers binds fla's kernels when fla imports and our block steps aside, so run.json's backends
    must not claim our rule ran (what the H200's fla rows were read by)."""
    for asked in (None, True):
        args = CapGRPOConfig(
            output_dir=str(tmp_path),
            num_generations=2,
            bf16=False,
            report_to="none",
            chunked_gated_delta=asked,
        )
        assert decide_backends(args, world=1, cuda=True, fla=True).chunked_gated_delta is False


@pytest.mark.parametrize(
    ("asked", "use_cpu", "want"),
    [(None, False, True), (None, True, False), (False, False, False), (True, False, True)],
)
def test_with_fla_installed_gpu_runs_take_its_causal_conv_unless_told_not_to(
    tmp_path, monkeypatch, asked, use_cpu, want
):
    args = CapGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, bf16=False, report_to="none", use_cpu=use_cpu
    )
    args.fla_causal_conv = asked  # as a recipe would ask on a GPU machine (this one may have none)
    backends = decide_backends(args, world=1, cuda=True, fla=True)
    assert backends.fla_conv is want and backends.to_json()["fla_conv"] is want


@pytest.mark.parametrize(
    ("fla", "cuda", "use_cpu", "why"),
    [(False, True, False, "needs flash-linear-attention"), (True, False, False, "needs CUDA"),
     (True, True, True, "needs CUDA")],
)  # fmt: skip
def test_fla_causal_conv_where_it_cannot_run_is_refused_in_one_line(
    tmp_path, monkeypatch, fla, cuda, use_cpu, why
):
    args = CapGRPOConfig(
        output_dir=str(tmp_path), num_generations=2, bf16=False, report_to="none", use_cpu=use_cpu
    )
    args.fla_causal_conv = True  # as a recipe on such a machine would ask
    with pytest.raises(ConfigError, match=f"^fla_causal_conv: true {why}"):
        decide_backends(args, world=1, cuda=cuda, fla=fla)


@pytest.mark.parametrize("deterministic", [True, False])
def test_make_eval_generates_under_the_runs_determinism(deterministic, tmp_path, monkeypatch):
    """A deterministic run's rows come again only from the kernels it ran: `make eval` applies run.json's
    determinism switches before it loads the model (a run.json from before a switch existed: its default)."""
    import os

    import torch

    from engine import kv_writes

    tok, model = tiny_random_model()
    write_run(tmp_path, config={"deterministic": deterministic, "deterministic_kv_writes": True})
    seen = []

    def load(path, device):
        seen.append((torch.are_deterministic_algorithms_enabled(), kv_writes.POSITION_WRITES,
                     torch.utils.deterministic.fill_uninitialized_memory))  # fmt: skip
        return model.float(), tok

    monkeypatch.setattr(eval_checkpoints, "GraderPool", RecordingPool)
    monkeypatch.setattr(eval_checkpoints, "load_checkpoint", load)
    monkeypatch.setattr(kv_writes, "POSITION_WRITES", False)
    before = torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    try:
        assert eval_checkpoints.main([str(tmp_path), "--steps", "0", "--device", "cpu"]) == 0
    finally:
        torch.use_deterministic_algorithms(before[0])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1], False
        if cublas is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    assert seen == [(True, True, True)] if deterministic else seen == [(before[0], False, True)]
