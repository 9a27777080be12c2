"""Eager CPU generation that stops computing finished rows, with the same tokens as transformers' generate.

On CPU a generate call costs what its matrix products cost, row for row, and transformers keeps every row in
the batch until the last one ends: the embedded default's rollouts and evaluation samples end after ~95 of
160 tokens on average, but one truncated row keeps the whole batch going to 160. `compact_sample` is
transformers' sampling loop (`GenerationMixin._sample`) with one change: when enough rows have ended, they
leave the model's batch and its cache (`Cache.reorder_cache` with the live rows). Sampling still runs on the
whole batch, ended rows given uniform scores and then pad, as in generate, so the random stream and every
live row's draw are unchanged: `torch.multinomial` draws one exponential per vocabulary entry and row,
whatever the probabilities. A live row's forward does not depend on the other rows (checked token for token
against generate in tests/test_cpu_generation.py).

It is passed to generate as `custom_generate` (transformers' public hook for a decoding loop), so generate
still prepares the config, cache, logits processors and stopping criteria; whatever the loop does not handle
(greedy, streamers, dict outputs, positions kept across calls) goes to transformers' own `_sample`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import torch
from transformers.cache_utils import Cache

# Rows leave the batch once this share of it has ended: each compaction copies the cache, so it waits for a
# few rows to end instead of copying at every ended row (BENCH: bench/cpu_profile.py --compare).
COMPACT_SHARE = 1 / 8
# what generate hands a text-only decoder's loop; anything else (a vision input, token types) goes to _sample
HANDLED_KWARGS = frozenset({"attention_mask", "cache", "use_cache", "position_ids", "logits_to_keep"})


def compact_sample(
    model,
    input_ids: torch.LongTensor,
    logits_processor,
    stopping_criteria,
    generation_config,
    synced_gpus: bool = False,
    streamer=None,
    **model_kwargs,
):
    """transformers' `_sample` (5.17-5.24) for plain sampling, ended rows dropped from the forward passes."""
    cache = model_kwargs.get("cache")
    given = {
        k
        for k, v in model_kwargs.items()
        if v is not None and not (isinstance(v, dict) and not any(v.values()))
    }
    unhandled = given - HANDLED_KWARGS  # an empty `mm_encoder_outputs`: a text-only call
    if (
        not generation_config.do_sample
        or generation_config.return_dict_in_generate
        or synced_gpus
        or streamer is not None
        or not isinstance(cache, Cache)
        or unhandled
        or input_ids.device.type != "cpu"
    ):
        return type(model)._sample(
            model,
            input_ids,
            logits_processor=logits_processor,
            stopping_criteria=stopping_criteria,
            generation_config=generation_config,
            synced_gpus=synced_gpus,
            streamer=streamer,
            **model_kwargs,
        )
    pad = generation_config._pad_token_tensor
    batch = input_ids.shape[0]
    unfinished = torch.ones(batch, dtype=torch.long)
    rows = torch.arange(batch)  # the batch rows the model's batch (and cache) hold, in order
    logits = _prefill_once(model, input_ids, generation_config, model_kwargs)
    while True:
        if len(rows) < batch:  # ended rows: any valid scores, their draw is replaced by pad below
            full = logits.new_zeros(batch, logits.shape[-1])
            full[rows] = logits
            logits = full
        probs = torch.nn.functional.softmax(logits_processor(input_ids, logits), dim=-1)
        next_tokens = torch.multinomial(probs, num_samples=1).squeeze(1)
        next_tokens = next_tokens * unfinished + pad * (1 - unfinished)
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        unfinished = unfinished & ~stopping_criteria(input_ids, None)
        if unfinished.max() == 0:
            return input_ids
        live = unfinished[rows].bool()
        if (~live).sum() >= max(1, COMPACT_SHARE * len(rows)):
            keep = live.nonzero().squeeze(1)
            model_kwargs["cache"].reorder_cache(keep)
            model_kwargs = _take_rows(model_kwargs, keep)
            rows = rows[keep]
        inputs = model.prepare_inputs_for_generation(input_ids[rows], next_sequence_length=1, **model_kwargs)
        outputs = model(**inputs, return_dict=True)
        model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
        logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
        del outputs


def _prefill_once(model, input_ids, generation_config, model_kwargs: dict) -> torch.Tensor:
    """generate's prefill, each distinct prompt once (rollouts repeat every prompt G times), the cache then
    expanded to the whole batch; `model_kwargs` updated as generate does. Returns the last logits [B, V]."""
    mask = model_kwargs.get("attention_mask")
    key = input_ids if mask is None else torch.cat([input_ids, mask], -1)
    distinct: dict[tuple, int] = {}  # prompt (ids and mask) -> its index among the distinct ones
    first, inverse = [], []
    for i, row in enumerate(map(tuple, key.tolist())):
        if row not in distinct:
            distinct[row] = len(first)
            first.append(i)
        inverse.append(distinct[row])
    first, inverse = torch.tensor(first), torch.tensor(inverse)
    once = model_kwargs if len(first) == len(inverse) else _take_rows(model_kwargs, first)
    outputs = model._prefill(input_ids[first], generation_config, once, is_first_iteration=True)
    if len(first) < len(inverse):
        outputs["cache"].reorder_cache(inverse)
    model_kwargs.update(model._update_model_kwargs_for_generation(outputs, dict(model_kwargs)))
    return outputs.logits[:, -1].to(copy=True, dtype=torch.float32)[inverse]


def _take_rows(model_kwargs: dict, rows: torch.Tensor) -> dict:
    """generate's per-row inputs (attention mask, position ids) for the given batch rows only."""
    out = dict(model_kwargs)
    if (mask := out.get("attention_mask")) is not None:
        out["attention_mask"] = mask[rows]
    if (positions := out.get("position_ids")) is not None:  # [B, L] or [planes, B, L]
        out["position_ids"] = positions[rows] if positions.dim() == 2 else positions[:, rows]
    return out


@contextlib.contextmanager
def compact_decoding(model) -> Iterator[None]:
    """For the call, `model.generate` on a CPU decodes with `compact_sample` (elsewhere: unchanged), on one
    intra-op thread.

    One thread: the decode step's ops are small (<= 128 rows x 256), and a second thread made a rollout round
    or an evaluation slower, not faster, while the training pass gains from it (`cpu_threads`; BENCH:
    bench/cpu_profile.py --threads). Pinned, the tokens do not depend on the process's thread setting.
    `compact_sample` is an instance attribute, removed afterwards, so callers that build their own generate
    call (TRL's rollouts) get it too. Not under torch.distributed: generate's `synced_gpus` (FSDP, ZeRO-3)
    does not reach a `custom_generate`."""
    if model is None or model.device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
        if "generate" in model.__dict__ or distributed:
            yield
            return
        model.generate = functools.partial(model.generate, custom_generate=compact_sample)
        try:
            yield
        finally:
            del model.generate
    finally:
        torch.set_num_threads(threads)
