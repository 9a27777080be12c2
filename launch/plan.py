"""An experiment's plan: the YAML file committed with its PLAN.md before any run (docs/launch.md).

One reader: `load(path)` checks every field it knows and refuses an unknown or missing one with one line naming
the file and the field, so a typo never silently changes what runs or what is reported.
"""

from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


# the report's section kinds (launch/report.py `section`), checked when the plan is read, not when it is reported
SECTION_KINDS = ("primary", "secondary", "outcome_by_seed", "arm_trajectory", "peak", "decomposition", "compare",
                 "throughput", "launch_status", "reproduction", "seed_table", "timing", "trajectory", "lease",
                 "finished_accuracy", "lead_split")  # fmt: skip


class LaunchError(Exception):
    """Every refusal or failure of the launcher: one line, which `python -m launch` prints once as `error: <line>`
    and exits 1 with; library functions raise it, never exit."""


class PlanError(LaunchError, ValueError):
    """A plan that cannot be read as written: the line names the plan file and the field."""


# Inside the plan's mappings, the keys the launcher reads (launch/base.py, runs.py, report.py) or the report
# quotes: any other is a typo that would be silently ignored, so it is refused (issue 61). `*`: a name of the
# plan's choosing (a snapshot, an eval set), `[]`: every item of a list.
CELL_KEYS = ("tasks", "family", "prompt", "temperature", "model")
NESTED_KEYS = {
    "base": ("kind", "model", "overrides", "eval_problems", "budget_s"),
    "tasks.*": ("generator", "family", "levels", "size", "seed", "path", "sha256", "made_by"),
    "base_report.cells[]": CELL_KEYS,
    "base_report.rule.candidates": CELL_KEYS,
    "eval": ("every", "steps", "sets"),
    "eval.sets.*": ("size", "samples", "from"),
    "primary": ("set", "step", "test", "alpha", "min_step"),
    "secondaries[]": ("set", "step", "cap", "test", "alpha"),
    "decomposition": ("lead_by_control_outcome", "per_arm_and_step"),
    "budget": ("train_s", "parallel", "gpus", "grace_s", "leader_s", "gpu_share", "memory_growth",
               "drop_finished_weights", "mps", "share_step0", "gpu_memory_share"),
    "run_args": ("gpu", "smoke"),  # each a mapping of trainer config fields (launch/settings.py checks them)
}  # fmt: skip
# a report section's keys: these, and the arguments of its kind's function (launch/report.py `section`)
SECTION_KEYS = ("kind", "heading", "level", "body_level", "launch")
SECTION_ARGS = {"secondary": ("set", "step", "cap"), "compare": ("ran_in",), "outcome_by_seed": ("steps", "outcome"),
                "reproduction": ("against", "eval_steps"), "seed_table": ("step",), "timing": ("run",),
                "trajectory": ("seed",), "lease": ("launches",)}  # fmt: skip


@dataclass(frozen=True)
class Rule:
    """The base report's rule (PLAN.md): per candidate cell the smallest cap whose truncated share lies in
    `truncated`; eligible if pass@1 there lies in `pass_at_1` and the `gate` share is at least `min_gate`; the
    eligible cell with the largest gate share wins (ties: `tie_break` fields ascending). Nothing eligible: the
    (cell, cap) with the largest gate share, truncation in `fallback_truncated` and pass@1 in band, flagged."""

    candidates: dict = field(
        default_factory=dict
    )  # cell fields a candidate must have, e.g. {prompt: few-shot}
    truncated: tuple[float, float] = (0.15, 0.35)
    pass_at_1: tuple[float, float] = (0.20, 0.70)
    gate: str = "gate_v1"  # or "mixed"
    min_gate: float = 0.30
    fallback_truncated: tuple[float, float] | None = None
    tie_break: tuple[str, ...] = ("temperature", "tasks")


@dataclass(frozen=True)
class BaseReport:
    """The grid: every cell (tasks x prompt x temperature [x model]) sampled `samples` times on `problems`
    training-pool problems at `cap`; every smaller cap of `caps` is read off the same samples (causal truncation)."""

    cells: tuple[dict, ...]
    caps: tuple[int, ...]
    problems: int
    samples: int
    cap: int
    rule: Rule | None = None  # None: the recipe's own settings (the H200 plan)


@dataclass(frozen=True)
class Plan:
    path: Path
    name: str
    recipe: str  # the trainer recipe every run starts from (configs/*.yaml)
    base: dict  # {kind: packaged, model: smollm2} | {kind: embedded, overrides: configs/h200-base.json}
    tasks: dict  # snapshot name -> how to write it (data/*): {generator: synthetic, ...} | {path: ...}
    prompts: dict  # prompt name -> "recipe" | "default" | the text
    arms: tuple[str, ...]
    seeds: tuple[int, ...] | None  # None: one run per arm, named by the arm (run_name "{arm}")
    run_name: str  # "{arm}" or "smollm2-{arm}-s{seed}"
    steps: int
    eval: dict  # {every, sets: {name: {size, samples, from}}}
    primary: dict  # {set, step, test}
    results: str  # where the committed rows live (docs/experiment-*/)
    base_report: BaseReport | None = None
    secondaries: tuple[dict, ...] = ()
    decomposition: dict = field(default_factory=dict)
    deviation: tuple[str, ...] = ()
    budget: dict = field(default_factory=dict)  # {train_s, parallel, grace_s, leader_s, gpu_share}
    run_args: dict = field(
        default_factory=dict
    )  # {gpu: {field: value}, smoke: {...}} trainer config fields per mode
    report: tuple[dict, ...] = ()  # the report's sections, in order (launch/report.py)
    status: str = "final"  # "draft": the launcher refuses to train from it

    def runs(self, arm: str) -> list[tuple[str, int | None]]:
        """(run directory name, training seed or None) of `arm`, seed order."""
        if self.seeds is None:
            return [(self.run_name.format(arm=arm), None)]
        return [(self.run_name.format(arm=arm, seed=s), s) for s in self.seeds]

    def recipe_dict(self) -> dict:
        return yaml.safe_load((ROOT / self.recipe).read_text())


def _build(cls, raw: dict, where: str):
    known = {f.name for f in fields(cls)}
    for key in raw:
        if key not in known:
            raise PlanError(f"{where}: unknown field '{key}' (known: {', '.join(sorted(known))})")
    try:
        return cls(**raw)
    except TypeError as e:  # a required field missing
        raise PlanError(f"{where}: {e}") from None


class _Loader(yaml.SafeLoader):
    """safe_load that refuses a key written twice in one mapping: YAML keeps the last, silently."""

    def __init__(self, text: str, path: Path):
        super().__init__(text)
        self.name = str(path)  # YAML's own errors name the file too

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str):  # an unhashable key is YAML's own error, below
                continue
            if key in seen:
                raise PlanError(f"{self.name}:{key_node.start_mark.line + 1}: field {key!r} appears twice")
            seen.add(key)
        return super().construct_mapping(node, deep)


def _check_keys(raw: dict, path: Path) -> None:
    """Every nested mapping of NESTED_KEYS is a mapping with only the keys the launcher reads."""

    def items(value, where: str, rest: list[str]):
        if not rest:
            yield where, value
        elif rest[0] == "*" and isinstance(value, dict):
            for k, v in value.items():
                yield from items(v, f"{where}.{k}", rest[1:])
        elif rest[0] == "[]" and isinstance(value, list):
            for i, v in enumerate(value):
                yield from items(v, f"{where}[{i}]", rest[1:])
        elif rest[0] not in ("*", "[]") and isinstance(value, dict):
            # a missing part is _build's to judge; a null base_report or rule means "the recipe's settings"
            if rest[0] in value and not (value[rest[0]] is None and rest[0] in ("base_report", "rule")):
                yield from items(value[rest[0]], f"{where}.{rest[0]}".lstrip("."), rest[1:])
        else:
            raise PlanError(f"{path}: {where}: expected a {'list' if rest[0] == '[]' else 'mapping'}")

    for spec, known in NESTED_KEYS.items():
        for where, value in items(raw, "", spec.replace("[]", ".[]").split(".")):
            _known_keys(value, known, f"{path}: {where}")


def _known_keys(value, known, where: str) -> None:
    if not isinstance(value, dict):
        raise PlanError(f"{where}: expected a mapping, got {type(value).__name__}")
    if unknown := [k for k in value if k not in known]:
        raise PlanError(f"{where}: unknown field {str(unknown[0])!r} (known: {', '.join(known)})")


def _unique(values, where: str) -> None:
    seen = set()
    for v in values:
        if v in seen:
            raise PlanError(f"{where}: {v!r} appears twice")
        seen.add(v)


def load(path: str | Path) -> Plan:
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=lambda text: _Loader(text, path))  # a SafeLoader
    except OSError as e:
        raise PlanError(f"{path}: {e.strerror}") from None
    except yaml.YAMLError as e:  # one line: the file, the line, YAML's problem (its own message spans five)
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise PlanError(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    if not isinstance(raw, dict):
        raise PlanError(f"{path}: not a mapping of plan fields")
    raw = dict(raw)
    if "path" in raw:
        raise PlanError(f"{path}: unknown field 'path'")
    _check_keys(raw, path)
    if "run_args" in raw:
        from launch.settings import plan_settings

        raw["run_args"] = {mode: plan_settings(args, f"{path}: run_args.{mode}")
                           for mode, args in raw["run_args"].items()}  # fmt: skip
    if (br := raw.get("base_report")) is not None:
        br = dict(br)
        if br.get("rule") is not None:
            rule = dict(br["rule"])
            for k in ("truncated", "pass_at_1", "fallback_truncated", "tie_break"):
                if rule.get(k) is not None:
                    rule[k] = tuple(rule[k])
            br["rule"] = _build(Rule, rule, f"{path}: base_report.rule")
        br["cells"], br["caps"] = tuple(br.get("cells", ())), tuple(br.get("caps", ()))
        raw["base_report"] = _build(BaseReport, br, f"{path}: base_report")
    for k in ("arms", "secondaries", "deviation", "report", "seeds"):
        if k in raw and not (k == "seeds" and raw[k] is None):
            if not isinstance(raw[k], list):
                raise PlanError(f"{path}: {k}: expected a list, got {type(raw[k]).__name__}")
            raw[k] = tuple(raw[k])
    plan = _build(Plan, {"path": path, **raw}, str(path))
    if plan.primary.get("set") not in plan.eval.get("sets", {}):
        raise PlanError(f"{path}: primary.set {plan.primary.get('set')!r} is not one of eval.sets")
    for i, sec in enumerate(plan.report):
        if not isinstance(sec, dict):
            raise PlanError(f"{path}: report[{i}]: expected a mapping, got {type(sec).__name__}")
        if sec.get("kind") not in SECTION_KINDS:
            raise PlanError(
                f"{path}: report[{i}].kind {sec.get('kind')!r} is not one of {', '.join(SECTION_KINDS)}"
            )
        _known_keys(sec, (*SECTION_KEYS, *SECTION_ARGS.get(sec["kind"], ())), f"{path}: report[{i}]")
    # a repeat would start (and count) one run twice: refused, as is a run_name that gives two runs one directory
    if bad := [a for a in plan.arms if not isinstance(a, str)]:
        raise PlanError(f"{path}: arms: {bad[0]!r} is not an arm name")
    _unique(plan.arms, f"{path}: arms")
    if plan.seeds is not None:
        if bad := [s for s in plan.seeds if type(s) is not int]:
            raise PlanError(f"{path}: seeds: {bad[0]!r} is not a whole number")
        _unique(plan.seeds, f"{path}: seeds")
    try:
        names = [n for arm in plan.arms for n, _ in plan.runs(arm)]
    except (KeyError, IndexError, ValueError) as e:
        raise PlanError(
            f"{path}: run_name {plan.run_name!r}: not a name of {{arm}} and {{seed}} ({e})"
        ) from None
    if dup := next((n for i, n in enumerate(names) if n in names[:i]), None):
        raise PlanError(f"{path}: run_name {plan.run_name!r} gives two runs the directory {dup!r}")
    if plan.status not in ("draft", "final"):
        raise PlanError(f"{path}: status {plan.status!r} is neither draft nor final")
    if not (ROOT / plan.recipe).is_file():
        raise PlanError(f"{path}: recipe {plan.recipe} does not exist")
    return plan
