"""engine/cpu_generation.py: the CPU decoding loop gives generate's tokens while computing fewer rows."""

import pytest
import torch
import transformers
from transformers import GenerationConfig

from data.prompt import render_prompt
from embedded.build import embedded_tasks
from engine import cpu_generation


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


def test_shares_on_parallel_threads_give_generates_tokens_and_random_stream(base, monkeypatch):
    """With 3 intra-op threads the call's rows are decoded in 3 shares on 3 threads, one intra-op thread each;
    every share draws the whole batch's random numbers, so tokens and the generator's state afterwards are
    generate's (the next rollout round's draws are unchanged too)."""
    model, tokenizer = base
    problems = [t["problem"] for t in embedded_tasks()[:6]]
    ids, mask = left_padded(tokenizer, [p for p in problems for _ in range(3)])
    config = GenerationConfig(
        max_new_tokens=160, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=[tokenizer.eos_token_id], disable_compile=True,
    )  # fmt: skip
    monkeypatch.setattr(cpu_generation, "MIN_SHARE_ROWS", 4)
    threads = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: threads.append((torch.get_num_threads(), kw["input_ids"].shape[0])), with_kwargs=True
    )
    try:
        torch.set_num_threads(1)
        expected, _ = generate(model, ids, mask, config, 0, compact=False)
        state = torch.get_rng_state()
        threads.clear()
        torch.set_num_threads(3)
        got, _ = generate(model, ids, mask, config, 0, compact=True)
        assert torch.get_num_threads() == 3  # restored
    finally:
        hook.remove()
        torch.set_num_threads(1)
    assert torch.equal(got, expected) and torch.equal(torch.get_rng_state(), state)
    assert {t for t, _ in threads} == {1} and max(rows for _, rows in threads) == 6  # 3 shares of 6 rows
    assert (expected[:, ids.shape[1] : -1] == tokenizer.eos_token_id).any(1).sum().item() > 0  # rows ended


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


def test_generation_runs_on_one_thread_and_the_training_pass_is_the_same_on_two(base):
    """configs/embedded.yaml trains on two intra-op threads (cpu_threads: 2) and generates on one: the decode
    loop pins one thread for the call, and a training micro-batch's logits and gradients at two threads are
    reproducible and within float32 rounding of one thread's (bitwise the same on the CI VM)."""
    model, tokenizer = base
    seen = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: seen.append(torch.get_num_threads()), with_kwargs=True
    )
    ids, mask = left_padded(tokenizer, [t["problem"] for t in embedded_tasks()[:4]])
    config = GenerationConfig(
        max_new_tokens=4, do_sample=True, top_k=0, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=[tokenizer.eos_token_id], disable_compile=True,
    )  # fmt: skip
    torch.set_num_threads(2)
    try:
        with torch.no_grad(), cpu_generation.compact_decoding(model):
            model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        assert (
            seen and set(seen) == {1} and torch.get_num_threads() == 2
        )  # pinned for the call, then restored
        hook.remove()
        batch = torch.randint(
            10, len(tokenizer), (16, 260), generator=torch.Generator().manual_seed(0)
        )  # a micro-batch
        passes = []
        for threads in (1, 2, 2):
            torch.set_num_threads(threads)
            model.train()
            model.zero_grad()
            logits = model(input_ids=batch, attention_mask=torch.ones_like(batch)).logits
            logits.log_softmax(-1).mean().backward()
            passes.append(
                [logits.detach(), *(p.grad.clone() for p in model.parameters() if p.grad is not None)]
            )
    finally:
        hook.remove()
        model.zero_grad(set_to_none=True)
        model.eval()
        torch.set_num_threads(1)
    one, two, again = passes
    assert len(one) > 1 and all(torch.equal(a, b) for a, b in zip(two, again, strict=True))  # reproducible
    # Bitwise equal to one thread's on the CI VM, not on the H200 host (its Xeon, torch 2.11), where a run's
    # rows are those of its recorded cpu_threads.
    for a, b in zip(one, two, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
