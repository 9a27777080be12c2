"""Compare two arms' runs (SPEC §7): paired accuracy differences, disagreements, peak/decline, plots.

    python -m analysis.compare runs/S2 runs/S0 [--a-step N] [--b-step N] [--out DIR]

Pairing. Evaluation draws sample i of problem p with the same seed at every step and in every arm, so
rows pair by (task_id, sample). A per-problem difference is the mean over that problem's samples of
(A correct − B correct), in percentage points, over the samples graded in both (indeterminate in either
arm drops the sample from the pair; a problem with none left is dropped and counted). heldout300 has one
sample per problem, fixed32 eight: pairing by problem keeps the test's unit the problem, not the sample.
Accuracies exclude indeterminate samples from the denominator and count them separately.

The comparison refuses, naming run and file, rather than pair wrongly: a missing step, different eval
sets, task ids or samples per problem, duplicate rows, or eval rows that do not match their run.json.
Only training-time-cap files (eval_stepNNN.jsonl, no _capCCCC suffix) are read.
"""

import argparse
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

from analysis.plots import Trajectory, plot_all
from analysis.stats import EXACT_MAX, SignFlipResult, sign_flip_test
from rewards.outcome import Outcome

EVAL_FILE = re.compile(r"eval_step(\d{3,})\.jsonl")
ROW_FIELDS = ("step", "set", "task_id", "sample", "seed", "outcome", "completion_tokens", "cap")
RUN_FIELDS = ("arm", "policy_id", "gate", "grader_version", "eval_sets", "eval")


class CompareError(ValueError):
    """The runs cannot be compared as asked; the message says which run, file, step or set."""


# --- loading and validation -----------------------------------------------------------------------
@dataclass(frozen=True)
class Sample:
    outcome: Outcome
    tokens: int
    seed: int
    cap: int


Table = dict[str, dict[tuple[str, int], Sample]]  # eval set -> (task_id, sample index) -> graded sample


@dataclass
class Run:
    path: Path
    meta: dict  # run.json
    steps: list[dict]  # steps.jsonl rows, by step
    eval_files: dict[int, Path]  # step -> results/eval_stepNNN.jsonl
    _tables: dict[int, Table] = field(default_factory=dict, repr=False)

    @property
    def arm(self) -> str:
        return self.meta["arm"]

    @property
    def sets(self) -> list[str]:
        return sorted(self.meta["eval_sets"])

    def samples(self, name: str) -> int:
        return self.meta["eval"]["samples"][name]

    def table(self, step: int) -> Table:
        """Validated eval rows of one step (read once)."""
        if step not in self.eval_files:
            steps = ", ".join(map(str, sorted(self.eval_files)))
            raise CompareError(
                f"run {self.path}: step {step} was not evaluated (no results/eval_step{step:03d}.jsonl); "
                f"evaluated steps: {steps}"
            )
        if step not in self._tables:
            self._tables[step] = _read_eval(self, step)
        return self._tables[step]


def load_run(path: str | Path) -> Run:
    path = Path(path)
    meta_path = path / "run.json"
    if not meta_path.is_file():
        raise CompareError(f"{path}: not a run directory (no run.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError as e:
        raise CompareError(f"{meta_path}: not valid JSON ({e})") from None
    missing = [f for f in RUN_FIELDS if f not in meta]
    if missing:
        raise CompareError(f"{meta_path}: missing field(s) {', '.join(missing)}")
    for name, ids in meta["eval_sets"].items():
        if name not in meta["eval"].get("samples", {}):
            raise CompareError(f"{meta_path}: eval.samples has no entry for eval set {name}")
        if len(set(ids)) != len(ids):
            raise CompareError(f"{meta_path}: eval_sets.{name} lists a task id more than once")

    steps_path = path / "results" / "steps.jsonl"
    if not steps_path.is_file():
        raise CompareError(f"run {path}: no results/steps.jsonl")
    steps: dict[int, dict] = {}
    for line, row in _read_jsonl(steps_path):
        if "step" not in row:
            raise CompareError(f"{steps_path}:{line}: row has no 'step'")
        if row["step"] in steps:
            raise CompareError(f"{steps_path}:{line}: duplicate row for step {row['step']}")
        steps[row["step"]] = row

    eval_files: dict[int, Path] = {}
    for file in sorted((path / "results").glob("eval_step*.jsonl")):
        if m := EVAL_FILE.fullmatch(file.name):
            step = int(m[1])
            if step in eval_files:
                raise CompareError(
                    f"run {path}: two eval files for step {step}: {eval_files[step].name}, {file.name}"
                )
            eval_files[step] = file
    if not eval_files:
        raise CompareError(f"run {path}: no results/eval_stepNNN.jsonl")
    return Run(path, meta, [steps[s] for s in sorted(steps)], eval_files)


def _read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    with path.open() as f:
        for line, text in enumerate(f, 1):
            if text.strip():
                try:
                    yield line, json.loads(text)
                except json.JSONDecodeError as e:
                    raise CompareError(f"{path}:{line}: not valid JSON ({e.msg})") from None


def _read_eval(run: Run, step: int) -> Table:
    path = run.eval_files[step]
    table: Table = {name: {} for name in run.sets}
    for line, row in _read_jsonl(path):
        where = f"{path}:{line}"
        missing = [f for f in ROW_FIELDS if f not in row]
        if missing:
            raise CompareError(f"{where}: row lacks field(s) {', '.join(missing)}")
        if row["step"] != step:
            raise CompareError(f"{where}: row says step {row['step']} in the file of step {step}")
        if row["set"] not in table:
            raise CompareError(
                f"{where}: eval set {row['set']!r} is not in {run.path / 'run.json'} eval_sets"
            )
        try:
            outcome = Outcome(row["outcome"])
        except ValueError:
            raise CompareError(f"{where}: unknown outcome {row['outcome']!r}") from None
        rows, key = table[row["set"]], (row["task_id"], row["sample"])
        if key in rows:
            raise CompareError(
                f"{where}: duplicate row in run {run.path}: set {row['set']}, task {key[0]}, sample {key[1]}"
            )
        rows[key] = Sample(outcome, int(row["completion_tokens"]), row["seed"], row["cap"])
    for name, rows in table.items():
        _check_complete(run, path, name, rows)
    return table


def _check_complete(run: Run, path: Path, name: str, rows: dict) -> None:
    """The rows must be exactly run.json's task ids × samples per problem: the pairing relies on it."""
    ids, n = run.meta["eval_sets"][name], run.samples(name)
    expected = {(t, i) for t in ids for i in range(n)}
    if set(rows) == expected:
        return
    lacking, extra = sorted(expected - set(rows)), sorted(set(rows) - expected)
    detail = [f"{len(lacking)} missing (e.g. task {lacking[0][0]} sample {lacking[0][1]})"] if lacking else []
    detail += [f"{len(extra)} unexpected (e.g. task {extra[0][0]} sample {extra[0][1]})"] if extra else []
    raise CompareError(
        f"{path}: set {name} does not hold run.json's {len(ids)} task ids × {n} samples per problem: "
        + "; ".join(detail)
    )


def check_comparable(a: Run, b: Run) -> None:
    """Same eval sets, task ids and samples per problem in both runs, or refuse."""
    if a.sets != b.sets:
        raise CompareError(f"eval sets differ: run {a.path} has {a.sets}, run {b.path} has {b.sets}")
    for name in a.sets:
        ids_a, ids_b = set(a.meta["eval_sets"][name]), set(b.meta["eval_sets"][name])
        if ids_a != ids_b:
            only_a, only_b = sorted(ids_a - ids_b), sorted(ids_b - ids_a)
            raise CompareError(
                f"set {name}: task ids differ between runs: {len(only_a)} only in {a.path} {only_a[:3]}, "
                f"{len(only_b)} only in {b.path} {only_b[:3]}"
            )
        if a.samples(name) != b.samples(name):
            raise CompareError(
                f"set {name}: samples per problem differ: {a.samples(name)} in run {a.path}, "
                f"{b.samples(name)} in run {b.path}"
            )


# --- statistics on eval rows ----------------------------------------------------------------------
@dataclass(frozen=True)
class SetAccuracy:
    counts: dict[Outcome, int]

    @property
    def graded(self) -> int:
        return sum(self.counts.values()) - self.counts[Outcome.INDETERMINATE]

    @property
    def accuracy(self) -> float:
        return self.rate(Outcome.CORRECT)

    def rate(self, outcome: Outcome) -> float:
        """Share of graded (non-indeterminate) samples; NaN when nothing was graded."""
        return self.counts[outcome] / self.graded if self.graded else math.nan

    def cell(self) -> str:
        return f"{_pct(self.accuracy)} ({self.counts[Outcome.CORRECT]}/{self.graded})"


def set_accuracy(rows: dict[tuple[str, int], Sample]) -> SetAccuracy:
    counts = Counter(s.outcome for s in rows.values())
    return SetAccuracy({o: counts[o] for o in Outcome})


@dataclass(frozen=True)
class PairedDiff:
    """A − B per problem, in percentage points, with the sign-flip test of its mean."""

    accuracy_a: SetAccuracy
    accuracy_b: SetAccuracy
    n_dropped: int  # problems without a sample graded in both
    diffs_pp: list[float]  # one per paired problem, sorted by task id
    test: SignFlipResult


def paired_difference(rows_a: dict, rows_b: dict, *, n_resamples: int, seed: int) -> PairedDiff:
    """Rows of one eval set from two tables with the same keys (check_comparable / same run)."""
    per_task: dict[str, list[int]] = {}  # every problem gets an entry, so dropped ones can be counted
    for key, a in sorted(rows_a.items()):
        b, pairs = rows_b[key], per_task.setdefault(key[0], [])
        if Outcome.INDETERMINATE not in (a.outcome, b.outcome):
            pairs.append((a.outcome is Outcome.CORRECT) - (b.outcome is Outcome.CORRECT))
    diffs = [100.0 * sum(v) / len(v) for v in per_task.values() if v]
    if not diffs:
        raise CompareError("no problem has a sample graded in both (every pair has an indeterminate)")
    test = sign_flip_test(diffs, n_resamples=n_resamples, seed=seed)
    return PairedDiff(set_accuracy(rows_a), set_accuracy(rows_b), len(per_task) - len(diffs), diffs, test)


def disagreements(rows_a: dict, rows_b: dict) -> Counter:
    """Counter of (outcome in B, outcome in A) over the samples where the two differ."""
    return Counter(
        (rows_b[k].outcome, a.outcome) for k, a in rows_a.items() if a.outcome is not rows_b[k].outcome
    )


@dataclass(frozen=True)
class PeakDecline:
    peak_step: int
    step: int  # the compared step
    change: PairedDiff  # compared step − peak step, paired by problem within the run


def peak_decline(run: Run, name: str, step: int, *, n_resamples: int, seed: int) -> PeakDecline:
    """Best-accuracy step at or before `step` (earliest of ties) and the paired change from it to `step`."""
    steps = [s for s in sorted(run.eval_files) if s <= step]
    acc = {s: set_accuracy(run.table(s)[name]).accuracy for s in steps}
    peak = max(steps, key=lambda s: (-math.inf if math.isnan(acc[s]) else acc[s], -s))
    try:
        change = paired_difference(
            run.table(step)[name], run.table(peak)[name], n_resamples=n_resamples, seed=seed
        )
    except CompareError as e:
        raise CompareError(f"run {run.path}, set {name}, steps {peak} and {step}: {e}") from None
    return PeakDecline(peak, step, change)


def trajectory(run: Run, label: str, step: int) -> Trajectory:
    evals = sorted(run.eval_files)
    acc = {name: [set_accuracy(run.table(s)[name]) for s in evals] for name in run.sets}
    return Trajectory(
        label=label,
        compared_step=step,
        eval_steps=evals,
        accuracy={n: [a.accuracy for a in accs] for n, accs in acc.items()},
        median_tokens={
            n: [median(x.tokens for x in run.table(s)[n].values()) for s in evals] for n in run.sets
        },
        truncated={n: [a.rate(Outcome.TRUNCATED) for a in accs] for n, accs in acc.items()},
        format_rejected={n: [a.rate(Outcome.FORMAT_REJECTED) for a in accs] for n, accs in acc.items()},
        train_steps=[row["step"] for row in run.steps],
        logprob_median=_step_series(run, "logprob_median"),
        gate_stat=_step_series(run, "gate_stat"),
    )


def _step_series(run: Run, key: str) -> list[float]:
    """One value per training step; a logged null (nothing to measure that step) becomes NaN."""
    values = []
    for row in run.steps:
        if key not in row:
            raise CompareError(f"{run.path / 'results/steps.jsonl'}: step {row['step']} has no '{key}'")
        values.append(math.nan if row[key] is None else float(row[key]))
    return values


# --- the comparison -------------------------------------------------------------------------------
@dataclass
class Comparison:
    run_a: Run
    run_b: Run
    step_a: int
    step_b: int
    paired: dict[str, PairedDiff]  # per eval set
    disagreements: dict[str, Counter]  # per eval set: (outcome in B, outcome in A) -> samples
    peaks: dict[str, dict[str, PeakDecline]]  # "A" / "B" -> eval set -> peak and decline
    warnings: list[str]
    report: Path
    plots: dict[str, Path]

    def headline(self) -> str:
        a, b = self.run_a.arm, self.run_b.arm
        rows = [
            [
                name,
                d.accuracy_a.cell(),
                d.accuracy_b.cell(),
                f"{d.test.mean_diff:+.1f}",
                str(d.test.n),
                _p(d.test.p_value),
                d.test.describe(),
            ]
            for name, d in self.paired.items()
        ]
        heads = ["set", f"A: {a} step {self.step_a}", f"B: {b} step {self.step_b}", "A − B (pp)", "problems"]
        return _table([*heads, "p (two-sided)", "sign-flip test"], rows)


def compare_runs(
    run_a: str | Path,
    run_b: str | Path,
    out_dir: str | Path | None = None,
    *,
    step_a: int | None = None,
    step_b: int | None = None,
    n_resamples: int = 100_000,
    seed: int = 0,
) -> Comparison:
    """Compare arm A with arm B; writes report.md and PNG plots into out_dir
    (default comparisons/<armA>_vs_<armB>/). Steps default to each run's last evaluated step."""
    a, b = load_run(run_a), load_run(run_b)
    check_comparable(a, b)
    step_a = max(a.eval_files) if step_a is None else step_a
    step_b = max(b.eval_files) if step_b is None else step_b
    ta, tb = a.table(step_a), b.table(step_b)
    kw = {"n_resamples": n_resamples, "seed": seed}
    paired = {}
    for name in a.sets:
        try:
            paired[name] = paired_difference(ta[name], tb[name], **kw)
        except CompareError as e:
            raise CompareError(f"set {name}, {a.path} step {step_a} vs {b.path} step {step_b}: {e}") from None
    out = Path(out_dir) if out_dir is not None else Path("comparisons") / f"{a.arm}_vs_{b.arm}"
    out.mkdir(parents=True, exist_ok=True)
    trajs = [trajectory(a, f"A: {a.arm}", step_a), trajectory(b, f"B: {b.arm}", step_b)]
    result = Comparison(
        run_a=a,
        run_b=b,
        step_a=step_a,
        step_b=step_b,
        paired=paired,
        disagreements={name: disagreements(ta[name], tb[name]) for name in a.sets},
        peaks={
            label: {name: peak_decline(run, name, step, **kw) for name in a.sets}
            for label, run, step in (("A", a, step_a), ("B", b, step_b))
        },
        warnings=_warnings(a, b, ta, tb),
        report=out / "report.md",
        plots=plot_all(out, trajs, a.sets),
    )
    result.report.write_text(render_report(result, seed))
    return result


def _warnings(a: Run, b: Run, ta: Table, tb: Table) -> list[str]:
    """Differences that do not break the pairing but limit what the comparison says."""
    notes = []
    if a.meta["grader_version"] != b.meta["grader_version"]:
        notes.append(
            f"grader versions differ: {a.meta['grader_version']} (A) vs {b.meta['grader_version']} (B)"
        )
    if _caps(ta) != _caps(tb):
        notes.append(f"evaluation caps differ: {_caps(ta)} (A) vs {_caps(tb)} (B)")
    for key in ("temperature", "top_p"):
        if a.meta["eval"].get(key) != b.meta["eval"].get(key):
            notes.append(
                f"eval {key} differs: {a.meta['eval'].get(key)} (A) vs {b.meta['eval'].get(key)} (B)"
            )
    n = sum(ta[s][k].seed != tb[s][k].seed for s in ta for k in ta[s])
    if n:
        notes.append(f"{n} samples were drawn with different seeds in A and B: pairs share problem, not seed")
    return notes


def _caps(table: Table) -> str:
    return ", ".join(str(c) for c in sorted({s.cap for rows in table.values() for s in rows.values()}))


# --- report.md ------------------------------------------------------------------------------------
def render_report(c: Comparison, seed: int) -> str:
    a, b = c.run_a, c.run_b
    out = [f"# Arm comparison: A = {a.arm} (step {c.step_a}) vs B = {b.arm} (step {c.step_b})", ""]
    out += [f"> **Warning:** {w}" for w in c.warnings] + ([""] if c.warnings else [])
    out += ["## What was compared", "", _table(["", "A", "B"], _setup_rows(c)), ""]
    out += ["## Paired difference A − B", "", c.headline(), ""]
    out += [
        f"One pair per problem: the mean over its samples of (A correct − B correct), in percentage points "
        f"({', '.join(f'{n}: {a.samples(n)} per problem' for n in a.sets)}). Samples that are indeterminate in "
        "either arm leave the pair; accuracies exclude them from the denominator.",
    ]
    dropped = {n: d.n_dropped for n, d in c.paired.items() if d.n_dropped}
    if dropped:
        out += ["", "Problems dropped (indeterminate in every sample pair): " + _kv(dropped) + "."]
    out += ["", "## Where the arms disagree", ""]
    for name, counts in c.disagreements.items():
        gains = sum(v for (ob, oa), v in counts.items() if oa is Outcome.CORRECT)
        losses = sum(v for (ob, oa), v in counts.items() if ob is Outcome.CORRECT)
        out += [
            f"**{name}**: {sum(counts.values())} samples differ; A correct where B is not: {gains}; "
            f"B correct where A is not: {losses}.",
            "",
            _table(
                ["outcome in B → outcome in A", "samples"],
                [
                    [f"B {ob} → A {oa}", str(v)]
                    for (ob, oa), v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
                ],
            ),
            "",
        ]
    out += ["## Peak and decline", "", _peak_table(c), ""]
    out += [
        "Peak: the most accurate evaluated step up to the compared step (the earliest of ties). The change is "
        "compared step − peak step within one run, paired by problem and tested like the A − B difference.",
        "",
        "## Accuracy per eval step",
        "",
    ]
    for label, run in (("A", a), ("B", b)):
        out += [f"**{label}: {run.arm}** (`{run.path}`)", "", _accuracy_table(run), ""]
    out += ["## Trajectories", ""]
    out += [f"### {title}\n\n![{title}]({path.name})\n" for title, path in c.plots.items()]
    out += [
        "## About the test",
        "",
        "Two-sided paired sign-flip permutation test of the mean per-problem difference. Under the null "
        "hypothesis the two members of each pair are exchangeable, so each difference is equally likely to "
        f"have either sign. Exact when at most {EXACT_MAX} differences are non-zero (all 2^k sign patterns); "
        f"otherwise Monte Carlo over m random sign patterns (seed {seed}) with p = (b + 1) / (m + 1) per tail, "
        "so the smallest Monte Carlo p is 2 / (m + 1). Two-sided p = 2 × min(lower tail, upper tail), capped "
        "at 1; zero differences count in n and the mean. These are the conventions of "
        "`scipy.stats.permutation_test(permutation_type='samples')`. Each arm is a single run: the test "
        "covers evaluation sampling given the two checkpoints, not the variance between training seeds.",
        "",
    ]
    return "\n".join(out)


def _setup_rows(c: Comparison) -> list[list[str]]:
    runs, steps = (c.run_a, c.run_b), (c.step_a, c.step_b)
    tables = [r.table(s) for r, s in zip(runs, steps)]

    def row(title: str, fn) -> list[str]:
        return [title, *(str(fn(r)) for r in runs)]

    return [
        row("run directory", lambda r: f"`{r.path.resolve()}`"),
        row("arm", lambda r: r.arm),
        row("policy", lambda r: f"`{r.meta['policy_id']}`"),
        row("gate", lambda r: r.meta["gate"]),
        row("groups per step", lambda r: r.meta.get("groups_per_step", "?")),
        ["compared step", *map(str, steps)],
        row("evaluated steps", lambda r: ", ".join(map(str, sorted(r.eval_files)))),
        row("grader version", lambda r: f"`{r.meta['grader_version']}`"),
        ["eval cap (tokens)", *(_caps(t) for t in tables)],
        row("samples per problem", lambda r: _kv({n: r.samples(n) for n in r.sets})),
        row("problems", lambda r: _kv({n: len(r.meta["eval_sets"][n]) for n in r.sets})),
        row("eval temperature / top_p / seed", lambda r: _eval_sampling(r.meta["eval"])),
        row("base model", lambda r: f"`{r.meta.get('base_model', '?')}`"),
    ]


def _eval_sampling(ev: dict) -> str:
    return " / ".join(str(ev.get(k, "?")) for k in ("temperature", "top_p", "seed"))


def _peak_table(c: Comparison) -> str:
    rows = []
    for label, run in (("A", c.run_a), ("B", c.run_b)):
        for name, pd in c.peaks[label].items():
            d = pd.change
            rows.append(
                [
                    f"{label}: {run.arm}",
                    name,
                    f"{pd.peak_step} ({_pct(d.accuracy_b.accuracy)})",
                    f"{pd.step} ({_pct(d.accuracy_a.accuracy)})",
                    f"{d.test.mean_diff:+.1f}",
                    str(d.test.n),
                    _p(d.test.p_value),
                    d.test.describe(),
                ]
            )
    heads = ["arm", "set", "peak step (acc.)", "compared step (acc.)", "change (pp)", "problems"]
    return _table([*heads, "p (two-sided)", "sign-flip test"], rows)


def _accuracy_table(run: Run) -> str:
    rows = []
    for step in sorted(run.eval_files):
        accs = [set_accuracy(run.table(step)[n]) for n in run.sets]
        rows.append(
            [str(step), *(x for acc in accs for x in (acc.cell(), str(acc.counts[Outcome.INDETERMINATE])))]
        )
    return _table(["step", *(h for n in run.sets for h in (f"{n} accuracy", f"{n} indeterminate"))], rows)


def _table(heads: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _kv(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def _p(p: float) -> str:
    return f"{p:.2f}" if p >= 0.01 else f"{p:.2g}"


# --- CLI ------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.compare",
        description="Compare two arms' runs with paired statistics (SPEC §7).",
    )
    parser.add_argument("run_a", type=Path, help="run directory of arm A, e.g. runs/S2")
    parser.add_argument("run_b", type=Path, help="run directory of arm B, e.g. runs/S0")
    parser.add_argument("--a-step", type=int, help="evaluated step of A (default: its last)")
    parser.add_argument("--b-step", type=int, help="evaluated step of B (default: its last)")
    parser.add_argument("--out", type=Path, help="output folder (default: comparisons/<armA>_vs_<armB>/)")
    parser.add_argument(
        "--resamples", type=int, default=100_000, help="Monte Carlo sign patterns (default 100000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="Monte Carlo seed (default 0)")
    args = parser.parse_args(argv)
    if args.resamples < 1:
        parser.error("--resamples must be at least 1")
    try:
        c = compare_runs(
            args.run_a,
            args.run_b,
            args.out,
            step_a=args.a_step,
            step_b=args.b_step,
            n_resamples=args.resamples,
            seed=args.seed,
        )
    except CompareError as e:
        print(f"compare refused: {e}", file=sys.stderr)
        return 2
    print(c.headline())
    for w in c.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"\nreport: {c.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
