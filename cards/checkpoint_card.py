"""The card of a checkpoint (`stepNNN/README.md`): its evaluations, rank, how to load and resume it."""

from pathlib import Path

from huggingface_hub import ModelCard

from cards import metadata
from data.prompt import SYSTEM_PROMPT
from rewards.outcome import Outcome
from rundir.files import Run, SetScore, pct, state_name, step_dir, step_name

FAILURES = (Outcome.WRONG, Outcome.TRUNCATED, Outcome.FORMAT_REJECTED, Outcome.INDETERMINATE)


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


def _resume_dir(run: Run, step: int, repo_id: str | None) -> str:
    """What to pass to --resume: the run dir resumes from its newest state, an older state needs its own dir."""
    if step in run.resumable and step != max(run.resumable):
        return f"<dir with {step_name(step)}/ and {state_name(step)}/>"
    return f"<local copy of {repo_id}>" if repo_id else str(run.dir)


# --- checkpoint card --------------------------------------------------------------------------------
def checkpoint_card(run_dir: Path | str, step: int, *, repo_id: str | None = None) -> ModelCard:
    """The card of `stepNNN/`; `repo_id` (set by the push) makes the loading snippets point at the Hub repo."""
    return build_checkpoint_card(Run(run_dir), step, repo_id)


def build_checkpoint_card(run: Run, step: int, repo_id: str | None) -> ModelCard:
    name = step_name(step)
    if step not in run.saved:
        raise FileNotFoundError(f"{run.dir / name}: no such checkpoint directory")
    base = run.scores.get((0, run.eval_cap), {})
    here = sorted(run.scores.get((step, run.eval_cap), {}).items())
    rows = [_set_row(n, step, run.eval_cap, sc, base.get(n)) for n, sc in here]
    common = metadata.common_context(run)
    other = [
        _set_row(n, step, c, sc, None)
        for c in common["other_caps"]
        for n, sc in run.scores.get((step, c), {}).items()
    ]
    ranking = run.ranking()
    rank = next((i + 1 for i, (s, _) in enumerate(ranking) if s == step), None)
    model_name = f"capgrpo-{run.arm}-{name}"
    adapter = metadata.adapter_config(run.dir / name)
    return metadata.render(
        "checkpoint.md.j2",
        metadata.card_data(run, model_name, step, adapter),
        **common,
        adapter=adapter,
        model_name=model_name,
        step=step,
        step_dir=name,
        state_dir=state_name(step),
        rows=rows,
        other_rows=other,
        rank=rank,
        rank_set=run.rank_set,
        ranking=[(step_name(s), pct(a)) for s, a in ranking],
        evaluated_saved=[step_name(s) for s in run.saved if run.score(s, run.rank_set)],
        architecture=run.architecture(step),
        repo_id=repo_id,
        load_path=repo_id or str(run.dir / name),
        has_state=step in run.states,
        resume_dir=_resume_dir(run, step, repo_id),
        system_prompt=run.meta.get("config", {}).get("system_prompt", SYSTEM_PROMPT),
    )


def write_checkpoint_card(run_dir: Path | str, step: int, *, repo_id: str | None = None) -> Path:
    path = step_dir(run_dir, step) / "README.md"
    metadata.save_card(checkpoint_card(run_dir, step, repo_id=repo_id), path)
    return path
