"""Model cards for checkpoints (`stepNNN/README.md`) and runs (`README.md`), built from the run's own files.

Cards never load weights: everything comes from run.json, results/*.jsonl, the checkpoint's config.json and
the list of stepNNN/ and stateNNN/ directories (docs/CONTRACTS.md). Hub metadata follows TRL's conventions
(base_model, library_name "transformers", tags, framework versions, BibTeX citations) plus a model-index.

    python -m cards.card runs/S2 [--control runs/S0] [--steps 10,20]
"""

import argparse
import json
import logging
import os
import re
from collections import Counter
from pathlib import Path

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData
from transformers import TrainerCallback

from analysis.stats import format_p
from data.prompt import SYSTEM_PROMPT
from policy.arms import (
    ALL_ARMS,
    ALL_POLICIES,
    ARMS,
    MASKED,
    NO_REWARD,
    TRAINED,
    CapPolicy,
    Treatment,
    resolve_arm,
)
from rewards.outcome import Outcome
from rundir.files import STEP_DIR, Run, RunFileError, SetScore, pct

logger = logging.getLogger(__name__)

CONTROL_ARM = "S0"
CONTROL_KEY = "capgrpo_control"  # run-card metadata: the control run, relative to the run dir
N_RESAMPLES = 100_000  # Monte Carlo sign patterns, as `make compare` uses by default
BASE_FILES = ("README.md", ".gitattributes")  # what the seed's save copied from the base model dir
FAILURES = (Outcome.WRONG, Outcome.TRUNCATED, Outcome.FORMAT_REJECTED, Outcome.INDETERMINATE)

CITATIONS = """Cite GRPO as:

```bibtex
@article{shao2024deepseekmath,
  title   = {{DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models}},
  author  = {Shao, Zhihong and Wang, Peiyi and Zhu, Qihao and Xu, Runxin and Song, Junxiao and Bi, Xiao and
             Zhang, Haowei and Zhang, Mingchuan and Li, Y. K. and Wu, Y. and Guo, Daya},
  journal = {arXiv preprint arXiv:2402.03300},
  year    = {2024}
}
```

Cite TRL as:

```bibtex
@software{vonwerra2020trl,
  title  = {{TRL: Transformers Reinforcement Learning}},
  author = {von Werra, Leandro and Belkada, Younes and Tunstall, Lewis and Beeching, Edward and Thrush, Tristan and
            Lambert, Nathan and Huang, Shengyi and Rasul, Kashif and Gallouédec, Quentin},
  url    = {https://github.com/huggingface/trl},
  year   = {2020}
}
```"""

_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    undefined=jinja2.StrictUndefined,  # a missing value is a bug in this module, not an empty cell
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


# --- the run, as the cards read it ------------------------------------------------------------------
def read_run(run_dir: Path | str) -> Run:
    """The run directory, with what a card needs beyond the contract: the base model and a known policy."""
    run = Run(run_dir)
    if "base_model" not in run.meta:
        raise RunFileError(f"{run.dir / 'run.json'}: missing field 'base_model'")
    if run.policy_id not in ALL_POLICIES:
        known = sorted(ALL_POLICIES)
        raise RunFileError(f"{run.dir / 'run.json'}: unknown policy_id {run.policy_id!r}; known: {known}")
    return run


def recorded_policy(run: Run) -> CapPolicy:
    """The policy as trained: the recorded arm's, with the policy_params of its recipe's `arms:`."""
    extra = run.meta.get("config", {}).get("arms")
    try:
        arm = resolve_arm(run.arm, json.loads(extra) if isinstance(extra, str) else extra)
    except (ValueError, TypeError):  # an arm this version no longer defines: the bare policy
        return ALL_POLICIES[run.policy_id]
    return arm.policy if arm.policy_id == run.policy_id else ALL_POLICIES[run.policy_id]


# --- what the cards say -----------------------------------------------------------------------------
def describe_treatment(t: Treatment, failure_reward: float) -> str:
    if t == TRAINED:
        return f"active in the loss with reward {failure_reward:g} (trained as failures)"
    if t == MASKED:
        return "masked: their tokens leave the loss and the token-count normaliser"
    if t == NO_REWARD:
        return "given no reward (NaN): out of the group baseline, advantage 0, tokens kept in the loss normaliser"
    return f"in the loss: {t.loss}, in the normaliser: {t.normaliser}, in the baseline: {t.baseline}"


def describe_policy(policy: CapPolicy) -> dict[str, str]:
    """The cards' prose for a policy, derived from its row of the table in trainer/arms.py."""
    truncated, rejected = (
        describe_treatment(t, policy.failure_reward) for t in (policy.truncated, policy.format_rejected)
    )
    unresolved = (
        truncated
        if truncated == rejected
        else f"split by kind — truncated: {truncated}; format-rejected: {rejected}"
    )
    gate = {
        "v1": "a group trains iff it has at least one correct and at least one completed wrong",
        "v2": "a group trains iff it has at least one correct and at least one failure of any kind "
        "(wrong, truncated or format-rejected)",
        "all": "every group trains (no dynamic sampling; a group whose rewards are all equal has advantage 0)",
    }[policy.gate]
    reward = f"1 for correct, {policy.failure_reward:g} for any other gradeable outcome"
    if policy.overlong_penalty_factor:
        b = "a fifth of the cap" if policy.overlong_buffer_len is None else f"{policy.overlong_buffer_len}"
        reward += (
            f", plus DAPO's soft overlong punishment: −{policy.overlong_penalty_factor:g} × (length − (cap − B)) / B "
            f"over the last B tokens before the cap (B = {b})"
        )
    return {"unresolved": unresolved, "gate": gate, "reward": reward, "source": policy.source}


def changes_from_control(run: Run) -> list[str]:
    """How this arm differs from the control arm S0 (trainer/arms.py), in policy and groups per step."""
    control = ARMS[CONTROL_ARM]
    if run.arm == CONTROL_ARM:
        return [f"This is the control arm ({control.note})."]
    changes = []
    policy, base = recorded_policy(run), control.policy
    kinds = [
        ("Truncated", policy.truncated, base.truncated),
        ("Format-rejected", policy.format_rejected, base.format_rejected),
    ]
    if all(now == kinds[0][1] and was == kinds[0][2] for _, now, was in kinds):  # one treatment of both kinds
        kinds = [("Unresolved", policy.truncated, base.truncated)]
    for kind, now, was in kinds:
        if now == was:
            continue
        if {now, was} == {TRAINED, MASKED}:  # the seed's own switch, in its words
            trained = f"active (reward {policy.failure_reward:g})"
            new, old = (trained, "masked") if now == TRAINED else ("masked", "active")
            change = f"{new} in the loss instead of {old}"
        else:
            now_text, was_text = (
                describe_treatment(now, policy.failure_reward),
                describe_treatment(was, base.failure_reward),
            )
            change = f"{now_text}, instead of {was_text}"
        of = " (truncated or format-rejected)" if kind == "Unresolved" else ""
        changes.append(f"{kind} rollouts{of} are {change}.")
    if (policy.failure_reward, policy.overlong_penalty_factor) != (
        base.failure_reward,
        base.overlong_penalty_factor,
    ):
        changes.append(f"Reward: {describe_policy(policy)['reward']}.")
    if policy.gate != base.gate:
        changes.append(
            f"Qualification gate {policy.gate} instead of {base.gate}: {describe_policy(policy)['gate']}."
        )
    if run.groups_per_step not in (None, control.groups_per_step):
        changes.append(f"{run.groups_per_step} groups per step instead of {control.groups_per_step}.")
    if not changes:
        return [f"Same cap policy and groups per step as the control arm {CONTROL_ARM}."]
    source = [] if policy.source == base.source else [f"Where the policy comes from: {policy.source}."]
    return [
        f"Cap policy `{run.policy_id}` instead of the control's `{control.policy_id}`.",
        *source,
        *changes,
    ]


def _pp(x: float) -> str:
    return f"{100 * x:+.1f} pp"


def _set_row(name: str, step: int, cap: int, sc: SetScore, base: SetScore | None) -> dict:
    graded = max(sc.graded, 1)
    mix = {o.value: f"{sc.outcomes[o]} ({100 * sc.outcomes[o] / graded:.1f}%)" for o in FAILURES}
    mix[Outcome.INDETERMINATE.value] = str(sc.outcomes[Outcome.INDETERMINATE])  # not in any denominator
    return {
        "name": name,
        "cap": cap,
        "shape": f"{sc.problems} × {sc.samples}",
        "accuracy": pct(sc.accuracy),
        "correct": sc.outcomes[Outcome.CORRECT],
        "graded": sc.graded,
        "mix": mix,
        "median_tokens": "n/a" if sc.median_tokens is None else f"{sc.median_tokens:g}",
        "vs_base": _pp(sc.accuracy - base.accuracy) if base and step else "",
    }


def _eval_results(run: Run, step: int) -> list[EvalResult]:
    """model-index entries: one per (set, cap) evaluated at this step; the config field keeps them distinct."""
    results = []
    for (s, cap), sets in sorted(run.scores.items()):
        for name, sc in sets.items():
            if s == step and sc.graded:
                results.append(
                    EvalResult(
                        task_type="text-generation",
                        dataset_type=name,
                        dataset_name=name,
                        dataset_config=f"cap{cap}",
                        dataset_args={"problems": sc.problems, "samples_per_problem": sc.samples},
                        metric_type="accuracy",
                        metric_value=round(sc.accuracy, 4),
                        metric_name=f"accuracy (step {step}, {cap}-token cap)",
                    )
                )
    return results


def _hub_base_model(base: str) -> str | None:
    """base_model metadata must be a Hub repo id; a local base dir is named in the text only (as TRL does)."""
    return base if re.fullmatch(r"[\w.-]+/[\w.-]+", base) and not Path(base).exists() else None


def _adapter(step_dir: Path) -> dict | None:
    """The PEFT config of a LoRA checkpoint (stepNNN/adapter_config.json), None for full weights."""
    path = step_dir / "adapter_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _card_data(
    run: Run, model_name: str, step: int | None, adapter: dict | None = None, **extra
) -> ModelCardData:
    tags = ["trl", "grpo", "capgrpo", f"arm-{run.arm}", run.policy_id, f"gate-{run.gate}"]
    tags += ["lora"] if adapter else []
    return ModelCardData(
        base_model=_hub_base_model(run.meta["base_model"]),
        library_name="peft" if adapter else "transformers",
        model_name=model_name,
        tags=tags,
        eval_results=(_eval_results(run, step) if step is not None else None) or None,
        **extra,
    )


def _render(template: str, data: ModelCardData, **context) -> ModelCard:
    # Rendered here (not with ModelCard.from_template) so that StrictUndefined catches template mistakes;
    # ModelCard() then re-parses the YAML header, which validates the metadata we wrote.
    text = _templates.get_template(template).render(card_data=data.to_yaml(), **context)
    return ModelCard(text)


def _common(run: Run) -> dict:
    return {
        "arm": run.arm,
        "arm_note": ALL_ARMS[run.arm].note if run.arm in ALL_ARMS else "",
        "policy_id": run.policy_id,
        "gate": run.gate,
        "policy": describe_policy(recorded_policy(run)),
        "changes": changes_from_control(run),
        "control_arm": CONTROL_ARM,
        "groups_per_step": run.groups_per_step,
        "num_generations": run.meta.get("num_generations"),
        "base_model": run.meta["base_model"],
        "grader_version": run.meta["grader_version"],
        "eval": run.meta["eval"],
        "seed": run.meta.get("config", {}).get("seed"),
        "recipe": run.meta.get("recipe", "<recipe.yaml>"),
        "versions": run.meta.get("versions", {}),
        "other_caps": sorted({c for _, c in run.scores} - {run.eval_cap}),
        "states": [f"state{s:03d}" for s in run.states],
        "resumable": run.resumable,
        "newest_state": max(run.resumable, default=None),
        "last_step": run.last_step,
        "citations": CITATIONS,
    }


def _resume_dir(run: Run, step: int, repo_id: str | None) -> str:
    """What to pass to --resume: the run dir resumes from its newest state, an older state needs its own dir."""
    if step in run.resumable and step != max(run.resumable):
        return f"<dir with step{step:03d}/ and state{step:03d}/>"
    return f"<local copy of {repo_id}>" if repo_id else str(run.dir)


# --- checkpoint card --------------------------------------------------------------------------------
def checkpoint_card(run_dir: Path | str, step: int, *, repo_id: str | None = None) -> ModelCard:
    """The card of `stepNNN/`; `repo_id` (set by the push) makes the loading snippets point at the Hub repo."""
    return _checkpoint_card(read_run(run_dir), step, repo_id)


def _checkpoint_card(run: Run, step: int, repo_id: str | None) -> ModelCard:
    name = f"step{step:03d}"
    if step not in run.saved:
        raise FileNotFoundError(f"{run.dir / name}: no such checkpoint directory")
    base = run.scores.get((0, run.eval_cap), {})
    here = sorted(run.scores.get((step, run.eval_cap), {}).items())
    rows = [_set_row(n, step, run.eval_cap, sc, base.get(n)) for n, sc in here]
    common = _common(run)
    other = [
        _set_row(n, step, c, sc, None)
        for c in common["other_caps"]
        for n, sc in run.scores.get((step, c), {}).items()
    ]
    ranking = run.ranking()
    rank = next((i + 1 for i, (s, _) in enumerate(ranking) if s == step), None)
    model_name = f"capgrpo-{run.arm}-{name}"
    adapter = _adapter(run.dir / name)
    return _render(
        "checkpoint.md.j2",
        _card_data(run, model_name, step, adapter),
        **common,
        adapter=adapter,
        model_name=model_name,
        step=step,
        step_dir=name,
        state_dir=f"state{step:03d}",
        rows=rows,
        other_rows=other,
        rank=rank,
        rank_set=run.rank_set,
        ranking=[(f"step{s:03d}", pct(a)) for s, a in ranking],
        evaluated_saved=[f"step{s:03d}" for s in run.saved if run.score(s, run.rank_set)],
        architecture=run.architecture(step),
        repo_id=repo_id,
        load_path=repo_id or str(run.dir / name),
        has_state=step in run.states,
        resume_dir=_resume_dir(run, step, repo_id),
        system_prompt=SYSTEM_PROMPT,
    )


def write_checkpoint_card(run_dir: Path | str, step: int, *, repo_id: str | None = None) -> Path:
    path = Path(run_dir) / f"step{step:03d}" / "README.md"
    checkpoint_card(run_dir, step, repo_id=repo_id).save(path)
    return path


# --- run card ---------------------------------------------------------------------------------------
def _comparison(run: Run, control: Path | str) -> dict:
    """This run's last evaluated step against the control's, with `make compare`'s paired statistics."""
    from analysis import compare  # imported here: it loads matplotlib, and most cards have no control

    a, b = compare.load_run(run.dir), compare.load_run(control)
    compare.check_comparable(a, b)
    step_a, step_b = a.evaluated()[-1], b.evaluated()[-1]
    ta, tb = a.table(step_a), b.table(step_b)
    tests = []
    # the held-out set leads, as in the seed card
    for name in sorted(a.sets, key=lambda n: n != run.rank_set):
        d = compare.paired_difference(ta[name], tb[name], n_resamples=N_RESAMPLES, seed=0)
        tests.append(
            {
                "set": name,
                "diff": f"{d.test.mean_diff:+.1f} pp",
                "p": format_p(d.test.p_value, d.test.method, d.test.n_resamples),
                "n": d.test.n,
            }
        )
    counts = compare.disagreements(ta[run.rank_set], tb[run.rank_set]) if run.rank_set in ta else Counter()
    disagree = [f"{ob} → {oa}: {n}" for (ob, oa), n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {
        "arm": b.arm,
        "seed": b.seed,
        "dir": os.path.relpath(b.dir, run.dir),
        "step_a": step_a,
        "step_b": step_b,
        "tests": tests,
        "disagree": disagree,
    }


def _trajectory(run: Run) -> dict:
    logp = [r["logprob_median"] for r in run.steps if r.get("logprob_median") is not None]
    gate = [(r["step"], r["gate_stat"]) for r in run.steps if r.get("gate_stat") is not None]
    evals = run.evaluated()
    lengths = [
        (s, sc.median_tokens) for s in evals if (sc := run.score(s, run.rank_set)) and sc.median_tokens
    ]
    return {
        "logprob": [f"{x:.3f}" for x in (logp[0], logp[-1], min(logp), max(logp))] if logp else None,
        "length": [(s, f"{n:g}") for s, n in (lengths[0], lengths[-1])] if len(lengths) > 1 else None,
        "gate_last": (gate[-1][0], pct(gate[-1][1])) if gate else None,
        "bound_hits": sum(bool((r.get("groups") or {}).get("bound_hit")) for r in run.steps),
    }


def _decline(run: Run) -> dict | None:
    """The rank set's peak evaluated step against the last one, paired by problem (as `make compare` does)."""
    if len([s for s in run.evaluated() if run.score(s, run.rank_set)]) < 2:
        return None
    from analysis import compare

    r = compare.load_run(run.dir)
    pd = compare.peak_decline(r, run.rank_set, r.evaluated()[-1], n_resamples=N_RESAMPLES, seed=0)
    if pd.peak_step == pd.step:
        return {"peak": pd.peak_step, "last": pd.step, "diff": None}
    t = pd.change.test
    return {
        "peak": pd.peak_step,
        "last": pd.step,
        "diff": f"{t.mean_diff:+.1f} pp",
        "p": format_p(
            pd.test.p_value, pd.test.method, pd.test.n_resamples, tails=1
        ),  # selection-aware: the peak was chosen after looking
        "n": t.n,
    }


def run_card(
    run_dir: Path | str, control: Path | str | None = None, *, repo_id: str | None = None
) -> ModelCard:
    """The run's README.md: the seed card's sections (summary, Recipe, Results, Limits, Files) for this run."""
    return _run_card(read_run(run_dir), control, repo_id)


def recorded_control(run_dir: Path | str) -> Path | None:
    """The control the existing run card was made with, so that regenerating it (after a save, before a push)
    keeps the comparison; None when there is none or that run directory is gone."""
    readme = Path(run_dir) / "README.md"
    if not readme.is_file():
        return None
    rel = ModelCard.load(readme, ignore_metadata_errors=True).data.to_dict().get(CONTROL_KEY)
    if rel is None:
        return None
    if not (Path(run_dir) / rel / "run.json").is_file():
        logger.warning("%s: its control run %s is gone; the run card drops the comparison", readme, rel)
        return None
    return Path(os.path.normpath(Path(run_dir) / rel))


def _run_card(run: Run, control: Path | str | None, repo_id: str | None) -> ModelCard:
    control = control if control is not None else recorded_control(run.dir)
    ranking = run.ranking()
    best = ranking[0][0] if ranking else None
    evals = run.evaluated()
    table_sets = sorted({n for k in run.scores.values() for n in k})
    table = [
        {
            "step": s,
            "cap": c,
            "cells": [pct(sc.accuracy) if (sc := run.score(s, n, c)) else "" for n in table_sets],
        }
        for s, c in sorted(run.scores)
    ]
    model_name = f"capgrpo-{run.arm}"
    remembered = {CONTROL_KEY: os.path.relpath(control, run.dir)} if control is not None else {}
    return _render(
        "run.md.j2",
        _card_data(run, model_name, best, **remembered),
        **_common(run),
        model_name=model_name,
        snapshot=run.meta.get("snapshot", {}),
        set_shapes=[
            f"{n} × {k} sample{'s' * (k != 1)}"
            for n, k in sorted(run.meta["eval"].get("samples", {}).items())
        ],
        table_sets=table_sets,
        table=table,
        evaluated=[f"step{s:03d}" for s in evals],
        saved=[f"step{s:03d}" for s in run.saved],
        best=None if best is None else {"dir": f"step{best:03d}", "accuracy": pct(ranking[0][1])},
        last_saved=f"step{run.saved[-1]:03d}" if run.saved else None,
        architecture=run.architecture(run.saved[-1]) if run.saved else run.meta.get("architecture", "?"),
        versus=_comparison(run, control) if control is not None else None,
        decline=_decline(run),
        trajectory=_trajectory(run),
        repo_id=repo_id,
        rank_set=run.rank_set,
    )


def write_run_card(
    run_dir: Path | str, control: Path | str | None = None, *, repo_id: str | None = None
) -> Path:
    path = Path(run_dir) / "README.md"
    run_card(run_dir, control, repo_id=repo_id).save(path)
    return path


def write_cards(
    run_dir: Path | str,
    control: Path | str | None = None,
    *,
    steps: list[int] | None = None,
    repo_id: str | None = None,
) -> list[Path]:
    """Every checkpoint card (or those of `steps`) and the run card, from one reading of the run's files."""
    run = read_run(run_dir)
    cards = [
        (run.dir / f"step{s:03d}" / "README.md", _checkpoint_card(run, s, repo_id))
        for s in steps or run.saved
    ]
    cards.append((run.dir / "README.md", _run_card(run, control, repo_id)))
    for path, card in cards:
        card.save(path)
    return [path for path, _ in cards]


# --- checkpoint hygiene and the trainer hook ----------------------------------------------------------
def scrub_checkpoint_dir(ckpt_dir: Path | str, base_dir: Path | str) -> Path:
    """Remove the base model's README.md/.gitattributes from a saved checkpoint, then write our card.

    The seed's save copied the base model dir's README.md and .gitattributes into step010/, so the
    checkpoint carried the base model's card. Any file byte-identical to one of those, and any
    .gitattributes at all, is removed; the checkpoint's own card is then written from the run's files.
    """
    ckpt_dir, base_dir = Path(ckpt_dir), Path(base_dir)
    if not (m := STEP_DIR.fullmatch(ckpt_dir.name)):
        raise ValueError(f"{ckpt_dir}: not a stepNNN checkpoint directory")
    base = [p.read_bytes() for p in (base_dir / f for f in BASE_FILES) if p.is_file()]
    sizes = {len(b) for b in base}
    for path in sorted(p for p in ckpt_dir.rglob("*") if p.is_file()):
        if path.name == ".gitattributes" or (path.stat().st_size in sizes and path.read_bytes() in base):
            logger.info("removing %s (copied from the base model %s)", path, base_dir)
            path.unlink()
    return write_checkpoint_card(ckpt_dir.parent, int(m[1]))


class CardCallback(TrainerCallback):
    """Writes the card of the checkpoint just saved (`step{global_step:03d}/`) and regenerates the run card."""

    def __init__(self, run_dir: Path):
        self.run_dir = Path(run_dir)

    def on_save(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        try:
            write_checkpoint_card(self.run_dir, state.global_step)
            write_run_card(self.run_dir)
        except Exception:  # a card is documentation: log it, keep training; `make card` regenerates later
            logger.exception("cards for %s step %d not written", self.run_dir, state.global_step)


def parse_steps(text: str | None) -> list[int] | None:
    """`10,20` → [10, 20] (the CLI and `make` form of a step list)."""
    if not text:
        return None
    try:
        return sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise ValueError(f"--steps: expected comma-separated step numbers like 10,20, got {text!r}") from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Regenerate the checkpoint cards and the run card of a run.")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--control", type=Path, help="control run (e.g. runs/S0) for the paired comparison")
    parser.add_argument("--steps", help="only these checkpoints, e.g. 10,20 (default: every stepNNN/)")
    args = parser.parse_args(argv)
    for path in write_cards(args.run_dir, args.control, steps=parse_steps(args.steps)):
        print(path)


if __name__ == "__main__":
    main()
