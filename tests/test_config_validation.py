"""Config validation up front (issue 15, item 6): a bad value is refused by our field's name in one
`error: ...` line, before any file is written or the model is loaded."""

import pytest
from test_resume_refusals import ModelTouched, argv, inputs, refused  # noqa: F401  (inputs: a fixture)

from trainer import train
from trainer.config import CapGRPOConfig, ConfigError, resume_changes


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--groups_per_step", "0"], "groups_per_step: must be a positive integer, got 0"),
        (["--max_completion_length", "-1"], "max_completion_length: must be a positive integer, got -1"),
        (["--problems_per_round", "0"], "problems_per_round: must be a positive integer, got 0"),
        (["--max_sampling_rounds", "0"], "max_sampling_rounds: must be a positive integer, got 0"),
        (["--per_device_train_batch_size", "0"], "per_device_train_batch_size: must be a positive integer"),
        (["--num_generations", "1"], "num_generations: a group needs at least 2 rollouts, got 1"),
        (["--eval_every", "-2"], "eval_every: must be 0 or more, got -2"),
        (["--keep_states", "-1"], "keep_states: must be 0 or more, got -1"),
        (["--checkpoint_steps", "0", "4"], "checkpoint_steps: steps are numbered from 1, got [0]"),
        (["--eval_cap", "0"], "eval_cap: must be a positive token count, got 0"),
        (["--temperature", "0"], "temperature: must be positive, got 0.0"),
        (["--top_p", "1.5"], "top_p: must be in (0, 1], got 1.5"),
        (["--grader_workers", "0"], "grader_workers: must be a positive integer, got 0"),
        (["--max_steps", "0"], "max_steps: must be positive"),
        (["--arm", "S9"], "arm: unknown arm 'S9'"),
        (["--resume_fallback", "true"], "resume_fallback: only meaningful with --resume"),
        (["--groups_per_step", "3"], "groups_per_step × num_generations = 24 rollouts must split evenly"),
        (["--use_adaptive_entropy", "true"], "use_adaptive_entropy: not supported: stateNNN/ does not hold"),
    ],
)
def test_bad_values_are_refused_by_name_before_anything(inputs, capsys, flags, message):  # noqa: F811
    line = refused(inputs, capsys, *flags)
    assert line == f"error: {line.removeprefix('error: ')}" and message in line
    assert not inputs["run"].exists()  # nothing written, not even the output directory


def test_missing_inputs_are_named(inputs, capsys, tmp_path):  # noqa: F811
    assert "snapshot_path: " in refused(inputs, capsys, "--snapshot_path", str(tmp_path / "none.tasks.json"))
    line = refused(inputs, capsys, "--model_name_or_path", str(tmp_path / "no-base"))
    assert f"model_name_or_path: '{tmp_path / 'no-base'}': no such directory" in line
    assert not inputs["run"].exists()


def test_a_valid_recipe_reaches_the_model(inputs):  # noqa: F811
    with pytest.raises(ModelTouched):
        train.main(argv(inputs))


def test_validation_is_part_of_the_config():
    with pytest.raises(ConfigError, match="groups_per_step"):
        CapGRPOConfig(output_dir="/tmp/unused", groups_per_step=0, report_to="none", use_cpu=True)


def test_resume_changes_classify_fields():
    old = {
        "max_steps": 8,
        "lr_scheduler_type": "constant",
        "learning_rate": 5e-5,
        "eval_every": 4,
        "resume": None,
    }
    new = old | {"max_steps": 12, "eval_every": 2, "resume": "runs/S2", "new_field": 1}
    assert resume_changes(old, new) == ({}, {"eval_every": [4, 2], "max_steps": [8, 12]})
    refused_, _ = resume_changes(old, new | {"learning_rate": 1e-4, "lr_scheduler_type": "linear"})
    assert refused_ == {"learning_rate": [5e-5, 1e-4], "lr_scheduler_type": ["constant", "linear"],
                        "max_steps": [8, 12]}  # fmt: skip


def test_an_unknown_grader_from_a_recipe_is_refused_by_name():
    """The command line checks `choices`; a YAML recipe reaches the dataclass directly."""
    with pytest.raises(ConfigError, match=r"grader: must be one of \['v1', 'v2'\], got 'v3'"):
        CapGRPOConfig(output_dir="/tmp/unused", grader="v3", report_to="none", use_cpu=True)


def test_an_unknown_nonfinite_gradient_policy_is_refused_by_name():
    with pytest.raises(ConfigError, match=r"nonfinite_gradient: must be 'stop' or 'skip', got 'ignore'"):
        CapGRPOConfig(output_dir="/tmp/unused", nonfinite_gradient="ignore", report_to="none", use_cpu=True)
    assert (
        CapGRPOConfig(output_dir="/tmp/unused", report_to="none", use_cpu=True).nonfinite_gradient == "stop"
    )
