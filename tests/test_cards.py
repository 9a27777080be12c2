"""Generated model cards: metadata parsed back with huggingface_hub, numbers checked against the eval rows."""

import json
import random
import re
import statistics
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard

from cards.card import main
from cards.checkpoint_card import write_checkpoint_card
from cards.cleanup import scrub_checkpoint_dir
from cards.policy_text import recorded_policy
from cards.run_card import write_run_card
from policy.arms import ARMS, GATES, TREATMENT_TEXT, Gate, Treatment, resolve_arm
from rewards.outcome import Outcome
from rundir.files import Run
from rundir.state import save_state
from rundir.step import write_manifest

OUTCOMES = ["correct", "wrong", "truncated", "format_rejected", "indeterminate"]
FIXED = [f"math-fixed{i:07d}" for i in range(4)]
HELDOUT = [f"math-held{i:08d}" for i in range(40)]
ARCH = "Qwen3_5ForConditionalGeneration"


def _eval_rows(rng: random.Random, step: int, cap: int, skill: float) -> list[dict]:
    rows = []
    for name, ids, samples in (("fixed32", FIXED, 2), ("heldout300", HELDOUT, 1)):
        for t, task in enumerate(ids):
            for i in range(samples):
                outcome = "correct" if rng.random() < skill else rng.choice(OUTCOMES[1:])
                rows.append(
                    {"step": step, "set": name, "task_id": task, "sample": i, "seed": 1000 * t + i,
                     "outcome": outcome, "answer": "1", "reference": "1",
                     "completion_tokens": rng.randint(10, cap), "cap": cap, "completion": "..."}
                )  # fmt: skip
    return rows


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(
    root: Path,
    arm: str = "S2",
    *,
    seed: int = 0,
    evals: dict[int, float] | None = None,
    saved=(2, 4, 5, 6),
    states=(5, 6),
    base_model: str | None = None,
) -> Path:
    """A small fake run directory in the CONTRACTS.md format; weights are a stub (cards never load them)."""
    rng = random.Random(seed)
    run = root / arm
    (run / "results").mkdir(parents=True)
    policy = ARMS[arm].policy
    meta = {
        "arm": arm, "policy_id": policy.id, "gate": policy.gate, "groups_per_step": 32, "num_generations": 8,
        "grader_version": "capgrpo-grader-v1+math-verify-0.9.0",
        "snapshot": {"path": "artifacts/synthetic.tasks.json", "sha256": "ab" * 32},
        "base_model": base_model or str(root / "tiny-base"), "architecture": ARCH,
        "eval_sets": {"fixed32": FIXED, "heldout300": HELDOUT},
        "eval": {"cap": 64, "temperature": 1.0, "top_p": 1.0, "seed": 1234,
                 "samples": {"fixed32": 2, "heldout300": 1}},
        "config": {"seed": 42, "learning_rate": 1e-6},
        "versions": {"torch": "2.13.0", "transformers": "5.24.0", "trl": "1.16.0"},
        "best_step": {"set": "heldout300", "step": 4, "accuracy": 0.5},
    }  # fmt: skip
    (run / "run.json").write_text(json.dumps(meta))
    steps = [
        {"step": s, "arm": arm, "policy_id": policy.id, "gate": policy.gate, "loss": 0.01,
         "groups": {"sampled": 40, "qualified": 32, "trained": 32, "rounds": 2, "bound_hit": s == 3},
         "gate_stat": 0.05 * s, "logprob_median": -0.25 + 0.01 * s,
         "completion_length": {"median": 30, "mean": 31.0, "max": 64}}
        for s in range(1, 7)
    ]  # fmt: skip
    _write_jsonl(run / "results" / "steps.jsonl", steps)
    for step, skill in (evals or {0: 0.3, 2: 0.5, 4: 0.85, 6: 0.45}).items():
        _write_jsonl(run / "results" / f"eval_step{step:03d}.jsonl", _eval_rows(rng, step, 64, skill))
    _write_jsonl(run / "results" / "eval_step004_cap128.jsonl", _eval_rows(rng, 4, 128, 0.8))
    for s in saved:
        d = run / f"step{s:03d}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps({"architectures": [ARCH], "model_type": "qwen3_5"}))
        (d / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
        write_manifest(d)  # as save_weights does: a push verifies it
    for s in states:  # real (tiny) states: a push verifies them
        save_state(run / f"state{s:03d}", tensors={"w": torch.zeros(2)}, meta={"step": s})
    return run


# --- independent expectations, from the rows alone --------------------------------------------------
def rows_of(run: Path, step: int, cap: str = "") -> list[dict]:
    path = run / "results" / f"eval_step{step:03d}{cap}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def accuracy(rows: list[dict], name: str) -> float:
    graded = [r for r in rows if r["set"] == name and r["outcome"] != "indeterminate"]
    return sum(r["outcome"] == "correct" for r in graded) / len(graded)


def metrics(card: ModelCard) -> dict[tuple[str, str], float]:
    return {(e.dataset_name, e.dataset_config): e.metric_value for e in card.data.eval_results}


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path)


def test_checkpoint_card_metadata_and_numbers_match_the_eval_rows(run):
    card = ModelCard.load(write_checkpoint_card(run, 4))
    rows = rows_of(run, 4)
    assert card.data.library_name == "transformers"
    assert {"trl", "grpo", "capgrpo", "arm-S2", ARMS["S2"].policy_id, "gate-v1"} <= set(card.data.tags)
    assert card.data.base_model is None  # a local base dir is no Hub id
    assert {e.task_type for e in card.data.eval_results} == {"text-generation"}
    assert {e.metric_type for e in card.data.eval_results} == {"accuracy"}
    assert metrics(card) == {
        ("fixed32", "cap64"): round(accuracy(rows, "fixed32"), 4),
        ("heldout300", "cap64"): round(accuracy(rows, "heldout300"), 4),
        ("fixed32", "cap128"): round(accuracy(rows_of(run, 4, "_cap128"), "fixed32"), 4),
        ("heldout300", "cap128"): round(accuracy(rows_of(run, 4, "_cap128"), "heldout300"), 4),
    }
    held = [r for r in rows if r["set"] == "heldout300"]
    counts = Counter(r["outcome"] for r in held)
    graded = len(held) - counts["indeterminate"]
    acc, base = accuracy(rows, "heldout300"), accuracy(rows_of(run, 0), "heldout300")
    mix = " | ".join(
        f"{counts[o]} ({100 * counts[o] / graded:.1f}%)" for o in ("wrong", "truncated", "format_rejected")
    )
    tokens = statistics.median(r["completion_tokens"] for r in held)
    row = (
        f"| heldout300 | 40 × 1 | **{100 * acc:.1f}%** | {counts['correct']} / {graded} | "
        f"{100 * (acc - base):+.1f} pp | {mix} | {counts['indeterminate']} | {tokens:g} |"
    )
    assert row in card.text


def test_a_hub_base_model_goes_into_the_metadata(tmp_path):
    run = make_run(tmp_path, base_model="XiaomiMiMo/MiMo-7B-RL")
    assert ModelCard.load(write_checkpoint_card(run, 4)).data.base_model == "XiaomiMiMo/MiMo-7B-RL"


def test_checkpoint_rank_follows_heldout_accuracy(run):
    acc = {s: accuracy(rows_of(run, s), "heldout300") for s in (2, 4, 6)}  # step005 saved, not evaluated
    order = sorted(acc, key=lambda s: (-acc[s], s))
    for place, step in enumerate(order, 1):
        text = ModelCard.load(write_checkpoint_card(run, step)).text
        if place == 1:
            assert "**This is the best held-out checkpoint of the run**" in text
        else:
            assert f"ranks {place} of 3 evaluated saved" in text
            assert f"best: `step{order[0]:03d}/`, {100 * acc[order[0]]:.1f}%" in text


def test_unevaluated_checkpoint_says_so_and_points_at_its_state(run):
    card = ModelCard.load(write_checkpoint_card(run, 5))
    assert card.data.eval_results is None and "model-index" not in card.content
    assert "Step 5 was not evaluated (there is no `results/eval_step005.jsonl`)" in card.text
    assert "`state005/` holds the optimizer state" in card.text
    older = "<dir with step005/ and state005/>"  # state006/ is newer, and --resume takes the newest
    assert f"make train ARM=S2 RECIPE=<recipe.yaml> RESUME={older}" in card.text
    assert f"python -m trainer.train --config <recipe.yaml> --resume {older}" in card.text
    newest = ModelCard.load(write_checkpoint_card(run, 6)).text
    assert "It is the newest state of the run, so:" in newest
    assert f"--resume {run}\n" in newest


def test_checkpoint_without_state_names_the_resumable_steps(run):
    text = ModelCard.load(write_checkpoint_card(run, 2)).text
    assert "there is no `state002/`" in text
    assert "Exact resume is possible from steps 5, 6" in text
    assert "the run directory resumes from step 6" in text and f"RESUME={run}\n" in text


def test_checkpoint_loading_uses_the_architecture_class_and_the_hub_subfolder(run):
    text = ModelCard.load(write_checkpoint_card(run, 4, repo_id="org/capgrpo-s2")).text
    assert f'{ARCH}.from_pretrained("org/capgrpo-s2", subfolder="step004"' in text
    assert 'snapshot_download("org/capgrpo-s2", allow_patterns=["step004/*"])' in text
    local = ModelCard.load(write_checkpoint_card(run, 4)).text
    assert f'vllm.LLM(model="{run / "step004"}"' in local


@pytest.mark.parametrize(
    ("arm", "expected"),
    [
        ("S0", ["This is the control arm"]),
        ("S2", ["active (reward 0) in the loss instead of masked"]),
        (
            "S4",
            [
                "active (reward 0) in the loss instead of masked",
                "Qualification gate v2 instead of v1: a group trains iff it has at least one correct and at least "
                "one failure of any kind (wrong, truncated or format-rejected).",
            ],
        ),
    ],
)
def test_changes_from_the_control_follow_the_policy_table(tmp_path, arm, expected):
    text = ModelCard.load(write_checkpoint_card(make_run(tmp_path, arm), 4)).text
    for phrase in expected:
        assert phrase in text
    if arm == "S2":
        assert "Qualification gate" not in text


def _recipe_arm(run: Path, name: str, spec: dict) -> None:
    """Record `run` as trained under arm `name` of its recipe's `arms:` (as run.json stores a recipe's arm)."""
    meta = json.loads((run / "run.json").read_text())
    meta["arm"], meta["config"]["arms"] = name, {name: spec}
    policy = resolve_arm(name, {name: spec}).policy
    meta["policy_id"], meta["gate"] = policy.id, policy.gate
    (run / "run.json").write_text(json.dumps(meta))


def test_a_gate_is_declared_once_and_the_cards_take_its_words_from_it(tmp_path, monkeypatch):
    """A new gate is one entry of policy.arms.GATES: an arm may then name it, a group qualifies by its rule
    and the cards print its own words; nothing in cards/ knows it."""
    spec = {
        "policy_id": ARMS["S2"].policy_id,
        "groups_per_step": 32,
        "policy_params": {"gate": "any-correct"},
    }
    with pytest.raises(ValueError, match="unknown gate 'any-correct'"):
        _ = resolve_arm("S2-ANY", {"S2-ANY": spec}).policy  # the policy is built, and checked, on use
    words = "a group trains iff it has at least one correct answer"
    monkeypatch.setitem(GATES, "any-correct", Gate("any-correct", words, lambda s: Outcome.CORRECT in s))
    run = make_run(tmp_path, "S2")
    _recipe_arm(run, "S2-ANY", spec)
    policy = recorded_policy(Run(run))
    assert policy.qualifies([Outcome.CORRECT] * 4) and not policy.qualifies([Outcome.WRONG] * 4)
    checkpoint = ModelCard.load(write_checkpoint_card(run, 4)).text
    assert f"| gate | any-correct: {words} |" in checkpoint
    assert f"Qualification gate any-correct instead of v1: {words}." in checkpoint
    assert f"gate any-correct:\n{words}." in ModelCard.load(write_run_card(run)).text


def test_a_named_treatment_is_described_in_the_words_declared_with_it(tmp_path, monkeypatch):
    """A treatment with words in policy.arms.TREATMENT_TEXT is described in them; any other flag by flag."""
    counted = {"loss": False, "normaliser": True, "baseline": True}
    spec = {"policy_id": "trl-mask-truncated", "groups_per_step": 32, "policy_params": {"truncated": counted}}
    run = make_run(tmp_path, "S2")
    _recipe_arm(run, "K", spec)
    flags = "in the loss: False, in the normaliser: True, in the baseline: True"
    assert f"truncated: {flags}" in ModelCard.load(write_run_card(run)).text
    words = "masked from the loss but counted in the normaliser (reward {reward:g} in the baseline)"
    monkeypatch.setitem(TREATMENT_TEXT, Treatment(**counted), words)
    text = ModelCard.load(write_run_card(run)).text
    assert f"truncated: {words.format(reward=0)}" in text and flags not in text


@pytest.mark.parametrize("arm", sorted(ARMS))
def test_cards_cite_a_source_their_reader_can_open(tmp_path, arm):
    """The seed's policies come from its experiment card, restated in docs/behaviour.md: the team's SPEC.md is
    in no clone and on no Hub repo, so a card never cites it."""
    run = make_run(tmp_path, arm)
    for text in (
        ModelCard.load(write_run_card(run)).text,
        ModelCard.load(write_checkpoint_card(run, 4)).text,
    ):
        assert "SPEC" not in text
        assert "sn120-exp019-S2" in text and "docs/behaviour.md" in text
    assert (Path(__file__).parent.parent / "docs" / "behaviour.md").is_file()


def test_run_card_sections_and_best_checkpoint(run):
    card = ModelCard.load(write_run_card(run))
    acc = {s: accuracy(rows_of(run, s), "heldout300") for s in (2, 4, 6)}
    best = max(acc, key=lambda s: (acc[s], -s))
    for section in (
        "## Recipe",
        "## Results (64 cap; fixed32 × 2 samples, heldout300 × 1 sample",
        "## Limits",
    ):
        assert section in card.text
    assert f"Best held-out checkpoint: `step{best:03d}/`, heldout300 {100 * acc[best]:.1f}%" in card.text
    assert "`step002/`, `step004/`, `step005/`, `step006/`" in card.text
    assert "`state005/`, `state006/`" in card.text
    assert "1 step(s) hit the sampling-round bound" in card.text
    assert metrics(card)[("heldout300", "cap64")] == round(acc[best], 4)


def paired_heldout(rows_a: list[dict], rows_b: list[dict]) -> tuple[list[float], Counter]:
    """heldout300 A − B per problem in pp (one sample each; indeterminate in either drops it) and B → A changes."""
    b = {r["task_id"]: r["outcome"] for r in rows_b if r["set"] == "heldout300"}
    pairs = [(b[r["task_id"]], r["outcome"]) for r in rows_a if r["set"] == "heldout300"]
    diffs = [
        100.0 * ((oa == "correct") - (ob == "correct")) for ob, oa in pairs if "indeterminate" not in (ob, oa)
    ]
    return diffs, Counter((ob, oa) for ob, oa in pairs if ob != oa)


def test_run_card_against_a_control_reports_paired_differences(tmp_path):
    from analysis.stats import sign_flip_test

    s2 = make_run(tmp_path / "a", "S2", seed=1)
    s0 = make_run(tmp_path / "b", "S0", seed=2, evals={0: 0.3, 3: 0.4})
    text = ModelCard.load(write_run_card(s2, control=s0)).text
    diffs, changes = paired_heldout(rows_of(s2, 6), rows_of(s0, 3))
    expected = sign_flip_test(diffs, n_resamples=100_000, seed=0)
    line = re.search(
        r"S2 \(step 6\) − S0 \(step 3\): heldout300 ([+-][\d.]+) pp \(p=([\d.e-]+), n=(\d+)", text
    )
    assert line, text
    assert float(line[1]) == pytest.approx(expected.mean_diff, abs=0.05)
    assert int(line[3]) == expected.n
    assert float(line[2]) == pytest.approx(expected.p_value, rel=0.05)
    assert "S2 (step 6) − S0 (step 3): fixed32" in text
    assert f"truncated → correct: {changes['truncated', 'correct']}" in text
    # the card remembers its control, so regenerating it (after a save, before a push) keeps the comparison
    again = ModelCard.load(write_run_card(s2))
    assert again.data.capgrpo_control == "../../b/S0" and again.text == text


def test_run_card_reports_the_decline_from_the_peak(run):
    acc = {s: accuracy(rows_of(run, s), "heldout300") for s in (0, 2, 4, 6)}
    peak = max(acc, key=lambda s: (acc[s], -s))
    assert peak != 6  # the fixture's skills rise to step 4, then fall
    diffs, _ = paired_heldout(rows_of(run, 6), rows_of(run, peak))
    mean = sum(diffs) / len(diffs)
    text = ModelCard.load(write_run_card(run)).text
    assert f"heldout300 changes from its step-{peak} peak to step 6 by {mean:+.1f} pp" in text
    assert f"n={len(diffs)}, paired by problem" in text


def test_base_model_readme_and_gitattributes_never_land_in_a_checkpoint(run, tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "README.md").write_text("---\nlicense: mit\n---\n# The base model's own card\n")
    (base / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    ckpt = run / "step004"
    for name in ("README.md", ".gitattributes"):  # what the seed's save routine did
        (ckpt / name).write_bytes((base / name).read_bytes())
    (ckpt / "README.copy.md").write_bytes((base / "README.md").read_bytes())
    scrub_checkpoint_dir(ckpt, base)
    assert not (ckpt / ".gitattributes").exists() and not (ckpt / "README.copy.md").exists()
    card = ModelCard.load(ckpt / "README.md")
    assert "The base model's own card" not in card.text and card.data.license is None
    assert "# capgrpo-S2-step004" in card.text
    assert {p.name for p in ckpt.iterdir()} == {
        "README.md",
        "config.json",
        "model.safetensors",
        "manifest.json",
    }


def test_cli_regenerates_chosen_cards_and_rejects_bad_input(run, capsys):
    main([str(run), "--steps", "2,4"])
    assert (run / "step002" / "README.md").is_file() and (run / "step004" / "README.md").is_file()
    assert not (run / "step006" / "README.md").exists() and (run / "README.md").is_file()
    for argv, says in (
        (["--steps", "3"], "step003: no such checkpoint directory"),
        ([], r"eval_step002\.jsonl:1: missing field"),
    ):
        if not argv:
            (run / "results" / "eval_step002.jsonl").write_text('{"step": 2, "set": "fixed32"}\n')
        with pytest.raises(SystemExit) as exit_:  # one line, exit 1 (issue 49: no traceback)
            main([str(run), *argv])
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 1 and len(err) == 1 and re.search(says, err[0]), err


def test_cards_import_neither_the_trainer_nor_torch_training_code():
    """The arrow runs one way: trainer writes cards (cards.card), cards read policy/ and rundir/ only."""
    code = (
        "import sys, cards.card; print(sorted({m.split('.')[0] for m in sys.modules} & {'trainer', 'trl'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_run_card_gives_pass_and_maj_at_k_of_sets_with_several_samples(tmp_path):
    """fixed32 has 2 samples per problem here: pass@1 (= its accuracy, every problem has 2 graded samples),
    pass@2 and maj@2 with intervals; heldout300 (1 sample) gets none."""
    from rundir.files import Run, pct

    run = make_run(tmp_path, "S2")
    r = Run(run)
    last = r.evaluated()[-1]
    text = ModelCard.load(write_run_card(run)).text
    acc = r.score(last, "fixed32")
    assert acc.outcomes["indeterminate"] == 0
    line = next(x for x in text.splitlines() if x.startswith(f"- fixed32 at step {last}: "))
    assert f"pass@1 {pct(acc.accuracy)} [" in line and ", pass@2 " in line and ", maj@2 " in line
    assert "heldout300 at step" not in text
