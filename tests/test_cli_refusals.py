"""Command lines that cannot be parsed end in one line naming the flag, file, line or key, exit 2, and write
nothing (issue 49: TrlParser's tracebacks and argparse's ~220-line usage); `make card` on a torn row likewise."""

import shutil
from pathlib import Path

import pytest

from cards import card
from trainer import train

ROOT = Path(__file__).resolve().parent.parent
RECIPE = ROOT / "configs/embedded.yaml"


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        train.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.mark.parametrize(
    "recipe, argv, says",
    [
        (
            None,
            ["--config", "{tmp}/none.yaml"],
            "none.yaml: cannot read the recipe (No such file or directory)",
        ),
        ("a: [1, 2\nb: 3\n", [], "recipe.yaml:2: not valid YAML (expected ',' or ']', but got ':')"),
        ("max_stepz: 3\n", [], "recipe.yaml: unknown key(s) max_stepz (not a field of CapGRPOConfig"),
        ("- a\n- b\n", [], "recipe.yaml: a recipe is a mapping of config fields, this one is a list"),
        ("", [], "recipe.yaml: a recipe is a mapping of config fields, this one is empty"),
        ("RECIPE", ["--no_such_flag", "3"], "unknown argument(s): ['--no_such_flag', '3']"),
        ("RECIPE", ["--max_steps", "abc"], "argument --max_steps/--max-steps: invalid int value: 'abc'"),
        ("RECIPE", ["--config"], "--config: expected a recipe file"),
    ],
    ids=["missing", "malformed", "unknown-key", "list", "empty", "unknown-flag", "bad-int", "no-path"],
)
def test_a_bad_command_line_is_one_line_exit_2_and_writes_nothing(recipe, argv, says, tmp_path, capsys):
    path = tmp_path / "recipe.yaml"
    if recipe == "RECIPE":
        shutil.copy(RECIPE, path)
    elif recipe is not None:
        path.write_text(recipe)
    out = tmp_path / "run"
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    config = [] if argv[:1] == ["--config"] else ["--config", str(path)]
    line = _refused([*config, *argv, "--output_dir", str(out)], capsys)
    assert says in line
    assert not out.exists()


def test_config_with_equals_is_the_recipe_as_with_a_space(tmp_path):
    """`--config=FILE` was let through unread (TrlParser looks for the bare flag): the run took the defaults."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(RECIPE.read_text().replace("max_steps: 20", "max_steps: 7"))
    spaced = train.parse(["--config", str(recipe), "--output_dir", str(tmp_path / "a")])
    joined = train.parse([f"--config={recipe}", "--output_dir", str(tmp_path / "a")])
    assert joined[0].max_steps == spaced[0].max_steps == 7
    assert joined[1].model_name_or_path == spaced[1].model_name_or_path == "embedded/base"
    assert joined[0].to_dict() == spaced[0].to_dict()


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--config={tmp}/none.yaml"], "none.yaml: cannot read the recipe (No such file or directory)"),
        (["--config="], "--config: expected a recipe file"),
        (["--config=RECIPE", "--config", "RECIPE"], "--config: given more than once"),
    ],
    ids=["missing", "empty", "twice"],
)
def test_config_with_equals_is_refused_as_with_a_space(argv, says, tmp_path, capsys):
    argv = [a.replace("{tmp}", str(tmp_path)).replace("RECIPE", str(RECIPE)) for a in argv]
    line = _refused([*argv, "--output_dir", str(tmp_path / "run")], capsys)
    assert says in line
    assert not (tmp_path / "run").exists()


def test_every_shipped_recipe_passes_the_key_check():
    for recipe in sorted(ROOT.glob("configs/*.yaml")):
        train.check_recipe(["--config", str(recipe)])  # refuses by raising


def test_make_card_on_a_torn_middle_row_is_one_line(tmp_path, capsys):
    from rundir.archive import unpack

    run = unpack(ROOT / "docs/experiment-h200/result", tmp_path / "h200") / "runs/S2"
    steps = run / "results/steps.jsonl"
    lines = steps.read_text().splitlines(keepends=True)
    steps.write_text("".join([lines[0], lines[1][:40] + "\n", *lines[2:]]))
    with pytest.raises(SystemExit) as exit_:
        card.main([str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 1 and len(err) == 1, err
    assert err[0].startswith(f"error: {steps}:2: not valid JSON")
