"""Does the sampler hold the trainer's weights? vLLM's log-probs of the tokens it sampled against the trainer's
recomputed ones, per step (steps.jsonl `sampler_agreement`, written whenever the backend returns log-probs).

Weights are pushed to vLLM before each step's first rollout, and TRL recomputes the sampled tokens' log-probs
with those same weights for its importance-sampling correction, so the two may differ only by numerics (bf16
kernels, batch order). An engine that missed a push samples from older weights and shows it here.
Bounds, per token: mean |Δ| under MAX_MEAN_ABS_DELTA, and at most MAX_OUTSIDE_SHARE of the tokens with an
importance ratio exp(Δ) outside TOKEN_RATIO_BOUNDS (TRL's default `vllm_importance_sampling_clip_max` is 3). The
per-rollout ratio exp(Σ Δ) is recorded, not bounded: a sum over hundreds of tokens grows with the rollout's length,
and on the H200 a fresh engine's ranged 0.06-28.9 over 256-token bf16 rollouts (docs/gpu.md). The signed mean Δ
estimates −KL(sampler ‖ trainer): a stale engine drives it down.
"""

import math

import torch

MAX_MEAN_ABS_DELTA = 0.05
TOKEN_RATIO_BOUNDS = (1 / 3, 3.0)
MAX_OUTSIDE_SHARE = 0.01


def agreement(trainer_logps: torch.Tensor, sampler_logps: torch.Tensor, mask: torch.Tensor) -> dict | None:
    """Per-token trainer − sampler (mean |Δ|, max |Δ|, signed mean, tokens whose ratio is outside
    TOKEN_RATIO_BOUNDS) and the per-rollout importance ratio trainer/sampler (min, max; unclipped) over the
    completion tokens in `mask` ([rows, tokens]); tokens the sampler could not score (NaN) are left out. None
    when no token is left."""
    delta = (trainer_logps.float() - sampler_logps.float()).detach()
    valid = mask.bool() & ~torch.isnan(delta)
    if not valid.any():
        return None
    delta = torch.where(valid, delta, torch.zeros_like(delta))
    rows = valid.any(dim=1)
    log_ratio = delta.sum(dim=1)[rows]
    tokens = delta.abs()[valid]
    low, high = TOKEN_RATIO_BOUNDS
    outside = ((delta < math.log(low)) | (delta > math.log(high))) & valid
    return {
        "mean_abs_delta": tokens.mean().item(),
        "max_abs_delta": tokens.max().item(),
        "mean_delta": delta[valid].mean().item(),
        "tokens_outside": int(outside.sum().item()),
        "ratio_min": math.exp(log_ratio.min().item()),
        "ratio_max": math.exp(log_ratio.max().item()),
        "tokens": int(valid.sum().item()),
    }


def failures(record: dict) -> list[str]:
    """What in a step's `sampler_agreement` breaks the bounds (empty: the engine holds the trainer's weights)."""
    out = []
    if record["mean_abs_delta"] >= MAX_MEAN_ABS_DELTA:
        out.append(f"mean |Δlogp| {record['mean_abs_delta']:.4f} >= {MAX_MEAN_ABS_DELTA}")
    share = record["tokens_outside"] / record["tokens"]
    if share > MAX_OUTSIDE_SHARE:
        low, high = TOKEN_RATIO_BOUNDS
        out.append(
            f"{share:.2%} of tokens with a ratio outside ({low:.3g}, {high}) > {MAX_OUTSIDE_SHARE:.0%}"
        )
    return out


def combine(parts: list[dict]) -> dict | None:
    """One step's record from the processes' records (token-weighted means, extremes, sums)."""
    parts = [r for r in parts if r is not None]
    if not parts:
        return None
    tokens = sum(r["tokens"] for r in parts)
    return {
        "mean_abs_delta": sum(r["mean_abs_delta"] * r["tokens"] for r in parts) / tokens,
        "max_abs_delta": max(r["max_abs_delta"] for r in parts),
        "mean_delta": sum(r["mean_delta"] * r["tokens"] for r in parts) / tokens,
        "tokens_outside": sum(r["tokens_outside"] for r in parts),
        "ratio_min": min(r["ratio_min"] for r in parts),
        "ratio_max": max(r["ratio_max"] for r in parts),
        "tokens": tokens,
    }
