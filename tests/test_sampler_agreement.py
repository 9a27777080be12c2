"""steps.jsonl `sampler_agreement` (trainer/sampler_agreement.py): an engine holding the trainer's weights passes
the bounds, a stale one (the weights before the last update) fails them; the trainer's hook records it from
what TRL's scoring returns. The engine here is a stand-in: a bf16 copy of a tiny causal LM that samples tokens
and reports their log-probs, as vLLM does with `logprobs=0`. `make test-vllm` and the H200 run show it on a
real engine."""

import copy
import math
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trainer import sampler_agreement
from trainer.grpo import CapGRPOTrainer
from trainer.step_record import StepRecord

PROMPT, NEW, ROWS, VOCAB = 6, 24, 16, 96


def tiny_lm(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def completion_logps(model, ids: torch.Tensor) -> torch.Tensor:
    """Log-probs of ids[:, PROMPT:] under `model` (what the trainer recomputes, in float32)."""
    with torch.no_grad():
        logits = model(ids).logits[:, PROMPT - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT:, None])[..., 0]


def engine_sample(weights, prompts: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What an engine holding `weights` returns: sampled tokens and their log-probs, computed in bf16."""
    engine = copy.deepcopy(weights).to(torch.bfloat16)
    gen = torch.Generator().manual_seed(seed)
    ids = prompts
    with torch.no_grad():
        for _ in range(NEW):
            logits = engine(ids).logits[:, -1].float()
            ids = torch.cat([ids, torch.multinomial(logits.softmax(-1), 1, generator=gen)], 1)
    return ids, completion_logps(engine, ids)


def one_update(model, ids: torch.Tensor, lr: float) -> LlamaForCausalLM:
    """The trainer's step: one policy-gradient update (Adam, random advantages) on the engine's rollouts."""
    new = copy.deepcopy(model).train()
    opt = torch.optim.Adam(new.parameters(), lr=lr)
    advantages = torch.randn(ids.shape[0], generator=torch.Generator().manual_seed(1))
    logits = new(ids).logits[:, PROMPT - 1 : -1]
    logps = torch.log_softmax(logits, -1).gather(-1, ids[:, PROMPT:, None])[..., 0]
    (-(advantages[:, None] * logps).mean()).backward()
    opt.step()
    return new.eval()


@pytest.fixture(scope="module")
def step_two():
    """Step 1 trains on the base's rollouts; step 2's rollouts come from a fresh or a stale engine."""
    base = tiny_lm(0)
    prompts = torch.randint(0, VOCAB, (ROWS, PROMPT), generator=torch.Generator().manual_seed(2))
    ids, _ = engine_sample(base, prompts, seed=3)
    stepped = one_update(base, ids, lr=1e-2)
    mask = torch.ones(ROWS, NEW)
    out = {}
    for name, engine in (("fresh", stepped), ("stale", base)):
        ids, sampler = engine_sample(engine, prompts, seed=4)
        out[name] = sampler_agreement.agreement(completion_logps(stepped, ids), sampler, mask)
    return out


def test_an_engine_holding_the_pushed_weights_agrees(step_two):
    fresh = step_two["fresh"]
    assert sampler_agreement.failures(fresh) == [], fresh
    assert 0 < fresh["mean_abs_delta"] < sampler_agreement.MAX_MEAN_ABS_DELTA  # bf16 numerics, not zero
    assert fresh["tokens"] == ROWS * NEW


def test_a_stale_engine_fails_the_bounds(step_two):
    stale = step_two["stale"]
    assert any("mean |Δlogp|" in f for f in sampler_agreement.failures(stale)), stale
    assert stale["mean_abs_delta"] > 3 * step_two["fresh"]["mean_abs_delta"]


def test_agreement_leaves_out_masked_and_unscored_tokens():
    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]])
    sampler = torch.tensor([[-1.1, float("nan"), -3.0], [-0.5, -0.7, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    got = sampler_agreement.agreement(trainer, sampler, mask)
    assert got["tokens"] == 4  # the NaN and the masked token are out
    assert got["mean_abs_delta"] == pytest.approx((0.1 + 0.0 + 0.0 + 0.2) / 4)
    assert got["max_abs_delta"] == pytest.approx(0.2)
    assert got["mean_delta"] == pytest.approx((0.1 + 0.0 + 0.0 + 0.2) / 4)
    assert got["ratio_min"] == pytest.approx(math.exp(0.1))
    assert got["ratio_max"] == pytest.approx(math.exp(0.2))
    assert got["tokens_outside"] == 0
    assert sampler_agreement.agreement(trainer, sampler, torch.zeros(2, 3)) is None


def test_the_token_ratio_bound_counts_tokens_not_rollouts():
    # 200 tokens per rollout, each 0.02 nats likelier under the trainer: every token's ratio is 1.02, the
    # rollout's is e^4 = 55 (beyond TRL's clip of 3); no token is outside, so the engine passes
    trainer = torch.full((2, 200), -1.0)
    long = sampler_agreement.agreement(trainer, trainer - 0.02, torch.ones(2, 200))
    assert long["ratio_max"] == pytest.approx(math.exp(4.0), rel=1e-4)
    assert sampler_agreement.failures(long) == []
    # 5 of 400 tokens (1.25%) with a ratio of e^1.2 = 3.3: over the 1% share, though the mean |Δ| is small
    sampler = trainer.clone()
    sampler[0, :5] -= 1.2
    few = sampler_agreement.agreement(trainer, sampler, torch.ones(2, 200))
    assert few["tokens_outside"] == 5 and few["mean_abs_delta"] < sampler_agreement.MAX_MEAN_ABS_DELTA
    assert sampler_agreement.failures(few) == ["1.25% of tokens with a ratio outside (0.333, 3.0) > 1%"]
    assert sampler_agreement.failures(dict(few, tokens_outside=4)) == []


def test_records_of_several_processes_combine_by_tokens():
    one = sampler_agreement.agreement(torch.zeros(1, 2), torch.tensor([[-0.1, 0.1]]), torch.ones(1, 2))
    two = sampler_agreement.agreement(torch.zeros(1, 4), torch.full((1, 4), -2.0), torch.ones(1, 4))
    both = sampler_agreement.combine([one, None, two])
    assert both["tokens"] == 6 and both["tokens_outside"] == 4
    assert both["mean_abs_delta"] == pytest.approx((0.2 + 8.0) / 6)
    assert both["mean_delta"] == pytest.approx((0.0 + 8.0) / 6)
    assert both["ratio_max"] == pytest.approx(math.exp(8.0)) and both["ratio_min"] == pytest.approx(1.0)
    assert sampler_agreement.combine([None]) is None


def test_the_trainer_records_it_in_the_steps_row_from_trls_scoring_output():
    stand_in = SimpleNamespace(step_record=StepRecord())
    trainer = torch.tensor([[-1.0, -2.0], [-0.5, -0.5]])
    output = {
        "old_per_token_logps": trainer,
        "sampling_per_token_logps": trainer - 0.01,
        "completion_mask": torch.ones(2, 2),
    }
    CapGRPOTrainer._record_sampler_agreement(stand_in, output)
    row = stand_in.step_record.to_row()["sampler_agreement"]
    assert row == sampler_agreement.agreement(trainer, trainer - 0.01, torch.ones(2, 2))
    assert row["mean_abs_delta"] == pytest.approx(0.01) and row["tokens"] == 4
    # transformers' generation returns no sampler log-probs: nothing to record
    plain = SimpleNamespace(step_record=StepRecord())
    CapGRPOTrainer._record_sampler_agreement(plain, dict(output, sampling_per_token_logps=None))
    assert plain.step_record.sampler_agreement is None
