"""What every card shares: the run as the cards read it, the Hub metadata (base_model, library_name, tags,
model-index, framework versions, BibTeX citations, following TRL's conventions) and the rendering."""

import json
import re
from pathlib import Path

import jinja2
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from cards.policy_text import CONTROL_ARM, changes_from_control, describe_policy, recorded_policy
from data.atomic import write_atomic
from policy.arms import ALL_ARMS
from rundir.files import Run, state_name

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

TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    undefined=jinja2.StrictUndefined,  # a missing value is a bug in this module, not an empty cell
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)


def eval_results(run: Run, step: int) -> list[EvalResult]:
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


def adapter_config(step_dir: Path) -> dict | None:
    """The PEFT config of a LoRA checkpoint (stepNNN/adapter_config.json), None for full weights."""
    path = step_dir / "adapter_config.json"
    return json.loads(path.read_text()) if path.is_file() else None


def card_data(
    run: Run, model_name: str, step: int | None, adapter: dict | None = None, **extra
) -> ModelCardData:
    tags = ["trl", "grpo", "capgrpo", f"arm-{run.arm}", run.policy_id, f"gate-{run.gate}"]
    tags += ["lora"] if adapter else []
    return ModelCardData(
        base_model=_hub_base_model(run.base_model),
        library_name="peft" if adapter else "transformers",
        model_name=model_name,
        tags=tags,
        eval_results=(eval_results(run, step) if step is not None else None) or None,
        **extra,
    )


def render(template: str, data: ModelCardData, **context) -> ModelCard:
    # Rendered here (not with ModelCard.from_template) so that StrictUndefined catches template mistakes;
    # ModelCard() then re-parses the YAML header, which validates the metadata we wrote.
    text = TEMPLATES.get_template(template).render(card_data=data.to_yaml(), **context)
    return ModelCard(text)


def save_card(card: ModelCard, path: Path) -> Path:
    """Atomically (ModelCard.save truncates the file first: a full disk left README.md at 0 bytes), with the
    bytes ModelCard.save writes."""
    return write_atomic(path, str(card).encode("utf-8"))


def common_context(run: Run) -> dict:
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
        "base_model": run.base_model,
        "grader_version": run.meta["grader_version"],
        "eval": run.meta["eval"],
        "seed": run.meta.get("config", {}).get("seed"),
        "recipe": run.meta.get("recipe", "<recipe.yaml>"),
        "versions": run.meta.get("versions", {}),
        "other_caps": sorted({c for _, c in run.scores} - {run.eval_cap}),
        "states": [state_name(s) for s in run.states],
        "resumable": run.resumable,
        "newest_state": max(run.resumable, default=None),
        "last_step": run.last_step,
        "citations": CITATIONS,
    }
