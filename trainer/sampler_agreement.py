"""Does the sampler hold the trainer's weights? vLLM's log-probs of the tokens it sampled against the trainer's
recomputed ones, per step (steps.jsonl `sampler_agreement`, written whenever the backend returns log-probs).

Weights are pushed to vLLM before each step's first rollout, and TRL recomputes the sampled tokens' log-probs
with those same weights for its importance-sampling correction, so the two may differ only by numerics (bf16
kernels, batch order). An engine that missed a push samples from older weights and shows it here.
Bounds: mean |Δ| under MAX_MEAN_ABS_DELTA, and every rollout's importance ratio exp(Σ Δ) inside RATIO_BOUNDS
(TRL's default `vllm_importance_sampling_clip_max` 3 masks a rollout above it); the same bounds the real-vLLM
tests use (tests/real_vllm/test_vllm_colocate.py).
"""

import math

import torch

MAX_MEAN_ABS_DELTA = 0.05
RATIO_BOUNDS = (1 / 3, 3.0)


def agreement(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor) -> dict | None:
    """Per-token |trainer − sampler| (mean, max) and the per-rollout importance ratio trainer/sampler
    (min, max; unclipped) over the completion tokens in `mask` ([rows, tokens]); tokens the sampler could not
    score (NaN) are left out. None when no token is left."""
    delta = (trainer_logps.float() - sampler_logps.float()).detach()
    valid = mask.bool() & ~torch.isnan(delta)
    if not valid.any():
        return None
    delta = torch.where(valid, delta, torch.zeros_like(delta))
    rows = valid.any(dim=1)
    log_ratio = delta.sum(dim=1)[rows]
    tokens = delta.abs()[valid]
    return {
        "mean_abs_delta": tokens.mean().item(),
        "max_abs_delta": tokens.max().item(),
        "ratio_min": math.exp(log_ratio.min().item()),
        "ratio_max": math.exp(log_ratio.max().item()),
        "tokens": int(valid.sum().item()),
    }


def failures(record: dict) -> list[str]:
    """What in a step's `sampler_agreement` breaks the bounds (empty: the engine holds the trainer's weights)."""
    out = []
    if record["mean_abs_delta"] >= MAX_MEAN_ABS_DELTA:
        out.append(f"mean |Δlogp| {record['mean_abs_delta']:.4f} >= {MAX_MEAN_ABS_DELTA}")
    low, high = RATIO_BOUNDS
    if not low < record["ratio_min"] <= record["ratio_max"] < high:
        out.append(
            f"importance ratio {record['ratio_min']:.3g}-{record['ratio_max']:.3g} outside ({low:.3g}, {high})"
        )
    return out
