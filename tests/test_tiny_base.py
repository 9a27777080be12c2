"""The tiny base model: the real architecture, a Qwen-style tokenizer, and a save/load path that round-trips."""

import hashlib
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, GenerationConfig, Qwen3_5ForConditionalGeneration

from data.prompt import SYSTEM_PROMPT, prompt_messages, render_prompt
from data.synthetic import generate_tasks
from embedded.build import (
    ARCHITECTURE,
    MANIFEST,
    BuildConfig,
    build_base,
    build_model,
    build_tokenizer,
    evaluate_base,
    is_complete,
)
from rewards.outcome import Outcome

CFG = BuildConfig()


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(CFG)


def _load(path):
    return AutoTokenizer.from_pretrained(path), Qwen3_5ForConditionalGeneration.from_pretrained(path)


def test_tokenizer_has_eos_pad_and_qwen_chat_template(tokenizer):
    assert (tokenizer.eos_token, tokenizer.pad_token) == ("<|im_end|>", "<|endoftext|>")
    assert tokenizer.eos_token_id != tokenizer.pad_token_id
    assert render_prompt(tokenizer, "Compute $1 + 1$.") == (
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nCompute $1 + 1$.<|im_end|>\n<|im_start|>assistant\n"
    )
    turn = prompt_messages("p") + [{"role": "assistant", "content": "The answer is $\\boxed{2}$."}]
    ids = tokenizer(tokenizer.apply_chat_template(turn, tokenize=False), add_special_tokens=False)[
        "input_ids"
    ]
    assert ids.count(tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3
    assert ids.count(tokenizer.eos_token_id) == 3
    text = "Ünïcode ∑ 12/34 and \\frac{1}{2}\n"  # byte level: text outside the training corpus round-trips
    assert tokenizer.decode(tokenizer(text, add_special_tokens=False)["input_ids"]) == text


def test_untrained_model_saves_and_reloads_as_the_real_architecture(tokenizer, tmp_path):
    model = build_model(CFG, tokenizer)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert (config["architectures"], config["model_type"]) == ([ARCHITECTURE], "qwen3_5")
    assert set(config["text_config"]["layer_types"]) == {"linear_attention", "full_attention"}
    assert config["text_config"]["vocab_size"] == len(tokenizer)

    loaded_tok, loaded = _load(tmp_path)
    assert type(loaded) is Qwen3_5ForConditionalGeneration
    original = model.state_dict()
    assert all(torch.equal(original[k], v) for k, v in loaded.state_dict().items())
    assert sum(p.numel() for p in loaded.model.visual.parameters()) > 0
    # AutoTokenizer rebuilds Qwen3.5's pipeline around the saved vocab: it must encode exactly like ours
    for t in generate_tasks(50, seed=11):
        text = render_prompt(tokenizer, t["problem"]) + t["solution"]
        assert loaded_tok(text)["input_ids"] == tokenizer(text)["input_ids"]


@pytest.mark.slow
def test_saved_base_reloads_with_identical_weights_and_vision_tower(tiny_base):
    tok, model = _load(tiny_base)
    assert type(model) is Qwen3_5ForConditionalGeneration
    on_disk = load_file(tiny_base / "model.safetensors")
    assert set(on_disk) == set(model.state_dict())
    assert all(torch.equal(on_disk[k], v) for k, v in model.state_dict().items())
    assert any(k.startswith("model.visual.") for k in on_disk)
    gen = GenerationConfig.from_pretrained(tiny_base)
    assert (gen.eos_token_id, gen.pad_token_id) == (tok.eos_token_id, tok.pad_token_id)
    assert json.loads((tiny_base / MANIFEST).read_text())["architecture"] == ARCHITECTURE


@pytest.mark.slow
def test_saved_base_generates_and_stops_at_eos(tiny_base):
    tok, model = _load(tiny_base)
    prompts = [render_prompt(tok, t["problem"]) for t in generate_tasks(3, seed=2)]
    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(0)
    out = model.generate(**enc, max_new_tokens=24, do_sample=True)
    completions = out[:, enc["input_ids"].shape[1] :].tolist()
    assert len(completions) == 3 and all(0 < len(c) <= 24 for c in completions)
    for row in completions:  # after EOS only padding follows
        if tok.eos_token_id in row:
            assert set(row[row.index(tok.eos_token_id) + 1 :]) <= {tok.pad_token_id}


@pytest.mark.slow
def test_base_report_counts_every_sample(tiny_base):
    tok, model = _load(tiny_base)
    tasks = generate_tasks(3, seed=4)
    report = evaluate_base(model, tok, tasks, cap=12, samples=2, seed=0)
    assert sum(report["outcomes"].values()) == 6
    assert set(report["outcomes"]) == {o.value for o in Outcome}
    assert report["pass@1"] == report["outcomes"]["correct"] / (6 - report["outcomes"]["indeterminate"])
    assert 0.0 <= report["gate_v1_share"] <= report["gate_v2_share"] <= 1.0


@pytest.mark.slow
def test_same_seed_same_weights(tmp_path):
    short = {"sft_steps": 3, "sft_batch_size": 4, "sft_pool_size": 48}
    digests = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        cfg = BuildConfig(seed=seed, **short)
        build_base(tmp_path / name, cfg)
        assert is_complete(tmp_path / name, cfg) and not is_complete(tmp_path / name, BuildConfig(seed=seed))
        digests.append(hashlib.sha256((tmp_path / name / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1] != digests[2]


@pytest.mark.slow
def test_trl_grpo_trainer_loads_and_steps_with_the_saved_base(tiny_base, tmp_path):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    tasks = generate_tasks(4, seed=3)
    data = Dataset.from_list(
        [{"prompt": prompt_messages(t["problem"]), "answer": t["answer"]} for t in tasks]
    )

    def contains_answer(completions, answer, **_):
        return [float(a in c[0]["content"]) for c, a in zip(completions, answer)]

    args = GRPOConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        max_steps=1,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
    )
    # No image processor is saved, so the tokenizer is passed (GRPOTrainer would call AutoProcessor)
    trainer = GRPOTrainer(
        model=str(tiny_base),
        reward_funcs=contains_answer,
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(tiny_base),
    )
    assert type(trainer.model) is Qwen3_5ForConditionalGeneration
    assert trainer.train().global_step == 1


def test_sft_pool_seeds_every_outcome_the_base_must_show():
    """The warm-start styles give the base unboxed answers, re-check loops that outrun the cap, miscopied
    answers and plain solutions, in about the configured shares, each graded as intended."""
    from embedded.build import EMBEDDED_CAP, RECHECK, sft_pool
    from rewards.grader import grade

    cfg = BuildConfig(sft_pool_size=600)
    pool = sft_pool(cfg, exclude_problems=set())
    tok = build_tokenizer(BuildConfig(tokenizer_corpus_size=300))
    styles = {"unboxed": 0, "slip": 0, "recheck": 0, "plain": 0}
    over_cap = 0
    for t in pool:
        n_tokens = len(tok(t["solution"], add_special_tokens=False)["input_ids"]) + 1
        truncated = n_tokens > EMBEDDED_CAP
        text = tok.decode(tok(t["solution"])["input_ids"][:EMBEDDED_CAP]) if truncated else t["solution"]
        outcome = grade(text, t["answer"], truncated=truncated).outcome
        if "\\boxed" not in t["solution"]:
            styles["unboxed"] += 1
            assert outcome is Outcome.FORMAT_REJECTED, t
        elif RECHECK in t["solution"]:
            styles["recheck"] += 1
            over_cap += truncated
            assert outcome is (Outcome.TRUNCATED if truncated else Outcome.CORRECT), t
        elif outcome is Outcome.WRONG:
            styles["slip"] += 1
        else:
            styles["plain"] += 1
            assert outcome is (Outcome.TRUNCATED if truncated else Outcome.CORRECT), t  # <1% run over
    n = len(pool)
    assert abs(styles["unboxed"] / n - cfg.unboxed_share) < 0.05, styles
    assert abs(styles["slip"] / n - cfg.slip_share) < 0.05, styles
    assert abs(styles["recheck"] / n - cfg.recheck_share) < 0.05, styles
    assert 0.2 < over_cap / styles["recheck"] < 0.9, (over_cap, styles)  # some loops finish, some do not


def test_shipped_snapshot_is_what_the_generator_writes(embedded_snapshot):
    """embedded/synthetic.tasks.json (what the recipes read) is exactly the embedded snapshot rebuilt here."""
    from embedded.build import SHIPPED_SNAPSHOT

    shipped = Path(__file__).resolve().parent.parent / SHIPPED_SNAPSHOT
    assert shipped.read_bytes() == embedded_snapshot.read_bytes(), shipped


def test_embedded_recipe_repeats_the_builder_constants():
    """configs/embedded.yaml hard-codes what embedded/build.py builds with: the cap the base's failure modes
    were seeded against, the eval-set sizes, the shipped base and snapshot (sha256 pinned)."""
    import yaml

    from embedded import build

    repo = Path(__file__).resolve().parent.parent
    recipe = yaml.safe_load((repo / "configs/embedded.yaml").read_text())
    assert recipe["max_completion_length"] == build.EMBEDDED_CAP
    assert (recipe["heldout_size"], recipe["fixed_size"]) == (
        build.EMBEDDED_HELDOUT_SIZE,
        build.EMBEDDED_FIXED_SIZE,
    )
    assert recipe.get("eval_set_seed", 0) == build.EMBEDDED_EVAL_SETS_SEED  # CapGRPOConfig's default is 0
    assert Path(recipe["model_name_or_path"]) == build.SHIPPED_BASE
    assert Path(recipe["snapshot_path"]) == build.SHIPPED_SNAPSHOT
    sha = hashlib.sha256((repo / build.SHIPPED_SNAPSHOT).read_bytes()).hexdigest()
    assert recipe["snapshot_sha256"] == sha
    assert "arm" not in recipe and "output_dir" not in recipe  # both come from the command line


@pytest.mark.slow
def test_shipped_base_answers_some_problems_and_fails_in_every_way(tiny_base):
    """The shipped base is a real starting point for GRPO (issue targets, on a sample of held-out problems):
    it answers a share of the problems, and is truncated, format-rejected and completed-wrong on others."""
    from embedded.build import EMBEDDED_CAP, embedded_eval_sets, embedded_tasks

    tok, model = _load(tiny_base)
    tasks = embedded_tasks()
    by_id = {t["id"]: t for t in tasks}
    heldout = [by_id[i] for i in embedded_eval_sets(tasks).heldout[:40]]
    report = evaluate_base(model, tok, heldout, cap=EMBEDDED_CAP, samples=4, seed=0)
    share = {k: v / 160 for k, v in report["outcomes"].items()}
    assert 0.25 <= report["pass@1"] <= 0.7, report
    assert share["truncated"] >= 0.04 and share["format_rejected"] >= 0.04 and share["wrong"] >= 0.05, report
