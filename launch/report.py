"""The report, computed from the plan and the committed rows: the plan's `report` lists its sections in order.

Rows are read only through rundir.files (Run, read_jsonl), so a launch folder may hold them plain or archived.
Section kinds (each a function below, `launch` a folder under the plan's `results`):
  primary           the plan's primary comparison by the seed-level test (analysis.compare), at the last step
                    every tested seed evaluated; with a sensitivity reading over every seed if a run failed, and one
                    per GPU model where the pairs ran on several (run.json `launch.device`)
  outcome_by_seed   S2 - S0 in one outcome's share of the primary set, per seed, with the exact sign-flip test
  arm_trajectory    per arm and evaluated step, means over the tested seeds (accuracy, unresolved, length,
                    entropy, median sampled-token log-prob): the decomposition's per-step part
  secondary         a secondary comparison (set, step, cap) by the seed-level test
  peak              per arm: the step of the peak mean primary accuracy and the decline from it
  decomposition     the S2 - S0 lead at the compared step split by what S0 did on each paired sample
  lead_split        per seed, the lead from pairs where either arm ended unresolved vs where both finished
  finished_accuracy per arm and step, correct among finished answers (what S2 can convert) and the truncated share
  compare           analysis.compare's whole report (report.md) at the last step both arms evaluated; `ran_in`:
                    where the runs were trained, the run-directory row's folder
  throughput        per run: steps/s, tokens/s, generation share, from steps.jsonl's `seconds`
  launch_status     per run: steps logged, updates skipped, steps evaluated (and its GPU, where recorded)
  reproduction      run by run, how far `launch` repeats `against`
  seed_table        the sampled training rollouts' shares at one step per seed
  timing            one run's seconds per phase at every step
  trajectory        one seed per arm at every evaluated step
  lease             lease seconds per run-step and run-steps per GPU-hour of `launches` (launch/lease.py)
"""

import json
import math
import re
import statistics
import tempfile
from pathlib import Path

from launch.lease import table as lease_table
from launch.plan import ROOT, SECTION_KINDS, LaunchError, Plan
from rundir import archive
from rundir.files import Run, read_jsonl, steps_path


def _steps(run: Path) -> list[dict]:
    return read_jsonl(steps_path(run)) if archive.exists(steps_path(run)) else []  # published: in rows.tar.xz


class Launch:
    """One launch's run folders as the plan names them; or the runs of several launches pooled (`where` a list:
    the leases of one experiment, each adding seed pairs), each run in exactly one of them."""

    def __init__(self, plan: Plan, where: Path | list[Path]):
        self.folders = list(where) if isinstance(where, list) else [where]
        self.plan, self.where = plan, self.folders[0]
        self.arms = plan.arms
        self.seeds = plan.seeds if plan.seeds is not None else (None,)
        self.set = plan.primary["set"]

    def dir(self, arm: str, seed: int | None) -> Path:
        name = (
            self.plan.run_name.format(arm=arm)
            if seed is None
            else self.plan.run_name.format(arm=arm, seed=seed)
        )
        found = [f / name for f in self.folders if archive.exists(f / name / "run.json")]
        if len(found) > 1:  # a run belongs to one launch (a pair's two may be in two: issue 62's amendment 4)
            raise LaunchError(
                f"{name}: in {' and '.join(str(f.parent) for f in found)}; a run belongs to one launch"
            )
        return found[0] if found else self.where / name

    def failed(self, run: Path) -> bool:
        """A run whose training applied a non-finite gradient (its weights went NaN); a step whose update was
        skipped (`nonfinite_gradient: skip`) is not a failure."""
        return any(
            not math.isfinite(r.get("grad_norm", 0.0)) and not r.get("update_skipped") for r in _steps(run)
        )

    def started(self, run: Path) -> bool:
        return archive.exists(run / "run.json")

    def device(self, seed) -> str | None:
        """The GPU model a seed's pair ran on (run.json `launch.device`, recorded since 2026-12-05; None before)."""
        found = {json.loads(archive.read_bytes(r / "run.json")).get("launch", {}).get("device")
                 for a in self.arms if self.started(r := self.dir(a, seed))}  # fmt: skip
        return " + ".join(sorted(map(str, found))) if len(found) > 1 else next(iter(found), None)

    def redone(self, run: Path) -> bool:
        """A run that stopped without saving (a crash, a kill) and redid steps from its last saved one on
        `--resume`: the rows it replaced are kept in results/superseded/."""
        return bool(archive.listing(run / "results/superseded", "*"))

    def reached(self, seed) -> bool:
        """Both arms started and (the plan's `primary.min_step`) evaluated a step at least that far."""
        if not all(self.started(self.dir(a, seed)) for a in self.arms):
            return False
        least = self.plan.primary.get("min_step", 0)
        return all(max(Run(self.dir(a, seed)).evaluated(), default=-1) >= least for a in self.arms)

    def tested_seeds(self) -> tuple:
        """The plan's deviation rules: a failed run's seed pair leaves the seed-level test, and so does a pair a
        budget stopped before `primary.min_step` (or never started)."""
        return tuple(
            s
            for s in self.seeds
            if self.reached(s) and not any(self.failed(self.dir(a, s)) for a in self.arms)
        )

    def unredone_seeds(self) -> tuple:
        """The tested pairs without a run that redid steps after an unsaved stop (a sensitivity reading)."""
        return tuple(
            s for s in self.tested_seeds() if not any(self.redone(self.dir(a, s)) for a in self.arms)
        )

    def common_step(self, seeds: tuple | None = None) -> int:
        """The last step every run of `seeds` (every arm) evaluated: the plan's step, or its deviation step."""
        evaluated = [set(Run(self.dir(a, s)).evaluated()) for a in self.arms for s in (seeds or self.seeds)]
        return max(set.intersection(*evaluated))


def compared(lx: Launch, seeds: tuple, out) -> tuple:
    """analysis.compare of the arm's runs of `seeds` against the control's at the last step all of them evaluated,
    its report and figures written into `out`: (the Comparison, that step)."""
    from analysis.compare import compare_runs

    control, arm = lx.arms
    step = lx.common_step(seeds)
    runs = {a: ",".join(str(lx.dir(a, s)) for s in seeds) for a in (control, arm)}
    return compare_runs(runs[arm], runs[control], out, step_a=step, step_b=step, primary=lx.set), step


def comparison_block(lx: Launch, seeds: tuple, title: str) -> str:
    from analysis.report import headline, seed_headline

    control, arm = lx.arms
    with tempfile.TemporaryDirectory() as tmp:
        c, step = compared(lx, seeds, tmp)
    deviation = "" if step == lx.plan.primary["step"] else ", PLAN.md's deviation step"
    return (
        f"### {title}: {arm} − {control}, {lx.set}, step {step}{deviation}, seeds {', '.join(map(str, seeds))}\n\n"
        f"Seed-level test:\n\n{seed_headline(c)}\n\n"
        f"Problem-level test, given these {2 * len(seeds)} checkpoints:\n\n{headline(c)}\n"
    )


def primary(lx: Launch) -> str:
    seeds = lx.tested_seeds()
    out = comparison_block(lx, seeds, "Primary")
    reached = tuple(s for s in lx.seeds if lx.reached(s))
    if seeds != reached:
        out += "\n" + comparison_block(lx, reached, "Sensitivity, every seed (not the primary)")
    if (kept := lx.unredone_seeds()) != seeds and kept:
        out += "\n" + comparison_block(lx, kept, "Sensitivity, without runs that redid steps after a crash")
    by_gpu = {s: lx.device(s) for s in seeds}  # pairs of several GPU models (issue 62's amendment 2)
    models = sorted({g for g in by_gpu.values() if g}) if len(set(by_gpu.values())) > 1 else []
    for gpu in models:
        if len(on := tuple(s for s in seeds if by_gpu[s] == gpu)) > 1:
            out += "\n" + comparison_block(lx, on, f"Sensitivity, the pairs on {gpu} alone")
    return out


def secondary(lx: Launch, set: str, step: int | None = None, cap: int | None = None) -> str:
    """A secondary comparison by the seed-level test: per tested seed, the arm's accuracy on `set` minus the
    control's (at `cap`, default the runs' own), with the exact sign-flip test over the seeds."""
    from analysis.stats import sign_flip_test

    seeds, (control, arm) = lx.tested_seeds(), lx.arms
    step = lx.common_step(seeds) if step is None else step
    d = []
    for s in seeds:
        a, b = (Run(lx.dir(x, s)).score(step, set, cap) for x in (arm, control))
        if a is None or b is None:
            return f"{set} at step {step}{f', cap {cap}' if cap else ''}: not evaluated in every tested run\n"
        d.append(100 * (a.accuracy - b.accuracy))
    t = sign_flip_test(d)
    return (f"{arm} − {control} on {set}, step {step}{f', cap {cap}' if cap else ''}, seeds "
            f"{', '.join(map(str, seeds))}: per seed {', '.join(f'{x:+.1f}' for x in d)} pp; mean "
            f"{statistics.mean(d):+.1f} pp, exact sign-flip p = {t.p_text()}\n")  # fmt: skip


def outcome_by_seed(lx: Launch, steps: list[int], outcome: str = "format_rejected") -> str:
    from analysis.stats import sign_flip_test

    control, arm = lx.arms
    lines = [f"| step | seeds | {arm} - {control} per seed (pp) | mean (pp) | SD (pp) | seeds with {arm} lower | "
             "p (exact sign-flip) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for step in steps:
        started = [s for s in lx.seeds if all(lx.started(lx.dir(a, s)) for a in (arm, control))]
        runs = {s: [Run(lx.dir(a, s)) for a in (arm, control)] for s in started}
        seeds = [s for s, pair in runs.items() if all(step in r.evaluated() for r in pair)]
        d = [100 * (runs[s][0].score(step, lx.set).rate(outcome) - runs[s][1].score(step, lx.set).rate(outcome))
             for s in seeds]  # fmt: skip
        lines.append(f"| {step} | {', '.join(map(str, seeds))} | {', '.join(f'{x:+.1f}' for x in d)} | "
                     f"{statistics.mean(d):+.1f} | {statistics.stdev(d):.1f} | {sum(x < 0 for x in d)} of {len(d)} | "
                     f"{sign_flip_test(d).p_text()} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def arm_trajectory(lx: Launch, fixed: str) -> str:
    """Per arm, the mean over the tested seeds at every evaluation step up to the compared one."""
    seeds = lx.tested_seeds()
    a, b = lx.arms
    ab = f"{a} / {b}"
    lines = [
        f"| step | {lx.set} {ab} | {fixed} {ab} | format-rejected (heldout) {ab} | truncated (heldout) {ab} | "
        f"median length {ab} | entropy {ab} | median logprob {ab} |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def metrics(run: Run, rows: dict, step: int) -> list[float | None]:
        held, fix, row = run.score(step, lx.set), run.score(step, fixed), rows.get(step, {})
        return [100 * held.accuracy, 100 * fix.accuracy, 100 * held.rate("format_rejected"),
                100 * held.rate("truncated"), held.median_tokens, row.get("entropy_mean"),
                row.get("logprob_median")]  # fmt: skip

    per_arm = {
        arm: [(Run(lx.dir(arm, s)), {r["step"]: r for r in _steps(lx.dir(arm, s))}) for s in seeds]
        for arm in lx.arms
    }
    # a median log-prob near 0 (~1e-4) needs significant digits, not decimal places
    formats = ("{:.1f}",) * 5 + ("{:.3f}", "{:.3g}")
    for step in range(0, lx.common_step(seeds) + 1, int(lx.plan.eval["every"])):
        means = {}
        for arm, runs in per_arm.items():
            columns = zip(*(metrics(run, rows, step) for run, rows in runs))
            means[arm] = [None if None in col else statistics.mean(col) for col in columns]
        cells = [
            " / ".join("–" if means[arm][i] is None else fmt.format(means[arm][i]) for arm in lx.arms)
            for i, fmt in enumerate(formats)
        ]
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def peak(lx: Launch) -> str:
    """Peak-then-decline per arm: the evaluated step of the highest mean primary-set accuracy over the tested
    seeds, and how far the mean fell from it by the compared step."""
    seeds = lx.tested_seeds()
    last = lx.common_step(seeds)
    lines = [f"| arm | peak step | peak {lx.set} | step {last} | decline (pp) |", "|---|---|---|---|---|"]
    for arm in lx.arms:
        runs = [Run(lx.dir(arm, s)) for s in seeds]
        steps = sorted(set.intersection(*(set(r.evaluated()) for r in runs)))
        mean = {
            t: 100 * statistics.mean(r.score(t, lx.set).accuracy for r in runs) for t in steps if t <= last
        }
        top = max(mean, key=lambda t: (mean[t], -t))
        lines.append(
            f"| {arm} | {top} | {mean[top]:.1f} | {mean[last]:.1f} | {mean[last] - mean[top]:+.1f} |"
        )
    return "\n".join(lines) + "\n"


def compare(lx: Launch, ran_in: str | None = None) -> str:
    """analysis.compare's whole report of the arm against the control at the last step both evaluated; `ran_in`:
    the folder the runs were trained in, which the run-directory row then names (as the report written there did)
    wherever it names a run, instead of the folder the committed rows are read from."""
    control, arm = lx.arms
    with tempfile.TemporaryDirectory() as tmp:
        compared(lx, lx.seeds, tmp)
        text = (Path(tmp) / "report.md").read_text()
    for run in (lx.dir(a, s) for a in (control, arm) for s in lx.seeds) if ran_in else ():
        text = text.replace(f"`{run.resolve()}`", f"`{Path(ran_in) / run.name}`")  # where a run is named
    return text


def write_comparison(plan: Plan, where: Path | None, out: Path) -> Path:
    """analysis.compare's report.md and figures of the fresh runs under `where` (`make experiment`), or, where None,
    of the committed launches the plan's primary section reads (pooled over "launch*"): the arm against the control
    over the seeds that ran, at the last step all of them evaluated, into out/<arm>_vs_<control>/; with them
    lead_split.png, the lead_split section's parts per seed (the card's central case against the rest)."""
    from analysis.plots import lead_split_figure, plt, save_png

    if where is None:
        primary = next((s for s in plan.report if s["kind"] == "primary"), None)
        if primary is None:
            raise LaunchError(f"{plan.name}: no primary section in its report to draw; pass --results")
        where = launch_where(ROOT / plan.results, primary.get("launch", "."))
    lx = Launch(plan, where)
    control, arm = lx.arms
    if not (seeds := lx.tested_seeds()):
        raise LaunchError(f"{where}: no seed pair of {plan.name} reached a step to compare")
    folder = Path(out) / f"{arm}_vs_{control}"
    compared(lx, seeds, folder)
    seeds, step, parts = lead_parts(lx)
    fig = lead_split_figure(
        seeds, parts, f"{arm} − {control}, {lx.set} at step {step}: the lead per seed in two parts"
    )
    save_png(fig, folder / "lead_split.png")
    plt.close(fig)
    return folder


def throughput_of(run: Path) -> dict:
    """Steps/s, tokens/s and the share of step time in generation, from steps.jsonl's `seconds`. Step time is
    generate + grade + train + eval + save (`grade_lost` is part of grade); generated tokens are the sampled
    rollouts' completion tokens; "warm" leaves out step 1, which pays the compilation of the decode step."""
    rows = _steps(run)

    def stats(rows: list[dict]) -> dict:
        if not rows:
            return {"steps": 0}
        sec = {
            k: sum(r["seconds"].get(k, 0.0) for r in rows)
            for k in ("generate", "grade", "train", "eval", "save")
        }
        total = sum(sec.values())
        generated = sum(sum(r["outcomes_sampled"].values()) * r["completion_length"]["mean"] for r in rows)
        trained = sum(r["tokens_trained"] for r in rows)
        return {
            "steps": len(rows),
            "seconds": {k: round(v, 2) for k, v in sec.items()} | {"step_total": round(total, 2)},
            "steps_per_s": len(rows) / total,
            "generated_tokens": round(generated),
            "generated_tokens_per_s_of_generation": generated / max(sec["generate"], 1e-9),
            "generated_tokens_per_s_of_step_time": generated / total,
            "trained_tokens_per_s_of_train_time": trained / max(sec["train"], 1e-9),
            "generation_share": sec["generate"] / total,
            "generation_share_without_eval": sec["generate"] / max(total - sec["eval"], 1e-9),
            "median_step_s": statistics.median(sum(r["seconds"].get(k, 0.0) for k in sec) for r in rows),
            "sampling_rounds_mean": statistics.mean(r["groups"]["rounds"] for r in rows),
            "sampled_per_trained_group": sum(r["groups"]["sampled"] for r in rows)
            / max(1, sum(r["groups"]["trained"] for r in rows)),
        }

    return {"all": stats(rows), "warm": stats(rows[1:])}


def throughput(lx: Launch) -> str:
    lines = [
        "| run | steps | steps/s | generated tok/s (generation) | generated tok/s (step) | trained tok/s | "
        "generation share | without eval | median step s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm in lx.arms:
        for seed in lx.seeds:
            t = throughput_of(lx.dir(arm, seed))
            for part in ("all", "warm"):
                s = t[part]
                if s["steps"]:
                    lines.append(
                        f"| {lx.dir(arm, seed).name} ({part}) | {s['steps']} | {s['steps_per_s']:.3f} | "
                        f"{s['generated_tokens_per_s_of_generation']:.0f} | {s['generated_tokens_per_s_of_step_time']:.0f} | "
                        f"{s['trained_tokens_per_s_of_train_time']:.0f} | {s['generation_share']:.1%} | "
                        f"{s['generation_share_without_eval']:.1%} | {s['median_step_s']:.2f} |"
                    )
    return "\n".join(lines) + "\n"


def paired_outcomes(lx: Launch, seed: int, step: int) -> list[tuple[str, str]]:
    """(arm's outcome, control's outcome) of every primary-set sample both runs of `seed` evaluated at `step`
    (the same problem and sample index), in the arm's row order."""
    control, arm = lx.arms
    rows = {a: {(r["task_id"], r["sample"]): r["outcome"] for _, r in Run(lx.dir(a, seed)).rows(step)
                if r["set"] == lx.set} for a in (arm, control)}  # fmt: skip
    return [(x, rows[control][k]) for k, x in rows[arm].items() if k in rows[control]]


def decomposition(lx: Launch) -> str:
    """The pre-registered split of the lead at the compared step: over the tested seeds' paired samples (the
    same problem and sample index in both arms of a seed), how many S2-correct/S0-not pairs come from S0
    truncated, S0 format-rejected and S0 wrong, and the reverse; net = S2's gain minus its loss per cause."""
    seeds = lx.tested_seeds()
    step = lx.common_step(seeds)
    control, arm = lx.arms
    causes = ("truncated", "format_rejected", "wrong")
    gain, loss, n = dict.fromkeys(causes, 0), dict.fromkeys(causes, 0), 0
    for s in seeds:
        for x, y in paired_outcomes(lx, s, step):
            n += 1
            if x == "correct" and y in gain:
                gain[y] += 1
            elif y == "correct" and x in loss:
                loss[x] += 1
    lines = [f"{n} paired samples ({lx.set}, step {step}, seeds {', '.join(map(str, seeds))})", "",
             f"| {control} outcome | {control} → {arm} correct | {arm} → {control} correct (by {arm}'s outcome) | net (pp) |",
             "|---|---|---|---|"]  # fmt: skip
    for c in causes:
        lines.append(f"| {c} | {gain[c]} | {loss[c]} | {100 * (gain[c] - loss[c]) / max(n, 1):+.2f} |")
    return "\n".join(lines) + "\n"


def finished_accuracy(lx: Launch) -> str:
    """Per arm and evaluation step, the mean over the tested seeds of the accuracy among finished answers on the
    primary set: correct / (correct + wrong + format-rejected), what a policy that makes the model finish can
    convert (issue 62), beside the truncated share."""
    seeds = lx.tested_seeds()
    a, b = lx.arms
    lines = [f"| step | correct among finished {a} / {b} (%) | truncated {a} / {b} (%) |", "|---|---|---|"]
    runs = {arm: [Run(lx.dir(arm, s)) for s in seeds] for arm in lx.arms}
    steps = sorted(set.intersection(*(set(r.evaluated()) for rs in runs.values() for r in rs)))
    for step in (t for t in steps if t <= lx.common_step(seeds)):
        cells = {arm: [] for arm in lx.arms}
        for arm, rs in runs.items():
            scores = [r.score(step, lx.set) for r in rs]
            cells[arm] = [
                100 * statistics.mean(x.finished_accuracy for x in scores),
                100 * statistics.mean(x.rate("truncated") for x in scores),
            ]
        lines.append(
            f"| {step} | {cells[a][0]:.1f} / {cells[b][0]:.1f} | {cells[a][1]:.1f} / {cells[b][1]:.1f} |"
        )
    return "\n".join(lines) + "\n"


def lead_parts(lx: Launch) -> tuple[tuple, int, dict[str, list[float]]]:
    """Per tested seed, the lead on the primary set at the compared step split in two over the paired samples:
    the part from pairs where either arm ended unresolved (truncated or format-rejected), and the part where both
    finished (correct or wrong); each in pp of the seed's paired samples, so the two add up to the seed's lead.
    Returns (seeds, step, {part: per-seed values})."""
    seeds = lx.tested_seeds()
    step = lx.common_step(seeds)
    unresolved = {"truncated", "format_rejected"}
    parts = {"either unresolved": [], "both finished": []}
    for s in seeds:
        pairs = paired_outcomes(lx, s, step)
        lead = dict.fromkeys(parts, 0)
        for x, y in pairs:
            part = "either unresolved" if x in unresolved or y in unresolved else "both finished"
            lead[part] += (x == "correct") - (y == "correct")
        for part in parts:
            parts[part].append(100 * lead[part] / max(1, len(pairs)))
    return seeds, step, parts


def lead_split(lx: Launch) -> str:
    """`lead_parts` as a table, with the sign-flip over seeds of each part."""
    from analysis.stats import sign_flip_test

    (control, arm), (seeds, step, parts) = lx.arms, lead_parts(lx)
    lines = [f"{arm} − {control} on {lx.set} at step {step}, seeds {', '.join(map(str, seeds))}", "",
             "| pairs where | per seed (pp) | mean (pp) | exact sign-flip p |", "|---|---|---|---|"]  # fmt: skip
    for part, d in parts.items():
        lines.append(f"| {part} | {', '.join(f'{x:+.1f}' for x in d)} | {statistics.mean(d):+.1f} | "
                     f"{sign_flip_test(d).p_text()} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def launch_status(lx: Launch) -> str:
    """Per run: steps logged, updates skipped, steps evaluated; and its GPU where run.json records one."""
    gpus = {s: lx.device(s) for s in lx.seeds}
    gpu = any(gpus.values())
    lines = ["| run | steps logged | updates skipped at steps | evaluated at steps |" + (" GPU |" if gpu else ""),
             "|---|---|---|---|" + ("---|" if gpu else "")]  # fmt: skip
    for arm in lx.arms:
        for seed in lx.seeds:
            run = lx.dir(arm, seed)
            if not lx.started(run):
                lines.append(f"| {run.name} | not started | – | – |" + (" – |" if gpu else ""))
                continue
            rows = _steps(run)
            skipped = ", ".join(str(r["step"]) for r in rows if r.get("update_skipped")) or "none"
            evaluated = ", ".join(map(str, Run(run).evaluated()))
            lines.append(
                f"| {run.name} | {max((r['step'] for r in rows), default=0)} | {skipped} | {evaluated} |"
                + (f" {gpus[seed] or '–'} |" if gpu else "")
            )
    return "\n".join(lines) + "\n"


def reproduction(lx: Launch, against: Launch, eval_steps: tuple[int, ...] = (0, 5, 10)) -> str:
    head = " | ".join(f"same completions, step {s}" for s in eval_steps)
    lines = [f"| run | identical leading training steps | {head} |", "|---" * (2 + len(eval_steps)) + "|"]
    keys = ("outcomes_sampled", "task_ids_trained", "loss")
    for arm in lx.arms:
        for seed in lx.seeds:
            a, b = lx.dir(arm, seed), against.dir(arm, seed)
            same = 0
            for x, y in zip(_steps(a), _steps(b)):
                if any(x[k] != y[k] for k in keys):
                    break
                same += 1
            cells = []
            for step in eval_steps:
                ra, rb = (read_jsonl(r / f"results/eval_step{step:03d}.jsonl") for r in (a, b))
                cells.append(
                    f"{sum(x['completion'] == y['completion'] for x, y in zip(ra, rb))} of {len(ra)}"
                )
            lines.append(f"| {a.name} | {same} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def seed_table(lx: Launch, step: int = 2) -> str:
    from analysis.stats import sign_flip_test

    control, arm = lx.arms
    lines = [
        f"| seed | format-rejected {control} | {arm} | {arm} - {control} (pp) | correct {control} | {arm} | "
        f"{arm} - {control} (pp) |",
        "|---|---|---|---|---|---|---|",
    ]
    diffs: dict[str, list[float]] = {"format_rejected": [], "correct": []}
    for seed in lx.seeds:
        cells = []
        for outcome in diffs:
            share = {}
            for a in lx.arms:
                row = next(r for r in _steps(lx.dir(a, seed)) if r["step"] == step)
                share[a] = 100 * row["outcomes_sampled"][outcome] / sum(row["outcomes_sampled"].values())
            diffs[outcome].append(share[arm] - share[control])
            cells += [f"{share[control]:.1f}%", f"{share[arm]:.1f}%", f"{diffs[outcome][-1]:+.1f}"]
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    summary = []
    for outcome, d in diffs.items():
        t = sign_flip_test(d)
        summary.append(f"{outcome}: mean {statistics.mean(d):+.1f} pp, SD {statistics.stdev(d):.1f} pp over "
                       f"{len(d)} seeds, exact sign-flip p = {t.p_text()} ({t.describe()})")  # fmt: skip
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {x}" for x in summary) + "\n"


def timing(lx: Launch, run: str, fixed: str) -> str:
    path = lx.where / run
    r = Run(path)
    lines = [f"| step | generate (s) | grade (s) | train (s) | eval (s) | {lx.set} | {fixed} | format-rejected "
             "(heldout) |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for row in [{"step": 0, "seconds": {}}, *_steps(path)]:
        sec, step = row["seconds"], row["step"]
        held, fix = r.score(step, lx.set), r.score(step, fixed)
        scores = (
            [f"{held.accuracy:.1%}", f"{fix.accuracy:.1%}", f"{held.rate('format_rejected'):.1%}"]
            if held
            else ["–"] * 3
        )
        times = [f"{sec[k]:.1f}" if sec.get(k) else "–" for k in ("generate", "grade", "train", "eval")]
        lines.append(f"| {step} | " + " | ".join(times + scores) + " |")
    return "\n".join(lines) + "\n"


def trajectory(lx: Launch, fixed: str, seed: int = 0) -> str:
    a, b = lx.arms
    lines = [
        f"| step | {a} {lx.set} | {b} {lx.set} | {a} {fixed} | {b} {fixed} | format-rejected on heldout {a} / {b} | "
        f"median length {a} / {b} | entropy {a} / {b} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    runs = {arm: Run(lx.dir(arm, seed)) for arm in lx.arms}
    entropy = {arm: {r["step"]: r["entropy_mean"] for r in _steps(run.dir)} for arm, run in runs.items()}
    for step in sorted(set(runs[a].evaluated()) | set(runs[b].evaluated())):
        cell = {}
        for arm, run in runs.items():
            held, fix = run.score(step, lx.set), run.score(step, fixed)
            ent = entropy[arm].get(step)
            cell[arm] = (
                (f"{held.accuracy:.1%}", f"{fix.accuracy:.1%}", f"{held.rate('format_rejected'):.1%}",
                 f"{held.median_tokens:g}", f"{ent:.3f}" if ent is not None else "–")
                if held else ("–",) * 5
            )  # fmt: skip
        x, y = cell[a], cell[b]
        lines.append(
            f"| {step} | {x[0]} | {y[0]} | {x[1]} | {y[1]} | {x[2]} / {y[2]} | {x[3]} / {y[3]} | {x[4]} / {y[4]} |"
        )
    return "\n".join(lines) + "\n"


def launch_where(where: Path, launch: str) -> Path | list[Path]:
    """A section's `launch`: one folder under `where`, or a pattern ("launch*") that pools the matching folders."""
    return launch_folders(where, launch) if any(c in launch for c in "*?[") else where / launch


def _numbered(folder: Path) -> list:
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", folder.name)]


def launch_folders(where: Path, pattern: str) -> list[Path]:
    """The launch folders under `where` that `pattern` ("launch*") matches, in lease order (numbers by value:
    launch10 after launch9, not after launch1); none is refused."""
    folders = sorted((p for p in where.glob(pattern) if p.is_dir()), key=_numbered)
    if not folders:
        raise LaunchError(f"{where}: no launch folder matches {pattern!r}")
    return folders


def lease(lx: Launch, launches: list[str] | str) -> str:
    """The lease figures of these launch folders (under the plan's results; a pattern such as "launch*": every
    matching folder, in lease order) side by side (launch/lease.py)."""
    folders = (
        launch_folders(lx.where, launches) if isinstance(launches, str) else [lx.where / n for n in launches]
    )
    return lease_table({f.name: f for f in folders})


def section(plan: Plan, where: Path, spec: dict) -> str:
    spec = dict(spec)
    kind, heading, level = spec.pop("kind"), spec.pop("heading", None), spec.pop("level", 3)
    body_level = spec.pop("body_level", 3)  # of the headings a section writes itself (primary's)
    lx = Launch(plan, launch_where(where, spec.pop("launch", ".")))
    fixed = next((s for s in plan.eval["sets"] if s != plan.primary["set"]), plan.primary["set"])
    against = Launch(plan, where / spec.pop("against")) if "against" in spec else None
    sections = {
        "primary": lambda: primary(lx),
        "secondary": lambda: secondary(lx, **spec),
        "outcome_by_seed": lambda: outcome_by_seed(lx, **spec),
        "arm_trajectory": lambda: arm_trajectory(lx, fixed),
        "peak": lambda: peak(lx),
        "decomposition": lambda: decomposition(lx),
        "finished_accuracy": lambda: finished_accuracy(lx),
        "lead_split": lambda: lead_split(lx),
        "compare": lambda: compare(lx, **spec),
        "throughput": lambda: throughput(lx),
        "launch_status": lambda: launch_status(lx),
        "reproduction": lambda: reproduction(lx, against, **spec),
        "seed_table": lambda: seed_table(lx, **spec),
        "timing": lambda: timing(lx, spec["run"], fixed),
        "trajectory": lambda: trajectory(lx, fixed, **spec),
        "lease": lambda: lease(lx, **spec),
    }
    assert sections.keys() == set(SECTION_KINDS), "launch/plan.py SECTION_KINDS names every section here"
    body = sections[kind]()
    body = body.replace("### ", "#" * body_level + " ") if body_level != 3 else body
    if heading is None:
        return body
    seeds = ", ".join(map(str, lx.tested_seeds()))
    return "#" * level + " " + heading.format(seeds=seeds) + "\n\n" + body


# what a fresh launch's rows get (`--results`, the smoke test): the pre-registered primary and decomposition
STANDARD = (
    {"kind": "primary"},
    {"kind": "decomposition", "heading": "Decomposition of the lead (pre-registered)"},
    {"kind": "lead_split", "heading": "The lead where either arm was unresolved, and where both finished"},
    {
        "kind": "finished_accuracy",
        "heading": "Correct among finished answers, per arm, mean over seeds {seeds}",
    },
    {"kind": "arm_trajectory", "heading": "Per arm, mean over seeds {seeds}, every evaluation"},
    {"kind": "peak", "heading": "Peak then decline, per arm"},
    {"kind": "launch_status", "heading": "How far each run got"},
)


def report(plan: Plan, where: Path | None = None) -> str:
    """Every section of the plan's report, in order, from the rows under plan.results; or the STANDARD
    sections of the runs directly under `where` (a launch not yet committed)."""
    sections = plan.report if where is None else STANDARD
    return "\n".join(section(plan, where or ROOT / plan.results, s) for s in sections)
