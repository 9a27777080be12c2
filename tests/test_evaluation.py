"""Fixed-seed evaluation: seeds, reproducible rows, RNG isolation, summaries, files, callback, standalone."""

import hashlib
import json
import os
import sys
import types
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers  # noqa: E402
from transformers import (  # noqa: E402
    PreTrainedTokenizerFast,
    Qwen3_5ForConditionalGeneration,
    TrainerControl,
    TrainerState,
)

from data.eval_sets import FIXED, HELDOUT  # noqa: E402
from data.snapshot import snapshot_sha256, write_snapshot  # noqa: E402
from embedded.build import qwen35_config  # noqa: E402
from rewards.outcome import Outcome  # noqa: E402
from rundir.files import ROW_FIELDS, eval_path, summarize, write_eval  # noqa: E402
from rundir.step import write_manifest  # noqa: E402
from trainer.eval_callback import EvalCallback  # noqa: E402
from trainer.eval_checkpoints import load_checkpoint, main  # noqa: E402
from trainer.evaluation import EvalSpec, log_metrics, run_eval, sample_seed  # noqa: E402

SPECIALS = (
    "<|endoftext|> <|im_start|> <|im_end|> <|vision_start|> <|vision_end|> <|image_pad|> <|video_pad|>"
).split()
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPEC = EvalSpec(cap=16, temperature=1.0, top_p=0.95, seed=1234, samples={FIXED: 3, HELDOUT: 1}, batch_size=4)
TASKS = [{"id": f"task-{i:02d}", "problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(1, 9)]
TASKS_BY_SET = {FIXED: TASKS[:3], HELDOUT: TASKS[3:]}  # 9 + 5 samples: uneven last batches


def _tokenizer() -> PreTrainedTokenizerFast:
    """Byte-level, one token per character (no merges), so that it reloads as Qwen3_5Tokenizer unchanged.

    EOS <|im_end|>, pad <|endoftext|>; the alphabet is printable ASCII plus space and newline, small enough
    that a random model ends some completions within a few tokens.
    """
    byte_level = {10: "\u010a", 32: "\u0120"} | {b: chr(b) for b in range(33, 127)}  # GPT-2's byte->unicode
    vocab = {tok: i for i, tok in enumerate(SPECIALS + [byte_level[b] for b in sorted(byte_level)])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _model(tok, seed: int = 0) -> Qwen3_5ForConditionalGeneration:
    """Tiny random model of the real architecture: one linear-attention and one full-attention layer."""
    text = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        max_position_embeddings=512,
    )
    config = qwen35_config(tok, text)
    torch.manual_seed(seed)
    return Qwen3_5ForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def tok():
    return _tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return _model(tok)


@pytest.fixture(scope="module")
def rows(model, tok):
    return run_eval(model, tok, TASKS_BY_SET, SPEC, step=5)


def test_sample_seed_is_sha256_of_eval_seed_task_and_sample():
    expected = (
        int.from_bytes(hashlib.sha256(b"capgrpo-eval:1234:math-0123456789ab:3").digest()[:8], "big") >> 1
    )
    assert sample_seed(1234, "math-0123456789ab", 3) == expected
    grid = {sample_seed(s, t, i) for s in (1, 2) for t in ("a", "b", "ab") for i in range(8)}
    assert len(grid) == 2 * 3 * 8
    assert all(0 <= s < 2**63 for s in grid)


def test_rows_follow_the_contract(rows):
    assert [(r["set"], r["task_id"], r["sample"]) for r in rows] == sorted(
        (name, t["id"], i)
        for name, tasks in TASKS_BY_SET.items()
        for t in tasks
        for i in range(SPEC.samples[name])
    )
    by_id = {t["id"]: t for t in TASKS}
    for r in rows:
        assert tuple(r) == ROW_FIELDS
        assert (r["step"], r["cap"]) == (5, SPEC.cap)
        assert r["seed"] == sample_seed(SPEC.seed, r["task_id"], r["sample"])
        assert r["reference"] == by_id[r["task_id"]]["answer"]
        assert r["outcome"] in {o.value for o in Outcome}
        assert 1 <= r["completion_tokens"] <= SPEC.cap
        if r["outcome"] == Outcome.TRUNCATED:  # no EOS: the whole cap was generated
            assert r["completion_tokens"] == SPEC.cap
        assert "<|im_end|>" not in r["completion"]
    # a near-uniform random model over ~100 tokens ends some completions within 16 tokens, not all
    outcomes = {r["outcome"] for r in rows}
    assert Outcome.TRUNCATED in outcomes and outcomes - {Outcome.TRUNCATED}


def test_consecutive_evaluations_without_update_are_identical(model, tok, rows):
    assert run_eval(model, tok, TASKS_BY_SET, SPEC, step=5) == rows


def test_same_weights_give_same_rows_whatever_the_task_order(model, tok, rows):
    twin = _model(tok, seed=99)
    twin.load_state_dict(model.state_dict())
    shuffled = {HELDOUT: TASKS_BY_SET[HELDOUT][::-1], FIXED: TASKS_BY_SET[FIXED][::-1]}
    assert run_eval(twin, tok, shuffled, SPEC, step=5) == rows
    other = _model(tok, seed=1)  # other weights: other completions, same seeds
    changed = run_eval(other, tok, TASKS_BY_SET, SPEC, step=5)
    assert [r["seed"] for r in changed] == [r["seed"] for r in rows]
    assert [r["completion"] for r in changed] != [r["completion"] for r in rows]


class _FakeVLLM:
    """Stands in for vllm.LLM: each request's tokens are a function of its own seed, as vLLM's are."""

    def __init__(self, eos_id: int, keep_eos: bool):
        self.eos_id, self.keep_eos, self.params = eos_id, keep_eos, []

    def generate(self, prompts, params, use_tqdm):
        assert len(prompts) == len(params) and all("prompt_token_ids" in p for p in prompts)
        self.params += params
        outputs = []
        for p in params:
            n = p.kwargs["seed"] % (p.kwargs["max_tokens"] + 4)  # beyond the cap: runs out of tokens
            ended = n < p.kwargs["max_tokens"]
            tokens = [40 + (p.kwargs["seed"] + k) % 50 for k in range(min(n, p.kwargs["max_tokens"]))]
            tokens += [self.eos_id] if ended and self.keep_eos else []
            completion = types.SimpleNamespace(token_ids=tokens, finish_reason="stop" if ended else "length")
            outputs.append(types.SimpleNamespace(outputs=[completion]))
        return outputs


@pytest.mark.parametrize("keep_eos", [True, False])
def test_vllm_backend_sends_one_seed_per_sample(monkeypatch, tok, keep_eos):
    sampling_params = types.SimpleNamespace
    monkeypatch.setitem(
        sys.modules, "vllm", types.SimpleNamespace(SamplingParams=lambda **kw: sampling_params(kwargs=kw))
    )
    llm = _FakeVLLM(tok.eos_token_id, keep_eos)
    rows = run_eval(None, tok, TASKS_BY_SET, SPEC, step=3, llm=llm, eos=[tok.eos_token_id])
    assert [p.kwargs["seed"] for p in llm.params] == [r["seed"] for r in rows]
    assert {(p.kwargs["temperature"], p.kwargs["top_p"], p.kwargs["max_tokens"]) for p in llm.params} == {
        (SPEC.temperature, SPEC.top_p, SPEC.cap)
    }
    for r in rows:
        n = r["seed"] % (SPEC.cap + 4)
        if n < SPEC.cap:
            assert r["completion_tokens"] == n + 1 and r["outcome"] != Outcome.TRUNCATED
        else:
            assert r["completion_tokens"] == SPEC.cap and r["outcome"] == Outcome.TRUNCATED
        assert len(tok(r["completion"], add_special_tokens=False)["input_ids"]) == min(n, SPEC.cap)


def test_evaluation_leaves_the_training_rng_and_module_modes_alone(model, tok):
    torch.manual_seed(7)
    expected = torch.rand(5)
    model.train()
    model.model.visual.eval()  # a frozen tower stays in eval mode
    torch.manual_seed(7)
    threads = torch.get_num_threads()
    run_eval(model, tok, {HELDOUT: TASKS[:2]}, SPEC, step=0)
    assert torch.equal(torch.rand(5), expected)
    assert torch.get_num_threads() == threads
    assert model.training and model.model.language_model.training and not model.model.visual.training
    model.eval()


def test_evaluation_runs_the_class_forward_not_a_training_wrapper(model, tok, rows):
    """accelerate's prepare() puts a wrapper on model.forward; evaluation bypasses it and puts it back."""
    calls = []

    def wrapper(*args, **kwargs):
        calls.append(1)
        return type(model).forward(model, *args, **kwargs)

    model.forward = wrapper
    try:
        again = run_eval(model, tok, TASKS_BY_SET, SPEC, step=5)
        assert model.__dict__["forward"] is wrapper and not calls
        assert again == rows
    finally:
        del model.forward


def test_spec_reads_run_json():
    run = {
        "eval": {k: v for k, v in SPEC.to_json().items() if k != "batch_size"},
        "config": {"eval_batch_size": 4},
    }
    assert EvalSpec.from_run(run) == SPEC
    assert EvalSpec.from_run({"eval": SPEC.to_json(), "config": {"eval_batch_size": 7}}) == SPEC
    with pytest.raises(ValueError, match="seed"):
        EvalSpec.from_run({"eval": {k: v for k, v in SPEC.to_json().items() if k != "seed"}})
    with pytest.raises(ValueError):
        EvalSpec(temperature=0.0)


def _row(set_name, outcome, i=0):
    return {"set": set_name, "outcome": outcome, "task_id": f"t{i}", "sample": 0}


def test_summary_accuracy_excludes_indeterminate_from_the_denominator():
    outcomes = ["correct"] * 3 + ["wrong", "truncated", "format_rejected", "indeterminate", "indeterminate"]
    rows = [_row(FIXED, o, i) for i, o in enumerate(outcomes)] + [_row(HELDOUT, "indeterminate")]
    summary = summarize(rows)
    assert summary[FIXED] == {
        "accuracy": 3 / 6,
        "n": 8,
        "outcomes": {"truncated": 1, "format_rejected": 1, "correct": 3, "wrong": 1, "indeterminate": 2},
    }
    assert summary[HELDOUT]["accuracy"] is None and summary[HELDOUT]["n"] == 1
    logs = log_metrics(summary)
    assert logs["eval/fixed32/accuracy"] == 0.5
    assert logs["eval/fixed32/correct"] == 3 / 8 and logs["eval/fixed32/indeterminate"] == 2 / 8
    assert "eval/heldout300/accuracy" not in logs and logs["eval/heldout300/indeterminate"] == 1.0
    with pytest.raises(ValueError):
        summarize([_row(FIXED, "maybe")])


def test_write_eval_is_exclusive_per_cap(tmp_path, rows):
    path = write_eval(tmp_path, 5, rows)
    assert path == tmp_path / "results" / "eval_step005.jsonl"
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows
    assert write_eval(tmp_path, 5, rows) == path  # same rows again: fine
    edited = [{**r, "completion": r["completion"] + "!"} for r in rows]
    with pytest.raises(FileExistsError):
        write_eval(tmp_path, 5, edited)
    write_eval(tmp_path, 5, edited, overwrite=True)
    assert json.loads(path.read_text().splitlines()[0])["completion"].endswith("!")
    other_cap = [{**r, "cap": 32} for r in rows]
    with pytest.raises(FileExistsError):  # never replaces a file written at another cap
        write_eval(tmp_path, 5, other_cap, overwrite=True)
    assert write_eval(tmp_path, 5, other_cap, cap_suffix=32).name == "eval_step005_cap0032.jsonl"
    with pytest.raises(ValueError):
        write_eval(tmp_path, 5, rows, cap_suffix=32)
    with pytest.raises(ValueError):
        write_eval(tmp_path, 6, rows)
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        "eval_step005.jsonl",
        "eval_step005_cap0032.jsonl",
    ]


def test_callback_fires_at_step_zero_every_n_and_at_the_last_step(tmp_path, model, tok, capsys):
    logged = []
    small = {HELDOUT: TASKS[:2]}
    callback = EvalCallback(tmp_path, small, SPEC, eval_every=3, tokenizer=tok, log_fn=logged.append)
    state, control = TrainerState(max_steps=7), TrainerControl()
    callback.on_train_begin(None, state, control, model=model)
    evaluated = [callback.last_step]
    for step in range(1, 8):
        state.global_step = step
        callback.on_step_end(None, state, control, model=model)
        if callback.last_step == step:
            evaluated.append(step)
            assert callback.last_summary == summarize(
                json.loads(line) for line in eval_path(tmp_path, step).read_text().splitlines()
            )
            assert callback.last_seconds > 0
    assert evaluated == [0, 3, 6, 7]
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == [
        f"eval_step{s:03d}.jsonl" for s in evaluated
    ]
    assert len(logged) == 4 and set(logged[0]) >= {f"eval/{HELDOUT}/{o.value}" for o in Outcome}
    said = capsys.readouterr().err.splitlines()  # each evaluation is a phase of its own on the console
    assert [line for line in said if line.startswith("evaluating step ")] == [
        f"evaluating step {s}: 2 samples" for s in evaluated
    ]
    assert [line.split(" evaluated in ")[0] for line in said if " evaluated in " in line] == [
        f"step {s}" for s in evaluated
    ]
    resumed = EvalCallback(tmp_path / "resumed", small, SPEC, eval_every=3, tokenizer=tok)
    resumed.on_train_begin(None, TrainerState(max_steps=7, global_step=4), control, model=model)
    assert resumed.last_step is None and not (tmp_path / "resumed").exists()


def saved_run(tmp_path, model, tok, tiny_base, spec) -> Path:
    """A run directory as training leaves it: step005/ verified as save_weights writes it, and run.json."""
    run_dir = tmp_path / "run"
    model.save_pretrained(run_dir / "step005")
    tok.save_pretrained(run_dir / "step005")
    write_manifest(run_dir / "step005")  # as save_weights does: the command verifies it first
    snapshot = tmp_path / "tiny.tasks.json"
    write_snapshot(TASKS, snapshot)
    run = {
        "snapshot": {"path": str(snapshot), "sha256": snapshot_sha256(snapshot)},
        "base_model": str(tiny_base),
        "eval_sets": {name: [t["id"] for t in tasks] for name, tasks in TASKS_BY_SET.items()},
        "eval": spec.to_json(),
    }
    (run_dir / "run.json").write_text(json.dumps(run))
    return run_dir


@pytest.mark.slow
def test_standalone_command_reproduces_in_process_rows(tmp_path, tiny_base):
    model, tok = load_checkpoint(tiny_base, "cpu")  # as the trainer and the command load it
    spec = replace(SPEC, cap=40)
    rows = run_eval(model, tok, TASKS_BY_SET, spec, step=5)  # what training evaluated at step 5
    run_dir = saved_run(tmp_path, model, tok, tiny_base, spec)  # ... and the checkpoint it saved
    write_eval(run_dir, 5, rows)
    before = eval_path(run_dir, 5).read_bytes()
    assert main([str(run_dir), "--steps", "0,5", "--backend", "eager", "--device", "cpu"]) == 0
    assert eval_path(run_dir, 5).read_bytes() == before
    base_rows = [json.loads(line) for line in eval_path(run_dir, 0).read_text().splitlines()]
    assert base_rows == [{**r, "step": 0} for r in rows]  # same weights, same seeds, same rows

    assert main([str(run_dir), "--steps", "5", "--cap", "8", "--backend", "eager"]) == 0
    capped = [json.loads(line) for line in eval_path(run_dir, 5, 8).read_text().splitlines()]
    assert {r["cap"] for r in capped} == {8} and [r["seed"] for r in capped] == [r["seed"] for r in rows]

    eval_path(run_dir, 5).write_text(eval_path(run_dir, 5).read_text().replace('"step": 5', '"step": 5 '))
    assert main([str(run_dir), "--steps", "5", "--backend", "eager"]) == 1  # refuses to overwrite
    assert main([str(run_dir), "--steps", "5", "--temperature", "0.5"]) == 1  # only at another cap
    assert main([str(run_dir), "--steps", "5", "--backend", "vllm"]) == 1  # another backend: another cap
    weights = run_dir / "step005" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: 2**10])  # issue 30, case 2: never evaluated
    assert main([str(run_dir), "--steps", "5", "--cap", "16", "--backend", "eager"]) == 1
    assert not eval_path(run_dir, 5, 16).exists()
    run = json.loads((run_dir / "run.json").read_text())
    run["snapshot"]["sha256"] = "0" * 64
    (run_dir / "run.json").write_text(json.dumps(run))
    assert main([str(run_dir), "--steps", "5", "--backend", "eager"]) == 1  # snapshot verified


def test_make_eval_at_a_cap_past_the_models_positions_is_one_line_and_writes_nothing(
    tmp_path, tiny_base, capsys, monkeypatch
):
    """Issue 61, class 1 on `make eval`: the embedded base has 2048 positions; --cap 2040 after a prompt does not
    fit. Refused by the flag once the checkpoint's config is known, before anything is generated or written."""
    from trainer import eval_checkpoints

    def generated(*args, **kwargs):
        raise AssertionError("generation started")

    monkeypatch.setattr(eval_checkpoints, "run_eval", generated)
    model, tok = load_checkpoint(tiny_base, "cpu")
    run_dir = saved_run(tmp_path, model, tok, tiny_base, replace(SPEC, cap=40))
    before = sorted(run_dir.rglob("*"))
    assert main([str(run_dir), "--steps", "5", "--cap", "2040", "--backend", "eager", "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: --cap: 2040 tokens after the longest prompt ("), err
    assert "past max_position_embeddings 2048 of " in err[-1] and "Traceback" not in "\n".join(err)
    assert sorted(run_dir.rglob("*")) == before


@pytest.mark.parametrize("field, value", [("temperature", "nan"), ("temperature", "inf"), ("top_p", "nan")])
def test_a_non_finite_sampling_setting_is_refused(field, value):
    """`make eval --temperature inf` (argparse's float takes it): refused as the spec is made (issue 61)."""
    with pytest.raises(ValueError, match="eval spec: need temperature > 0 and 0 < top_p <= 1"):
        replace(SPEC, **{field: float(value)})


def test_standalone_evaluation_defaults_to_the_runs_device(monkeypatch):
    """`make eval` on a GPU machine: a use_cpu run's training-time rows are CPU rows, so its standalone
    evaluation runs on the CPU too (on the H200 a CUDA default made them differ and `write_eval` refuse)."""
    from trainer.eval_checkpoints import run_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_device({"config": {"use_cpu": True}}) == "cpu"
    assert run_device({"config": {"use_cpu": False}}) == run_device({}) == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert run_device({"config": {"use_cpu": False}}) == "cpu"
