"""A run's trainer settings: one mapping of trainer config fields (trainer.config.CapGRPOConfig, trl.ModelConfig),
built in one place (`run_settings`: the recipe, the plan's fields and run_args, the base report's choice and the
launcher's decisions) and turned into the trainer's command line in one place (`argv`). Nothing parses a command
line back: the launcher reads what it needs (max_steps, the base's path) from the mapping.

A plan's run_args are checked here when the plan loads, against the trainer's own parser (HfArgumentParser over
both dataclasses): an unknown field, a value its type or choices refuse, or a list where the field takes one value
(or the reverse) is refused with one line naming the plan file and the key.
"""

import json
import sys
from argparse import ArgumentTypeError
from functools import cache
from pathlib import Path

from launch.base import build_base, snapshot_path, write_tasks
from launch.plan import ROOT, LaunchError, Plan, PlanError


@cache
def _fields() -> dict:
    """Field name -> the argparse action the trainer's parser reads it with."""
    from transformers import HfArgumentParser
    from trl import ModelConfig

    from trainer.config import CapGRPOConfig

    parser = HfArgumentParser((CapGRPOConfig, ModelConfig))
    fields = {}
    for a in (
        parser._actions
    ):  # a bool field defaulting to true also has `--no_<field>` (store_false): the first wins
        if a.dest != "help":
            fields.setdefault(a.dest, a)
    return fields


def _value(key: str, value, where: str, from_text: bool):
    """`value` of trainer field `key` as the trainer's parser will read it; a string of an old plan's argument list
    takes the field's type ("2" -> 2, "false" -> False)."""
    action = _fields().get(key)
    if action is None:
        raise PlanError(f"{where}: unknown field {key!r} (not a field of CapGRPOConfig or trl.ModelConfig)")
    many = action.nargs in ("+", "*")
    if isinstance(value, dict) and not many and action.type is str:  # a mapping field (arms, eval_set_files)
        if not all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool, dict)) for k, v in value.items()
        ):
            raise PlanError(f"{where}.{key}: {value!r} is not a mapping the trainer reads as JSON")
        return value
    if from_text and many:
        value = [value]
    items = value if isinstance(value, list) else [value]
    if isinstance(value, list) != many or not items:
        raise PlanError(f"{where}.{key}: expected {'a list' if many else 'one value'}, got {value!r}")
    checked = []
    for item in items:
        if item is None or isinstance(item, (dict, list)):
            raise PlanError(f"{where}.{key}: {item!r} is not a command-line value")
        try:
            parsed = action.type(render(item)[0]) if action.type else render(item)[0]
        except (TypeError, ValueError, ArgumentTypeError):  # ArgumentTypeError: string_to_bool's
            name = "bool" if action.type.__name__ == "string_to_bool" else action.type.__name__
            raise PlanError(f"{where}.{key}: {item!r} is not a valid {name}") from None
        if action.choices and parsed not in action.choices:
            raise PlanError(f"{where}.{key}: {item!r} is not one of {', '.join(map(str, action.choices))}")
        if (
            not from_text
            and type(parsed) is not type(item)
            and not (type(parsed) is float and type(item) is int)
        ):
            raise PlanError(f"{where}.{key}: {item!r} is a {type(item).__name__}, the field's type is "
                            f"{type(parsed).__name__}")  # fmt: skip
        checked.append(parsed if from_text else item)
    return checked if many else checked[0]


def plan_settings(args, where: str) -> dict:
    """A plan's run_args for one mode, checked: a mapping of fields, or (the first plans) a list of `--flag value`
    strings read into the same mapping."""
    from_text = isinstance(args, list)
    if from_text:
        flags, values = args[::2], args[1::2]
        if len(args) % 2 or not all(isinstance(f, str) and f.startswith("--") for f in flags):
            raise PlanError(f"{where}: an argument list is --flag value pairs, got {args!r}")
        pairs = [(f[2:], v) for f, v in zip(flags, values)]
        if dup := next((k for i, (k, _) in enumerate(pairs) if k in dict(pairs[:i])), None):
            raise PlanError(f"{where}: --{dup} appears twice")
    elif isinstance(args, dict):
        pairs = list(args.items())
    else:
        raise PlanError(f"{where}: expected a mapping of trainer fields, got {type(args).__name__}")
    return {key: _value(key, value, where, from_text) for key, value in pairs}


def render(value) -> list[str]:
    """A setting's value on the trainer's command line: bools as true/false (HfArgumentParser's string_to_bool),
    a list as its items after the flag (its nargs="+" fields: eval_at_steps, checkpoint_steps), a mapping as JSON
    (the config parses arms and eval_set_files from it)."""
    if isinstance(value, dict):
        return [json.dumps(value, sort_keys=True)]
    if isinstance(value, bool):
        return ["true" if value else "false"]
    if isinstance(value, list):
        return [x for item in value for x in render(item)]
    return [str(value)]


def argv(settings: dict) -> list[str]:
    """The trainer's command line for a run's settings."""
    return [
        sys.executable,
        "-m",
        "trainer.train",
        *(x for k, v in settings.items() for x in (f"--{k}", *render(v))),
    ]


def mode(smoke: bool) -> str:
    return "smoke" if smoke else "gpu"


def max_steps(plan: Plan, smoke: bool) -> int:
    return plan.run_args.get(mode(smoke), {}).get("max_steps", plan.steps)


def eval_settings(plan: Plan, steps: int) -> dict:
    """The trainer's evaluation cadence: the plan's `eval.steps` alone (the steps its report reads), else every
    `eval.every` steps."""
    if listed := plan.eval.get("steps"):
        return {"eval_every": 1, "eval_at_steps": [s for s in listed if s <= steps]}
    return {"eval_every": plan.eval["every"]}


def first_evaluated_step(plan: Plan, steps: int) -> int:
    """The first step after 0 that a run evaluates (its last step where none does)."""
    cadence = eval_settings(plan, steps)
    if "eval_at_steps" in cadence:
        return min((s for s in cadence["eval_at_steps"] if s > 0), default=steps)
    return min(cadence["eval_every"], steps)


def base_settings(plan: Plan, work: Path, smoke: bool, gguf: Path | None) -> dict:
    """The settings every run shares: the base, and the base report's choice (this work folder's, or the committed
    one under the plan's results, its snapshot rewritten and checked against its sha256)."""
    work.mkdir(parents=True, exist_ok=True)
    if plan.base_report is None:  # the recipe's own snapshot, temperature and cap
        if plan.base["kind"] == "embedded" and "overrides" not in plan.base:
            return {}  # the shipped embedded base, as the recipe names it: nothing built
        base = build_base(plan, work, None, smoke, gguf) if smoke else work / "base"  # built by `base`
        if not smoke and not (base / "tiny_base.json").is_file():
            raise LaunchError(f"{base}: no complete build; run the base stage first, on the same machine "
                              "(the weights do not come back)")  # fmt: skip
        return {"model_name_or_path": str(base)}
    if not (work / "choice.json").is_file():
        committed = ROOT / plan.results / "base/base_report.json"
        if not committed.is_file():
            raise LaunchError(
                f"{work / 'choice.json'}: missing and {committed} too; run the base stage first"
            )
        choice = json.loads(committed.read_text())["choice"]
        choice.setdefault("tasks", choice.get("family"))
        if (sha := write_tasks(plan, work, choice["tasks"])) != choice["snapshot_sha256"]:
            raise LaunchError(f"{snapshot_path(work, choice['tasks'])}: sha256 {sha}, the base report chose "
                              f"{choice['snapshot_sha256']}")  # fmt: skip
        (work / "choice.json").write_text(json.dumps(choice, indent=1) + "\n")
    choice = json.loads((work / "choice.json").read_text())
    base = build_base(plan, work, choice.get("model"), smoke, gguf)
    return {"model_name_or_path": str(base), "snapshot_path": str(snapshot_path(work, choice["tasks"])),
            "snapshot_sha256": choice["snapshot_sha256"], "temperature": choice["temperature"],
            "max_completion_length": choice["cap"]}  # fmt: skip


def run_settings(plan: Plan, base: dict, run: Path, arm: str, seed: int | None, smoke: bool, parallel: int,
                 step0_rows: Path | None = None) -> dict:  # fmt: skip
    """Everything one run is started with, in command-line order: the recipe, the run (arm, seed, its folder:
    resumed where it holds a run.json), the base settings, steps and evaluation, the plan's run_args (which win
    over the launcher's defaults before them), then what the plan's budget decides (which win over run_args)."""
    b, real = plan.budget, not smoke
    s = {"config": str(ROOT / plan.recipe), "arm": arm, **({"seed": seed} if seed is not None else {})}
    s["resume" if (run / "run.json").is_file() else "output_dir"] = str(run)
    if step0_rows is not None:
        s["step0_eval_from"] = str(step0_rows)  # the base's evaluation, done once per launch
    s |= base
    s |= {"max_steps": plan.steps, **eval_settings(plan, max_steps(plan, smoke))}
    if b.get("gpus") == 0 and parallel > 1:  # runs side by side on the CPU: one intra-op thread each
        s["cpu_threads"] = 1
    s |= plan.run_args.get(mode(smoke), {})
    if b.get("drop_finished_weights") and real:  # its save would be dropped unread
        s["save_last_step"] = False
    if b.get("gpu_memory_share") and real:  # each run sized for its share, not for the whole GPU
        s["gpu_memory_share"] = b["gpu_memory_share"]
    return s
