"""Config validation up front (issue 15, item 6): a bad value is refused by our field's name in one
`error: ...` line, before any file is written or the model is loaded."""

import json

import pytest
import yaml
from test_resume_refusals import REPO, ModelTouched, argv, inputs, refused  # noqa: F401  (inputs: a fixture)

from rundir.run_json import RunDirError, update_run_json, write_json_atomic
from trainer import setup, train
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
        (["--gpu_memory_share", "0"], "gpu_memory_share: a share in (0, 1], got 0.0"),
        (["--gpu_memory_share", "1.5"], "gpu_memory_share: a share in (0, 1], got 1.5"),
        (["--eval_at_steps", "0", "-10"], "eval_at_steps: steps >= 0, with eval_every > 0"),
        (["--eval_at_steps", "10", "--eval_every", "0"], "eval_at_steps: steps >= 0, with eval_every > 0"),
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


# --- issue 61, class 1: non-finite and absurd numbers, from a recipe or the command line ---------------------
NAN, INF = float("nan"), float("inf")
BEMA = "trl.BEMACallback"
NOT_FINITE = [
    ({"max_steps": NAN}, [], "max_steps: must be a finite number, got nan"),
    ({"max_steps": INF}, [], "max_steps: must be a finite number, got inf"),
    ({"learning_rate": NAN}, [], "learning_rate: must be a finite number, got nan"),
    ({"max_steps": 1.0e20}, [], "max_steps: must be an integer, got 1e+20"),
    ({"temperature": -INF}, [], "temperature: must be a finite number, got -inf"),
    ({"max_grad_norm": NAN}, [], "max_grad_norm: must be a finite number, got nan"),
    ({"lora_dropout": NAN}, [], "lora_dropout: must be a finite number, got nan"),  # ModelConfig's
    ({"callbacks": [{BEMA: {"update_freq": NAN}}]}, [], f"callbacks[0].{BEMA}.update_freq: must be a finite"),
    (
        {"arm": "X", "arms": {"X": {"policy_id": "stop-properly-penalty-v1", "groups_per_step": 8,
                                    "policy_params": {"truncation_reward": NAN}}}},
        [], "arms.X.policy_params.truncation_reward: must be a finite number, got nan",
    ),
    ({}, ["--learning_rate", "nan"], "learning_rate: must be a finite number, got nan"),
    ({}, ["--grader_timeout_s", "inf"], "grader_timeout_s: must be a finite number, got inf"),
    ({}, ["--max_steps", "100000000000000000000"], "max_steps: 100000000000000000000 does not fit in a 64-bit"),
    ({}, ["--max_steps", "2000000000"], "max_steps: at most 1,000,000,000 steps, got 2,000,000,000"),
]  # fmt: skip


@pytest.mark.parametrize("recipe, flags, message", NOT_FINITE)
def test_non_finite_and_absurd_numbers_are_one_line_naming_the_field(
    inputs,  # noqa: F811
    capsys,
    tmp_path,
    recipe,
    flags,
    message,
):
    """YAML's `.nan`/`.inf` reach the dataclass unconverted (argparse converts only strings) and `x <= 0` lets
    NaN through: before, a traceback and a run.json holding NaN. Now one line, exit 1, nothing written."""
    path = tmp_path / "recipe.yaml"
    path.write_text(
        yaml.safe_dump({**yaml.safe_load((REPO / "configs/embedded.yaml").read_text()), **recipe})
    )
    command = argv(inputs, *flags)
    command[command.index("--config") + 1] = str(path)
    with pytest.raises(SystemExit) as exit_:
        train.main(command)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1, err
    assert err[0].startswith("error: ") and message in err[0], err
    assert not inputs["run"].exists()  # no run directory, so no run.json


@pytest.mark.parametrize("field", ["max_completion_length", "eval_cap"])
def test_a_cap_past_the_models_positions_is_refused_before_run_json(tmp_path, capsys, monkeypatch, field):
    """The embedded base has 2048 positions; 2040 tokens after any prompt do not fit. Refused by the field once
    the model's config is known, before the trainer is built and run.json written."""

    def built(*args, **kwargs):
        raise ModelTouched("the trainer was built")

    monkeypatch.setattr(setup, "CapGRPOTrainer", built)
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        train.main(["--config", str(REPO / "configs/embedded.yaml"), "--output_dir", str(run), "--report_to",
                    "none", f"--{field}", "2040"])  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()  # above the line: the weights' loading bar
    assert exit_.value.code == 1 and "Traceback" not in "\n".join(err), err
    assert err[-1].startswith(f"error: {field}: 2040 tokens after the longest prompt (")
    assert "past max_position_embeddings 2048 of embedded/base" in err[-1]
    assert not run.exists()


def test_run_json_is_strict_json(tmp_path):
    """No NaN or Infinity can land in run.json: strict readers (JSON.parse, jq) refuse the file."""
    run = tmp_path / "run"
    run.mkdir()
    write_json_atomic(run / "run.json", {"arm": "S2"})
    for bad in (NAN, INF):
        with pytest.raises(RunDirError, match=r"run\.json: not written: Out of range float values"):
            update_run_json(run, best_step={"set": "heldout300", "step": 2, "accuracy": bad})
    assert json.loads((run / "run.json").read_text(), parse_constant=pytest.fail) == {"arm": "S2"}
    assert sorted(p.name for p in run.iterdir()) == ["run.json"]  # no temp file left either


def test_the_setup_decides_without_writing_into_the_declared_config(tmp_path):
    """Issue 63: the config only declares. build_trainer's decisions (the arm's groups per step, the micro-batch
    and TRL's batch arithmetic) go into the trainer's own copy and run.json, never back into the declaration."""
    argv = ["--config", str(REPO / "configs/embedded.yaml"), "--output_dir", str(tmp_path / "run"),
            "--report_to", "none", "--per_device_train_batch_size", "32"]  # fmt: skip
    args, model_args = train.parse(argv)
    declared = args.to_json_string()
    assert args.gradient_accumulation_steps is None  # derived by the setup
    trainer = setup.build_trainer(args, model_args)
    assert args.to_json_string() == declared and trainer.args is not args
    run = trainer.run_setup
    assert trainer.args.groups_per_step == args.groups_per_step == 8  # the recipe's, over the arm's 32
    rollouts = trainer.args.groups_per_step * trainer.args.num_generations
    assert (trainer.args.per_device_train_batch_size, trainer.args.gradient_accumulation_steps) == (
        run.micro_batch.rows,
        rollouts // run.micro_batch.rows,
    )
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert recorded["config"] == json.loads(trainer.args.to_json_string())  # the settings it runs with
    assert recorded["launch"]["micro_batch"] == run.micro_batch.to_json()
    assert recorded["launch"]["device"] == "cpu"  # a GPU run records its model (torch.cuda.get_device_name)
    # setup.decide (bench/, tests that build the trainer themselves) decides the same from the same declaration
    trainer_args, decided = setup.decide(args, trainer.model, trainer.processing_class, trainer.tasks)
    assert decided == run and trainer_args.to_json_string() == trainer.args.to_json_string()
