"""report.md of an arm comparison (SPEC §7): with several seeds per arm it leads with the seed-level test
(the training run as the unit), then the problem-level test given these checkpoints, the disagreements,
peak and decline, accuracy per step, the plots, and a note on the tests (docs/compare.md)."""

from analysis.comparison import Comparison
from analysis.differences import PairedDiff, set_accuracy
from analysis.pairing import caps
from analysis.stats import ALPHA, EXACT_MAX, ceil_sig, min_seeds
from data.eval_sets import HELDOUT
from rewards.outcome import Outcome
from rundir.files import Run, SetScore, pct


def render_report(c: Comparison, seed: int) -> str:
    a, b, k = c.a, c.b, c.n_seeds
    seeds = f", {k} training seeds per arm" if k > 1 else ""
    out = [f"# Arm comparison: A = {a.arm} (step {a.step}) vs B = {b.arm} (step {b.step}){seeds}", ""]
    out += [f"> **Warning:** {w}" for w in c.warnings] + ([""] if c.warnings else [])
    out += ["## What was compared", "", _table(["", "A", "B"], _setup_rows(c)), ""]
    primary = (
        f"**Primary comparison: {c.primary}, A at step {a.step} against B at step {b.step}"
        + (", the seed-level test" if k > 1 else "")
        + "** "
        + (
            "(the held-out set at the chosen steps, fixed before looking). "
            if c.primary == HELDOUT
            else f"(named as primary; the runs have no {HELDOUT} set or another was asked for). "
        )
        + f"Adjusted p-values control the family-wise error over the {len(c.family())} tests of this report "
        "("
        + ("A − B over seeds per set, " if k > 1 else "")
        + "A − B per set given the checkpoints, decline "
        "per arm and set) by a fixed sequence: the primary at the full level, then Holm over the rest, none "
        "below the primary. The raw p-values stand beside them."
    )
    out += ["## Seed-level test: the training run as the unit", "", primary, "", seed_headline(c), ""]
    out += ["## Problem-level test, given these checkpoints", "", headline(c), ""]
    out += [f"- {n}" for n in headline_notes(c)] + ([""] if headline_notes(c) else [])
    pooled = (
        f" and its {k} training seeds (each seed's A run against the B run of the same seed: "
        f"{', '.join(map(str, a.seeds))})"
        if k > 1
        else ""
    )
    shapes = ", ".join(f"{n}: {a.runs[0].samples(n)} per problem" for n in c.paired)
    out += [
        f"One pair per problem: the mean over its samples{pooled} of (A correct − B correct), in percentage "
        f"points ({shapes}); the problem is the unit of the test. Sample pairs that are indeterminate in either "
        "arm leave the pair; the accuracy columns are each arm's own correct / graded. "
        + _checkpoint_scope(k),
        "",
    ]
    if k > 1:
        out += _per_seed_section(c)
    out += ["## Where the arms disagree", ""]
    for name, counts in c.disagreements.items():
        out += [_disagreement_text(name, c.paired[name], counts), "", _disagreement_table(counts), ""]
    out += ["## Peak and decline", "", _peak_table(c), ""]
    out += [
        "Peak: the most accurate evaluated step up to the compared step (own-denominator accuracy"
        + (", pooled over the seeds" if k > 1 else "")
        + "; the earliest of ties). The change is compared step − peak step. The test is one-sided "
        "(a decline) and selection-aware: under the null hypothesis that the evaluated steps do not differ, each "
        "problem's results are exchangeable across steps, so every Monte Carlo permutation shuffles each "
        "problem's step labels, picks its own peak by the same rule and records its decline; p is the share "
        "at least as large as the observed one, (b + 1) / (m + 1). A test of the observed peak as if it had been "
        "chosen in advance would reject too often (more evaluations, more chances of a high peak). "
        "The paired change is the same change over the sample pairs graded at both steps.",
        "",
        *_at_k_section(c),
        "## Accuracy per eval step",
        "",
    ]
    for side in (a, b):
        for run in side.runs:
            tag = f", seed {run.seed}" if k > 1 else ""
            out += [f"**{side.label}: {run.arm}{tag}** (`{run.dir}`)", "", _accuracy_table(run), ""]
    out += ["## Trajectories", ""]
    if k > 1:
        out += [
            f"Thin lines: each of the {k} seeds; thick line: their mean; band: the lowest to the highest.",
            "",
        ]
    out += [f"### {title}\n\n![{title}]({path.name})\n" for title, path in c.plots.items()]
    out += [
        "## About the tests",
        "",
        *([_seed_test_note(c), ""] if k > 1 else []),
        "A − B given these checkpoints: two-sided paired sign-flip permutation test of the mean per-problem "
        "difference. Under the null hypothesis the two members of each pair are exchangeable, so each "
        "difference is equally likely to have either sign. Exact wherever the differences lie on a lattice "
        "(multiples of 100/L pp: the null distribution by convolution, any number of non-zero differences) "
        f"or at most {EXACT_MAX} are non-zero (all 2^k sign patterns), printed rounded up; otherwise Monte "
        f"Carlo over m random sign patterns (seed {seed}) with p = (b + 1) / (m + 1) per tail, printed rounded "
        'up as "≤ p (b of m draws as extreme)". Two-sided p = 2 × min(lower tail, upper tail), capped at 1; '
        "zero differences count in n and the mean. These are the conventions of "
        "`scipy.stats.permutation_test(permutation_type='samples')`.",
        "",
    ]
    return "\n".join(out)


def seed_headline(c: Comparison) -> str:
    """The seed-level table and power lines; with one seed per arm, why there is no arm-level test."""
    if not c.seed_level:
        return (
            "One training seed per arm: no arm-level test is possible. The training run is the unit of the "
            'question "does arm A train better than arm B?", and one seed pair is one observation; the '
            "seed-to-seed SD cannot be estimated either, so no power can be planned. The problem-level test "
            "below is about these two checkpoints only."
        )
    adjusted = c.adjusted_cells()
    rows = [
        [
            f"{name} (primary)" if name == c.primary else name,
            ", ".join(f"{d:+.1f}" for d in s.diffs_pp),
            f"{s.mean:+.1f}",
            f"{s.sd:.1f}",
            f"{s.a_ahead} of {len(s.diffs_pp)}",
            s.test.p_text(),
            adjusted[f"seeds, A − B, {name}"],
        ]
        for name, s in c.seed_level.items()
    ]
    heads = [
        "set",
        f"A − B per seed (pp; seeds {', '.join(map(str, c.a.seeds))})",
        "mean over seeds (pp)",
        "SD over seeds (pp)",
        "seeds with A ahead",
        f"p (exact sign-flip over {c.n_seeds} seeds)",
        "p adjusted",
    ]
    n = c.n_seeds
    floor = f"with {n} seeds the smallest possible two-sided p is 2 / 2^{n} = {ceil_sig(2 / 2**n, 4)}" + (
        f": below {min_seeds()} seeds no result can reach p ≤ {ALPHA}." if n < min_seeds() else "."
    )
    power = [f"- **{name}**: {s.power_line(c.smallest_effect_pp)}." for name, s in c.seed_level.items()]
    return "\n".join(
        [
            "Each seed's difference: its A run against the B run of the same seed, the mean over problems of "
            "the per-problem paired difference (A correct − B correct, averaged over the problem's samples). "
            f"The test flips the sign of whole seeds' differences: {floor}",
            "",
            _table(heads, rows),
            "",
            *power,
        ]
    )


def headline(c: Comparison) -> str:
    """The problem-level table: A − B per set pooled over seeds, the test given these checkpoints."""
    adjusted = c.adjusted_cells()
    rows = [
        [
            f"{name} (primary)" if name == c.primary and not c.seed_level else name,
            _cell(d.accuracy_a),
            _cell(d.accuracy_b),
            f"{d.test.mean_diff:+.1f}",
            f"{d.test.n} ({d.test.n_nonzero})",
            d.test.p_text(),
            adjusted[f"A − B, {name}"],
            d.test.describe(),
        ]
        for name, d in c.paired.items()
    ]
    heads = [
        "set",
        c.a.title(),
        c.b.title(),
        "A − B paired (pp)",
        "problems (non-zero)",
        "p given these checkpoints (two-sided)",
        f"p adjusted ({len(adjusted)} tests)",
        "sign-flip test",
    ]
    return _table(heads, rows)


def headline_notes(c: Comparison) -> list[str]:
    """Where own-denominator accuracies and the paired mean differ, and what was left out."""
    notes = []
    for name, d in c.paired.items():
        if d.denominators_differ:
            over_pairs = f"{pct(d.pair_share_a)} / {pct(d.pair_share_b)}"
            notes.append(
                f"**{name}**: the accuracies above use each arm's own denominator and differ by "
                f"{d.own_diff_pp:+.1f} pp. The paired difference uses the {d.pairs} sample pairs graded in both "
                f"arms ({d.test.n} problems): the mean over problems of each problem's share correct among its "
                f"pairs is A {pct(d.paired_a)}, B {pct(d.paired_b)}, {d.test.mean_diff:+.1f} pp"
                + (
                    f" (as shares of the pairs themselves, A / B = {over_pairs})."
                    if over_pairs != f"{pct(d.paired_a)} / {pct(d.paired_b)}"
                    else "."
                )
            )
        if d.pairs_dropped or d.n_dropped:
            notes.append(
                f"**{name}**: {d.pairs_dropped} sample pair(s) indeterminate in A or B left out of the test "
                f"and of the disagreement totals; {d.n_dropped} problem(s) had no pair left."
            )
    return notes


def _checkpoint_scope(k: int) -> str:
    if k == 1:
        return "It covers evaluation sampling given the two checkpoints, not the variance between training seeds."
    return (
        f"It covers evaluation sampling given these {2 * k} checkpoints: a seed-level offset shared by all "
        "problems is invisible to it, so it is no test of the arms (under seed-to-seed variation its "
        "false-positive rate exceeds its level, docs/compare.md); the seed-level test above is."
    )


def _seed_test_note(c: Comparison) -> str:
    return (
        f"A − B over seeds (the headline): exact two-sided sign-flip test over the {c.n_seeds} per-seed "
        "differences, all 2^n sign patterns. Under the null hypothesis that the arms do not differ, a seed's A "
        "and B runs are exchangeable (same recipe, seed, base, eval sets and eval seeds; only the arm differs), "
        "so each seed's difference is as likely to have either sign, whatever the seed-to-seed spread. Its "
        "false-positive rate is measured in tests/test_seed_level.py (null runs with seed SD 0, 1.5 and 3 pp). "
        f"Power: seeds per arm for 80% power at two-sided α = {ALPHA}, from the observed SD over seeds: the "
        "one-sample t normal approximation, n = (z_0.975 + z_0.8)² (SD / effect)² + z_0.975² / 2, at least "
        f"{min_seeds()} (the fewest seeds that can reach p ≤ {ALPHA}), and up to 12 seeds raised until the exact "
        "sign-flip's power simulated on normal per-seed differences reaches 80% (its discreteness costs about "
        "a seed there). The SD is itself estimated from few seeds: the numbers are a plan, not a promise."
    )


def _per_seed_section(c: Comparison) -> list[str]:
    rows = []
    for s, per_set in c.per_seed:
        for name, d in per_set.items():
            rows.append(
                [
                    str(s),
                    name,
                    _cell(d.accuracy_a),
                    _cell(d.accuracy_b),
                    f"{d.test.mean_diff:+.1f}",
                    f"{d.test.n} ({d.test.n_nonzero})",
                    d.test.p_text(),
                    d.test.describe(),
                ]
            )
    heads = ["seed", "set", "A accuracy", "B accuracy", "A − B paired (pp)", "problems (non-zero)"]
    return [
        "## Per seed",
        "",
        "Each training seed's A run against the B run of the same seed, paired as above. Raw p-values given "
        "each seed's two checkpoints: detail behind the tables above, not findings of their own (not in the "
        "adjusted family).",
        "",
        _table([*heads, "p given the seed's checkpoints (raw)", "sign-flip test"], rows),
        "",
    ]


def _disagreement_text(name: str, d: PairedDiff, counts) -> str:
    gains = sum(v for (ob, oa), v in counts.items() if oa is Outcome.CORRECT)
    losses = sum(v for (ob, oa), v in counts.items() if ob is Outcome.CORRECT)
    share = 100.0 * (gains - losses) / d.pairs
    same = f"{share:+.1f}" == f"{d.test.mean_diff:+.1f}"
    return (
        f"**{name}**: over the {d.pairs} sample pairs graded in both arms (the pairs the test uses; "
        f"{d.pairs_dropped} with an indeterminate left out), {sum(counts.values())} differ; A correct where B is "
        f"not: {gains}; B correct where A is not: {losses}. {gains} − {losses} = {gains - losses} is the sum over "
        f"the pairs of (A correct − B correct): {share:+.1f} pp of the {d.pairs} pairs"
        + (
            ", the paired difference as well (the two agree exactly when every problem keeps the same number "
            "of pairs)."
            if same
            else f"; the paired difference, a mean over problems of per-problem means, is "
            f"{d.test.mean_diff:+.1f} pp (problems keep different numbers of pairs)."
        )
    )


def _disagreement_table(counts) -> str:
    return _table(
        ["outcome in B → outcome in A", "samples"],
        [
            [f"B {ob} → A {oa}", str(v)]
            for (ob, oa), v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        ],
    )


def _cell(score: SetScore) -> str:
    return f"{pct(score.accuracy)} ({score.outcomes[Outcome.CORRECT]}/{score.graded})"


def _setup_rows(c: Comparison) -> list[list[str]]:
    sides = (c.a, c.b)
    tables = [r.table(side.step) for side in sides for r in side.runs[:1]]

    def row(title: str, fn) -> list[str]:
        return [title, *("<br>".join(sorted({str(fn(r)) for r in side.runs})) for side in sides)]

    return [
        ["run directory", *("<br>".join(f"`{r.dir.resolve()}`" for r in side.runs) for side in sides)],
        row("arm", lambda r: r.arm),
        ["training seeds", *(", ".join(map(str, side.seeds)) for side in sides)],
        row("policy", lambda r: f"`{r.meta['policy_id']}`"),
        row("gate", lambda r: r.meta["gate"]),
        row("groups per step", lambda r: r.meta.get("groups_per_step", "?")),
        ["compared step", *(str(side.step) for side in sides)],
        ["evaluated steps (every seed)", *(", ".join(map(str, side.eval_steps)) for side in sides)],
        row("grader version", lambda r: f"`{r.meta['grader_version']}`"),
        ["eval cap (tokens)", *(caps(t) for t in tables)],
        row("samples per problem", lambda r: _kv({n: r.samples(n) for n in r.sets})),
        row("problems", lambda r: _kv({n: len(r.meta["eval_sets"][n]) for n in r.sets})),
        row("eval temperature / top_p / seed", lambda r: _eval_sampling(r.meta["eval"])),
        row("base model", lambda r: f"`{r.meta.get('base_model', '?')}`"),
    ]


def _eval_sampling(ev: dict) -> str:
    return " / ".join(str(ev.get(k, "?")) for k in ("temperature", "top_p", "seed"))


def _peak_table(c: Comparison) -> str:
    adjusted, rows = c.adjusted_cells(), []
    for side in (c.a, c.b):
        for name, pd in c.peaks[side.label].items():
            acc, t = pd.test.accuracy, pd.test
            rows.append(
                [
                    f"{side.label}: {side.arm}",
                    name,
                    f"{pd.peak_step} ({pct(acc[t.peak])})",
                    f"{pd.step} ({pct(acc[-1])})",
                    f"{pd.decline_pp:+.1f}",
                    f"{pd.change.test.mean_diff:+.1f} ({pd.change.test.n})",
                    t.p_text(),
                    adjusted[f"decline, {side.label} ({side.arm}), {name}"],
                    t.describe() if t.decline > 0 else "no decline: the compared step is the peak",
                ]
            )
    heads = [
        "arm",
        "set",
        "peak step (acc.)",
        "compared step (acc.)",
        "change (pp)",
        "paired change (problems)",
    ]
    return _table([*heads, "p (one-sided)", "p adjusted", "test"], rows)


def _accuracy_table(run: Run) -> str:
    rows = []
    for step in run.evaluated():
        accs = [set_accuracy(run.table(step)[n]) for n in run.sets]
        rows.append(
            [str(step), *(x for acc in accs for x in (_cell(acc), str(acc.outcomes[Outcome.INDETERMINATE])))]
        )
    return _table(["step", *(h for n in run.sets for h in (f"{n} accuracy", f"{n} indeterminate"))], rows)


def _table(heads: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def _kv(d: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in d.items())


def _at_k_section(c: Comparison) -> list[str]:
    """pass@j and maj@k of the sets with several samples per problem (rundir/at_k.py), given these checkpoints."""
    if not c.at_k:
        return []
    rows = [
        [name, r.metric, *(f"{pct(e.value)} [{pct(e.low)}, {pct(e.high)}]" for e in (r.a, r.b)),
         f"{100 * r.test.mean_diff:+.1f} pp", r.test.p_text()]
        for name, rs in c.at_k.items() for r in rs
    ]  # fmt: skip
    head = ["eval set", "metric", f"A ({c.a.arm})", f"B ({c.b.arm})", "A − B", "p (sign-flip, by problem)"]
    return [
        "## pass@k and maj@k, given these checkpoints",
        "",
        "pass@j: the unbiased estimator 1 − C(n−c, j)/C(n, j) per problem (Chen et al. 2021); maj@k: majority "
        "vote over completed answers (truncated, format-rejected and indeterminate rows never vote; a tie "
        "scores the share of tied answers that are correct). Brackets: 95% bootstrap interval over problems "
        "(seeded); A − B paired by problem"
        + (" and seed pair" if c.n_seeds > 1 else "")
        + ", sign-flip test "
        "as below, outside the family of adjusted tests.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]
