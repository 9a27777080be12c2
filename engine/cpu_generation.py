"""Eager CPU generation that stops computing finished rows, with the same tokens as transformers' generate.

On CPU a generate call costs what its matrix products cost, row for row, and transformers keeps every row in
the batch until the last one ends: the embedded default's rollouts and evaluation samples end after ~95 of
160 tokens on average, but one truncated row keeps the whole batch going to 160. `compact_sample` is
transformers' sampling loop (`GenerationMixin._sample`) with one change: when enough rows have ended, they
leave the model's batch and its cache (`Cache.reorder_cache` with the live rows). Sampling still draws for
the whole batch what `torch.multinomial` draws (one exponential q per vocabulary entry and row, whatever the
probabilities; the token is argmax(p / q)), ended rows then given pad, as in generate, so the random stream
and every live row's draw are unchanged. A live row's forward does not depend on the other rows (checked token for token
against generate in tests/test_cpu_generation.py).

On more than one intra-op thread (`cpu_threads`), a call's rows are split into shares, each decoded by this
loop on a thread of its own with one intra-op thread (the decode step's ops are too small to split well, its
rows are not): every share draws the whole batch's random numbers from its own copy of the generator, so each
row gets the same draws, and the generator ends where one loop over the batch leaves it. Between the ops'
kernels, which release the GIL, the shares' Python takes turns.

It is passed to generate as `custom_generate` (transformers' public hook for a decoding loop), so generate
still prepares the config, cache, logits processors and stopping criteria; whatever the loop does not handle
(greedy, streamers, dict outputs, positions kept across calls) goes to transformers' own `_sample`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import functools
import threading
from collections.abc import Iterator

import torch
from transformers.cache_utils import Cache

# Rows leave the batch once this share of it has ended: each compaction copies the cache, so it waits for a
# few rows to end instead of copying at every ended row (BENCH: bench/cpu_profile.py --compare).
COMPACT_SHARE = 1 / 8
# A call's rows are split into shares decoded on parallel threads, one per intra-op thread the caller had
# (`cpu_threads`), each share at least this many rows: every share pays the whole per-step cost of Python,
# dispatch and the batch's random draws (~9 ms a step), so an evaluation batch (128 rows) gains from two
# shares and a rollout round (96) does not (BENCH: bench/cpu_profile.py --shares).
MIN_SHARE_ROWS = 64
# what generate hands a text-only decoder's loop; anything else (a vision input, token types) goes to _sample
# the decoding cache is `past_key_values` in transformers 5.17 (the GPU machine's), `cache` in 5.24
CACHE_KEYS = ("cache", "past_key_values")
HANDLED_KWARGS = frozenset({"attention_mask", *CACHE_KEYS, "use_cache", "position_ids", "logits_to_keep"})


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
    cache_key = next((k for k in CACHE_KEYS if model_kwargs.get(k) is not None), CACHE_KEYS[0])
    cache = model_kwargs.get(cache_key)
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
    batch = input_ids.shape[0]
    decode = functools.partial(
        _decode_share, model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs,
        cache_key,
    )  # fmt: skip
    workers = max(1, min(_DECODERS.n, batch // MIN_SHARE_ROWS))
    if workers == 1:
        return decode(torch.arange(batch), torch.default_generator)[0]
    # each share draws from its own copy of the stream; all copies draw the same numbers step for step
    start = torch.default_generator.get_state()
    streams = [torch.Generator().set_state(start) for _ in range(workers)]
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        outs = list(pool.map(decode, torch.arange(batch).tensor_split(workers), streams))
    # the batch ran as long as its longest share; the others' ended rows hold pad meanwhile, as in generate
    width = max(ids.shape[1] for ids, _ in outs)
    pad = int(generation_config._pad_token_tensor)
    out = torch.cat([torch.nn.functional.pad(ids, (0, width - ids.shape[1]), value=pad) for ids, _ in outs])
    torch.default_generator.set_state(next(g for ids, g in outs if ids.shape[1] == width).get_state())
    return out


class _Decoders(threading.local):
    n = 1  # decoding threads for this thread's generate calls: the intra-op threads compact_decoding found


_DECODERS = _Decoders()


@torch.no_grad()  # grad mode is per thread: generate's no_grad does not reach a worker thread
def _decode_share(model, input_ids, logits_processor, stopping_criteria, generation_config, model_kwargs,
                  cache_key, share, stream):  # fmt: skip
    """The sampling loop for the batch rows `share`, on one intra-op thread, with `stream` drawing for the
    whole batch at every step (what torch.multinomial draws over all rows), so each row gets the numbers it
    would get in one loop over the batch. Returns the share's sequences and the stream."""
    torch.set_num_threads(1)
    pad = generation_config._pad_token_tensor
    batch = input_ids.shape[0]
    model_kwargs = {**_take_rows(model_kwargs, share), cache_key: copy.deepcopy(model_kwargs[cache_key])}
    input_ids = input_ids[share]
    unfinished = torch.ones(len(share), dtype=torch.long)
    rows = torch.arange(len(share))  # the share's rows the model's batch (and cache) hold, in order
    logits = _prefill_once(model, input_ids, generation_config, model_kwargs, cache_key)
    while True:
        probs = torch.nn.functional.softmax(logits_processor(input_ids[rows], logits), dim=-1)
        # torch.multinomial(probs, 1) over the whole batch is argmax(probs / q), q ~ Exp(1) of the batch's shape
        q = torch.empty(batch, probs.shape[-1], dtype=probs.dtype).exponential_(generator=stream)
        next_tokens = torch.zeros(len(share), dtype=torch.long)
        next_tokens[rows] = (probs / q[share[rows]]).argmax(-1)
        next_tokens = next_tokens * unfinished + pad * (1 - unfinished)  # ended rows: pad, as in generate
        input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
        unfinished = unfinished & ~stopping_criteria(input_ids, None)
        if unfinished.max() == 0:
            return input_ids, stream
        live = unfinished[rows].bool()
        if (~live).sum() >= max(1, COMPACT_SHARE * len(rows)):
            keep = live.nonzero().squeeze(1)
            model_kwargs[cache_key].reorder_cache(keep)
            model_kwargs = _take_rows(model_kwargs, keep)
            rows = rows[keep]
        inputs = model.prepare_inputs_for_generation(input_ids[rows], next_sequence_length=1, **model_kwargs)
        outputs = model(**inputs, return_dict=True)
        model_kwargs = model._update_model_kwargs_for_generation(outputs, model_kwargs)
        logits = outputs.logits[:, -1].to(copy=True, dtype=torch.float32)
        del outputs


def _prefill_once(model, input_ids, generation_config, model_kwargs: dict, cache_key: str) -> torch.Tensor:
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
        outputs[cache_key].reorder_cache(inverse)
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
    """For the call, `model.generate` on a CPU decodes with `compact_sample` (elsewhere: unchanged): one share
    of the rows per intra-op thread the caller had, each on one intra-op thread.

    One intra-op thread a share: the decode step's ops are small (<= 128 rows x 256), and a second intra-op
    thread made a rollout round or an evaluation slower, not faster (BENCH: bench/cpu_profile.py --threads);
    a second share on its own thread uses the core (bench/cpu_profile.py --shares). Pinned, the tokens do not
    depend on the process's thread setting.
    `compact_sample` is an instance attribute, removed afterwards, so callers that build their own generate
    call (TRL's rollouts) get it too. Not under torch.distributed: generate's `synced_gpus` (FSDP, ZeRO-3)
    does not reach a `custom_generate`."""
    if model is None or model.device.type != "cpu":
        yield
        return
    threads, decoders = torch.get_num_threads(), _DECODERS.n
    torch.set_num_threads(1)
    _DECODERS.n = threads
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
        _DECODERS.n = decoders
