"""A vLLM rollout stopped by the cap (`finish_reason == "length"`) is graded `truncated`, exactly as the same
tokens from our generation are: TRL's colocate path (`VLLMGeneration.generate`, run here on a stand-in engine
that answers as vLLM's `LLM.generate` does) hands vLLM's token ids on unchanged, and the grader calls a
rollout truncated iff it does not end with EOS. vLLM ends a rollout stopped by EOS with the EOS id ("stop") and
one stopped by `max_tokens` or the model length without it ("length"): vLLM 0.25.0's `check_stop`
(vllm/v1/core/sched/utils.py) tests the EOS and stop ids before the length, and keeps the token."""

from types import SimpleNamespace

import pytest
import torch
from trl.generation import vllm_generation
from trl.generation.vllm_generation import VLLMGeneration

from engine.generation import cut_after_eos
from rewards.grader import GraderPool
from rewards.outcome import Outcome
from rewards.reward import OutcomeReward

EOS, PAD, CAP = 2, 0, 6
BOXED = [40, 41, 42]  # stands for "\boxed{4}"


class Engine:
    """Answers `generate` with RequestOutput-shaped objects: per prompt one completion, each token with its
    log-prob (`logprobs=0`), and the finish reason vLLM gives it."""

    def __init__(self, completions: list[tuple[list[int], str]]):
        self.completions, self.asked = completions, []

    def generate(self, prompts, sampling_params, use_tqdm):
        self.asked.append(sampling_params)
        return [
            SimpleNamespace(
                prompt_token_ids=p["prompt_token_ids"],
                outputs=[
                    SimpleNamespace(
                        token_ids=ids,
                        finish_reason=reason,
                        logprobs=[{t: SimpleNamespace(logprob=-0.5, rank=1)} for t in ids],
                    )
                ],
            )
            for p, (ids, reason) in zip(prompts, self.completions, strict=True)
        ]


def colocated(engine: Engine) -> VLLMGeneration:
    """TRL's colocate generator around `engine`, with the fields its generate() reads (no vLLM here)."""
    gen = object.__new__(VLLMGeneration)
    fields = dict(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0)
    fields |= dict(max_completion_length=CAP, mode="colocate", enable_sleep_mode=False, logprobs=0)
    fields |= dict(
        generation_kwargs={},
        structured_outputs_regex=None,
        tensor_parallel_size=1,
        model=torch.nn.Linear(1, 1),
    )
    fields |= dict(accelerator=SimpleNamespace(), llm=engine, _llm_weights_sleeping=False)
    gen.__dict__.update(fields)
    return gen


@pytest.fixture(scope="module")
def pool():
    with GraderPool(workers=1, timeout_s=5.0) as p:
        yield p


def test_a_rollout_stopped_by_the_cap_is_graded_truncated_as_ours_is(pool, monkeypatch):
    # vLLM is not installed here: SamplingParams is only read for its arguments
    monkeypatch.setattr(vllm_generation, "SamplingParams", lambda **kw: kw, raising=False)
    vllm_rollouts = [
        (BOXED + [7, 8, 9], "length"),  # ran to the cap with a boxed answer: still truncated
        (BOXED + [EOS], "stop"),  # ended by EOS within the cap
        (BOXED + [7], "length"),  # cut by the model length before the cap: no EOS, truncated
        ([5, 6, 7, 8, 9, EOS], "stop"),  # EOS as the cap-th token: vLLM says "stop"
    ]
    engine = Engine(vllm_rollouts)
    _, completion_ids, logprobs, _ = colocated(engine).generate([[1, 3]] * 4, None, num_generations=1)
    assert engine.asked[0]["max_tokens"] == CAP and engine.asked[0]["logprobs"] == 0
    assert completion_ids == [ids for ids, _ in vllm_rollouts]  # unchanged
    assert [len(lp) for lp in logprobs] == [len(ids) for ids in completion_ids]

    reward = OutcomeReward([EOS], pool=pool)
    texts = ["\\boxed{4}"] * 4
    graded = [g.outcome for g in reward.grade(texts, completion_ids, ["4"] * 4)]
    assert graded == [Outcome.TRUNCATED, Outcome.CORRECT, Outcome.TRUNCATED, Outcome.CORRECT]
    assert [g is Outcome.TRUNCATED for g in graded] == [r == "length" for _, r in vllm_rollouts]

    # our generation's rows for the same tokens: padded to the cap after EOS, cut by cut_after_eos
    ours = [
        cut_after_eos(ids + [PAD] * (CAP - len(ids)) if EOS in ids else ids, {EOS})
        for ids, _ in vllm_rollouts
    ]
    assert [g.outcome for g in reward.grade(texts, ours, ["4"] * 4)] == graded
