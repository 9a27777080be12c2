"""Which runs are compared with which (SPEC §7), or a refusal naming the run, file, step or set.

A and B are each a run directory, a comma-separated list of them, or a glob. With several runs per arm,
each is one training seed (run.json config.seed) and the arms pair by seed. Refused rather than paired
wrongly: a missing step, different eval sets, task ids or samples per problem, duplicate rows, eval rows
that do not match their run.json, seeds that do not pair, and recipes (run.json config) that differ in
more than the seed, the arm and where the run was written. Differences that leave the pairing intact
(grader versions, caps, eval sampling, per-sample seeds) become warnings.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path

from rundir import archive
from rundir.files import Run, RunFileError, Table, steps_path

# run.json config fields that may differ between the runs of one comparison (docs/compare.md):
SEED_FIELDS = ("seed", "data_seed", "task_seed")  # the training seed and what defaults to it
ARM_FIELDS = ("arm", "groups_per_step", "problems_per_round")  # what an arm defines; A vs B only
PLACE_FIELDS = (  # where the run was written and how it reported, not what it trained
    "output_dir",
    "run_name",
    "resume",
    "resume_from_checkpoint",
    "report_to",
    "disable_tqdm",
    "log_level",
    "log_level_replica",
    "push_to_hub",
    "hub_model_id",
    "hub_token",
    "hub_private_repo",
    "hub_strategy",
    "hub_always_push",
    "hub_revision",
    "cpu_threads",  # and on how many threads or grader processes: neither changes a row (tests/test_cpu_generation.py)
    "grader_workers",
    "step0_eval_from",  # the launch's shared step-0 rows, checked identical to the run's own (trainer/eval_callback.py)
)


class CompareError(RunFileError):
    """The runs cannot be compared as asked; the message says which run, file, step or set."""


# --- loading and validation -----------------------------------------------------------------------
def load_run(path: str | Path) -> Run:
    """A run to compare: run.json with its eval sets, steps.jsonl, and at least one training-cap eval file.
    Rows are validated when a step is first compared (`Run.table`)."""
    run = Run(path)
    meta_path = run.dir / "run.json"
    if "eval_sets" not in run.meta:
        raise CompareError(f"{meta_path}: missing field(s) eval_sets")
    for name, ids in run.meta["eval_sets"].items():
        if name not in run.meta["eval"].get("samples", {}):
            raise CompareError(f"{meta_path}: eval.samples has no entry for eval set {name}")
        if len(set(ids)) != len(ids):
            raise CompareError(f"{meta_path}: eval_sets.{name} lists a task id more than once")
    if not archive.exists(steps_path(run.dir)):
        raise CompareError(f"run {run.dir}: no results/steps.jsonl")
    run.steps  # noqa: B018  (read now: a malformed steps.jsonl is refused before any statistics)
    if not run.evaluated():
        raise CompareError(f"run {run.dir}: no results/eval_stepNNN.jsonl")
    return run


def check_comparable(a: Run, b: Run) -> None:
    """Same eval sets, task ids and samples per problem in both runs, or refuse."""
    if a.sets != b.sets:
        raise CompareError(f"eval sets differ: run {a.dir} has {a.sets}, run {b.dir} has {b.sets}")
    for name in a.sets:
        ids_a, ids_b = set(a.meta["eval_sets"][name]), set(b.meta["eval_sets"][name])
        if ids_a != ids_b:
            only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
            raise CompareError(
                f"set {name}: task ids differ between runs: {len(only_a)} only in {a.dir} {only_a[:3]}, "
                f"{len(only_b)} only in {b.dir} {only_b[:3]}"
            )
        if a.samples(name) != b.samples(name):
            raise CompareError(
                f"set {name}: samples per problem differ: {a.samples(name)} in run {a.dir}, "
                f"{b.samples(name)} in run {b.dir}"
            )


# --- several runs per arm -------------------------------------------------------------------------
def expand_runs(spec) -> list[Path]:
    """Run directories from a path, a comma-separated list of paths, a glob, or a list of those."""
    paths: list[Path] = []
    for item in spec if isinstance(spec, list | tuple) else [spec]:
        for part in filter(None, (p.strip() for p in str(item).split(","))):
            if re.search(r"[*?[]", part):
                found = [p for p in archive.glob(part) if archive.exists(p / "run.json")]
                if not found:
                    raise CompareError(f"{part!r} matches no run directory (no match holds a run.json)")
                paths += found
            else:
                paths.append(Path(part))
    if not paths:
        raise CompareError(f"no run directory in {spec!r}")
    seen: dict[Path, Path] = {}
    for p in paths:
        if (key := p.resolve()) in seen:
            raise CompareError(f"run {p} is listed twice ({seen[key]} and {p})")
        seen[key] = p
    return paths


@dataclass
class Side:
    """Arm A or B of a comparison: one run per training seed, compared at one step."""

    label: str  # "A" or "B"
    runs: list[Run]  # by training seed
    step: int

    @property
    def arm(self) -> str:
        return self.runs[0].arm

    @property
    def seeds(self) -> list[int | None]:
        return [r.seed for r in self.runs]

    @property
    def eval_steps(self) -> list[int]:
        return common_steps(self.runs)

    def title(self) -> str:
        k = len(self.runs)
        return f"{self.label}: {self.arm} step {self.step}" + (f" ({k} seeds)" if k > 1 else "")


def common_steps(runs: list[Run]) -> list[int]:
    """Steps evaluated in every one of the runs."""
    return sorted(set.intersection(*(set(r.evaluated()) for r in runs)))


def load_side(label: str, spec, step: int | None) -> Side:
    runs = [load_run(p) for p in expand_runs(spec)]
    arms = sorted({r.arm for r in runs})
    if len(arms) > 1:
        listing = ", ".join(f"{r.dir} ({r.arm})" for r in runs)
        raise CompareError(f"{label} mixes arms {', '.join(arms)}: {listing}")
    if len(runs) > 1:
        by_seed: dict[int, Run] = {}
        for r in runs:
            if r.seed is None:
                raise CompareError(
                    f"{r.dir / 'run.json'}: no config.seed, so the run cannot be paired by training seed"
                )
            if r.seed in by_seed:
                raise CompareError(
                    f"{label}: training seed {r.seed} appears twice: {by_seed[r.seed].dir} and {r.dir}"
                )
            by_seed[r.seed] = r
        runs = [by_seed[s] for s in sorted(by_seed)]
    if step is None:
        if not (common := common_steps(runs)):
            raise CompareError(
                f"{label}: no step is evaluated in every run ({', '.join(str(r.dir) for r in runs)})"
            )
        step = common[-1]
    for r in runs:
        r.table(step)  # validates the compared step of every run now, naming the run that lacks it
    return Side(label, runs, step)


def pair_seeds(a: Side, b: Side) -> list[tuple[Run, Run]]:
    """One run per arm pairs as is; several pair by training seed, and both arms need the same seeds."""
    if len(a.runs) == len(b.runs) == 1:
        return [(a.runs[0], b.runs[0])]
    if a.seeds != b.seeds:
        raise CompareError(
            f"A and B must hold the same training seeds (the arms pair by seed): A ({a.arm}) has "
            f"{a.seeds}, B ({b.arm}) has {b.seeds}"
        )
    return list(zip(a.runs, b.runs))


def recipe_differences(a: Side, b: Side) -> list[tuple[str, str]]:
    """(field, description) per run.json config field (or snapshot hash) in which the recipes differ beyond
    the training seed and where the run was written; arm fields may differ between A and B only."""
    found: dict[str, dict[Path, object]] = {}

    def note(ref: Run, other: Run, skip: set[str]) -> None:
        for key, (x, y) in _recipe_pairs(ref, other).items():
            if key not in skip and x != y:
                found.setdefault(key, {}).update({ref.dir: x, other.dir: y})

    skip = set(SEED_FIELDS) | set(PLACE_FIELDS)
    for side in (a, b):  # each run of an arm against the arm's first...
        for other in side.runs[1:]:
            note(side.runs[0], other, skip)
    note(a.runs[0], b.runs[0], skip | set(ARM_FIELDS))  # ...and the two first runs: covers every pair
    return [
        (key, f"{key}: " + "; ".join(f"{_short(v)} in {p}" for p, v in values.items()))
        for key, values in sorted(found.items())
    ]


def _recipe_pairs(r1: Run, r2: Run) -> dict[str, tuple]:
    c1, c2 = r1.meta.get("config") or {}, r2.meta.get("config") or {}
    pairs = {k: (c1.get(k), c2.get(k)) for k in c1.keys() | c2.keys()}
    pairs["snapshot.sha256"] = (
        (r1.meta.get("snapshot") or {}).get("sha256"),
        (r2.meta.get("snapshot") or {}).get("sha256"),
    )
    return pairs


def _short(x) -> str:
    text = json.dumps(x)
    return text if len(text) <= 60 else text[:57] + "..."


def recipe_check(a: Side, b: Side, allow: tuple[str, ...]) -> list[str]:
    """Refuse recipes that differ beyond seed, arm and place; allowed fields become warnings."""
    notes = [
        f"{r.dir / 'run.json'} has no config: its recipe could not be compared with the others'"
        for r in [*a.runs, *b.runs]
        if not r.meta.get("config")
    ]
    diffs = recipe_differences(a, b)
    refused = [text for key, text in diffs if key not in allow]
    if refused:
        raise CompareError(
            "the runs' recipes (run.json config) differ in more than the training seed, the arm and where "
            "they were written:\n  " + "\n  ".join(refused) + "\n(pass --allow-recipe-difference FIELD to "
            "compare anyway)"
        )
    return notes + [f"recipes differ (allowed): {text}" for _, text in diffs]


def same_run_warnings(a: Side, b: Side) -> list[str]:
    notes = []
    for ra in a.runs:
        for rb in b.runs:
            if ra.dir.resolve() != rb.dir.resolve():
                continue
            if a.step == b.step:
                notes.append(
                    f"A and B are the same run ({ra.dir}) at the same step {a.step}: every difference is "
                    "zero by construction and p = 1 says nothing about the arms"
                )
            else:
                notes.append(
                    f"A and B are the same run ({ra.dir}), at steps {a.step} and {b.step}: this compares two "
                    "steps of one run, not two arms"
                )
    return notes


def pairing_warnings(seed_pairs: list[tuple[Run, Run]], step_a: int, step_b: int) -> list[str]:
    """Differences that do not break the pairing but limit what the comparison says."""
    notes = []
    for a, b in seed_pairs:
        ta, tb = a.table(step_a), b.table(step_b)
        pair = f" (seed {a.seed})" if len(seed_pairs) > 1 else ""
        if a.meta["grader_version"] != b.meta["grader_version"]:
            notes.append(
                f"grader versions differ{pair}: {a.meta['grader_version']} (A) vs {b.meta['grader_version']} (B)"
            )
        if caps(ta) != caps(tb):
            notes.append(f"evaluation caps differ{pair}: {caps(ta)} (A) vs {caps(tb)} (B)")
        for key in ("temperature", "top_p"):
            if a.meta["eval"].get(key) != b.meta["eval"].get(key):
                notes.append(
                    f"eval {key} differs{pair}: {a.meta['eval'].get(key)} (A) vs {b.meta['eval'].get(key)} (B)"
                )
        n = sum(ta[s][k].seed != tb[s][k].seed for s in ta for k in ta[s])
        if n:
            notes.append(
                f"{n} samples were drawn with different seeds in A and B{pair}: pairs share problem, not seed"
            )
    return notes


def seed_warnings(side: Side) -> list[str]:
    """The seeds of one arm should have drawn every eval sample with the same seed."""
    first = side.runs[0].table(side.step)
    notes = []
    for r in side.runs[1:]:
        t = r.table(side.step)
        n = sum(first[s][k].seed != t[s][k].seed for s in first for k in first[s])
        if n:
            notes.append(
                f"{side.label}: {n} eval samples of {r.dir} were drawn with other seeds than in {side.runs[0].dir}"
            )
    return notes


def caps(table: Table) -> str:
    return ", ".join(str(c) for c in sorted({s.cap for rows in table.values() for s in rows.values()}))
