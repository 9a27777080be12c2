"""trainer/cpu_generation.py: the CPU decoding loop gives generate's tokens while computing fewer rows."""

import pytest
import torch
import transformers
from transformers import GenerationConfig

from data.prompt import render_prompt
from embedded.build import embedded_tasks
from trainer import cpu_generation


@pytest.fixture(scope="module")
def base(tiny_base):
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(tiny_base, dtype=torch.float32)
    return model.eval(), transformers.AutoTokenizer.from_pretrained(tiny_base)


def left_padded(tokenizer, problems):
    prompts = [
        tokenizer(render_prompt(tokenizer, p), add_special_tokens=False)["input_ids"] for p in problems
    ]
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


def generate(model, ids, mask, config, seed, compact):
    torch.manual_seed(seed)
    seen = []  # rows of every forward pass
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        with torch.no_grad(), cpu_generation.compact_decoding(model) if compact else torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    finally:
        hook.remove()
    return out, seen


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_same_tokens_as_generate_with_fewer_rows(base, monkeypatch, temperature):
    model, tokenizer = base
    torch.set_num_threads(1)
    problems = [t["problem"] for t in embedded_tasks()[:6]]
    ids, mask = left_padded(tokenizer, [p for p in problems for _ in range(3)])  # rollouts repeat prompts
    config = GenerationConfig(
        max_new_tokens=160, do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=[tokenizer.eos_token_id], disable_compile=True,
    )  # fmt: skip
    monkeypatch.setattr(cpu_generation, "COMPACT_SHARE", 0.0)  # drop every ended row at once
    for seed in (0,) if temperature != 1.0 else (0, 1):
        expected, full_rows = generate(model, ids, mask, config, seed, compact=False)
        got, rows = generate(model, ids, mask, config, seed, compact=True)
        assert torch.equal(got, expected)
        assert set(full_rows) == {len(ids)}
        assert rows[0] == len(problems)  # one prefill per distinct prompt
        ended_early = (expected[:, ids.shape[1] : -1] == tokenizer.eos_token_id).any(1).sum().item()
        assert ended_early > 0 and min(rows[1:]) == len(ids) - ended_early  # ended rows left the batch
    assert "generate" not in model.__dict__  # the context put generate back


def test_greedy_goes_to_transformers_loop(base):
    model, tokenizer = base
    ids, mask = left_padded(tokenizer, [t["problem"] for t in embedded_tasks()[:2]])
    config = GenerationConfig(
        max_new_tokens=8, do_sample=False, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id], disable_compile=True,
    )  # fmt: skip
    expected, _ = generate(model, ids, mask, config, 0, compact=False)
    got, rows = generate(model, ids, mask, config, 0, compact=True)
    assert torch.equal(got, expected) and set(rows) == {len(ids)}
