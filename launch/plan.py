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
                 "throughput", "launch_status", "reproduction", "seed_table", "timing", "trajectory", "lease")  # fmt: skip


class PlanError(SystemExit):
    """One line naming the plan file and the field; the launcher exits non-zero with it."""


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
    eval: dict  # {every, sets: {name: {size, samples}}, caps: [...]}
    primary: dict  # {set, step, test}
    results: str  # where the committed rows live (docs/experiment-*/)
    base_report: BaseReport | None = None
    secondaries: tuple[dict, ...] = ()
    decomposition: dict = field(default_factory=dict)
    deviation: tuple[str, ...] = ()
    budget: dict = field(default_factory=dict)  # {train_s, parallel, grace_s, leader_s, gpu_share}
    run_args: dict = field(default_factory=dict)  # {gpu: [...], smoke: [...]} trainer arguments per mode
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
            raise PlanError(f"error: {where}: unknown field '{key}' (known: {', '.join(sorted(known))})")
    try:
        return cls(**raw)
    except TypeError as e:  # a required field missing
        raise PlanError(f"error: {where}: {e}") from None


def load(path: str | Path) -> Plan:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise PlanError(f"error: {path}: {e}") from None
    if not isinstance(raw, dict):
        raise PlanError(f"error: {path}: not a mapping of plan fields")
    raw = dict(raw)
    if "path" in raw:
        raise PlanError(f"error: {path}: unknown field 'path'")
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
    for k in ("arms", "secondaries", "deviation", "report"):
        if k in raw:
            raw[k] = tuple(raw[k])
    if raw.get("seeds") is not None:
        raw["seeds"] = tuple(raw["seeds"])
    plan = _build(Plan, {"path": path, **raw}, str(path))
    if plan.primary.get("set") not in plan.eval.get("sets", {}):
        raise PlanError(f"error: {path}: primary.set {plan.primary.get('set')!r} is not one of eval.sets")
    for i, sec in enumerate(plan.report):
        if sec.get("kind") not in SECTION_KINDS:
            raise PlanError(
                f"error: {path}: report[{i}].kind {sec.get('kind')!r} is not one of {', '.join(SECTION_KINDS)}"
            )
    if plan.status not in ("draft", "final"):
        raise PlanError(f"error: {path}: status {plan.status!r} is neither draft nor final")
    if not (ROOT / plan.recipe).is_file():
        raise PlanError(f"error: {path}: recipe {plan.recipe} does not exist")
    return plan
