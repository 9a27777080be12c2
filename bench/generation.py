"""Decode-step time of the step benchmark's model against its floor, eager vs compiled generation.

    python -m bench.generation --batch 256 --prompt 64 --new 64,192 --out bench_gen
    python -m bench.generation --config-dir bench/configs/qwen2.5-1.5b --batch 128 --prompt 192 --new 64,384 \
        --backends compiled --deterministic --kv-writes false --profile 64     # deterministic: true's cost

The per-step time is the difference of two generate calls with N1 and N2 new tokens over N2 - N1 (prefill
and set-up cancel). The floor of one decode step is the larger of its bytes at --bandwidth (the H200's
4.8 TB/s datasheet figure) and its FLOPs at --flops: every weight read once (the embedding table only for
the batch's rows), each linear-attention layer's recurrent and conv state read and written, each full-
attention layer's K/V read up to the mean position and the new K/V written, the logits written.
The model is bench/models.py's random Qwen3.5 (bench/grpo_step.py's flags), or with --config-dir a random-init
model of a config.json (e.g. artifacts/smollm2: SmolLM2-135M's Llama, float32 masters as in
configs/smollm2.yaml); rollouts never stop early (no stop tokens).
"""

import argparse
import contextlib
import copy
import hashlib
import json
import tempfile
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from bench.grpo_step import determinism_flags
from bench.models import padded_tokenizer, random_qwen35
from engine import generation
from trainer.setup import apply_determinism


def floor(model, batch: int, prompt: int, new: tuple[int, int], bandwidth: float, flops: float) -> dict:
    text = model.config.get_text_config()
    named = {n: p for n, p in model.named_parameters() if "visual" not in n}
    embed = model.get_input_embeddings().weight
    weights = sum(p.numel() * p.element_size() for p in named.values()) - embed.numel() * embed.element_size()
    tied = model.get_output_embeddings().weight.data_ptr() == embed.data_ptr()
    weights += embed.numel() * embed.element_size() if tied else 0  # the output layer reads it whole
    weights += batch * embed.shape[1] * embed.element_size()
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    linear = types.count("linear_attention")
    full = len(types) - linear
    state = 0
    if linear:
        heads_v, dk, dv = text.linear_num_value_heads, text.linear_key_head_dim, text.linear_value_head_dim
        recurrent = batch * heads_v * dk * dv * 4  # fp32 state
        conv_dim = 2 * text.linear_num_key_heads * dk + heads_v * dv
        conv = batch * conv_dim * text.linear_conv_kernel_dim * 2
        state = linear * 2 * (recurrent + conv)  # read and written
    mean_pos = prompt + (new[0] + new[1]) / 2
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    # K and V in the model's dtype (a float32 model's cache is float32), up to the mean position
    kv = full * batch * text.num_key_value_heads * head_dim * 2 * embed.element_size() * (mean_pos + 1)
    logits = batch * text.vocab_size * 2
    total = weights + state + kv + logits
    matmul = (
        2 * batch * (sum(p.numel() for n, p in named.items() if p.ndim == 2) - embed.numel() * (not tied))
    )
    return {
        "bytes": total,
        "bytes_parts": {"weights": weights, "linear_state": state, "kv": kv, "logits": logits},
        "flops": matmul,
        "floor_ms": 1e3 * max(total / bandwidth, matmul / flops),
    }


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_calls(model, prompts, config, new: tuple[int, int], shapes, pad: int, repeats: int) -> dict:
    seconds = {}
    for n in (new[0], new[1]) * repeats + (new[0], new[1]):  # the first pair warms up (compiles)
        cfg = copy.deepcopy(config)
        cfg.max_new_tokens = n
        sync()
        t0 = time.perf_counter()
        tokens = generation.generate_call(model, prompts, cfg, shapes, pad)
        sync()
        seconds.setdefault(n, []).append(time.perf_counter() - t0)
        assert all(len(t) == n for t in tokens), "a rollout stopped early"
    best = {n: min(s[1:]) for n, s in seconds.items()}
    # the last call's tokens (its seed state is the same in every run of one command): equal digests across
    # --deterministic variants mean the variants sampled the same rollouts
    digest = hashlib.sha256(json.dumps(tokens).encode()).hexdigest()
    step = (best[new[1]] - best[new[0]]) / (new[1] - new[0])
    if step <= 0:  # seen on a busy 2-core CPU with --new 2,4: the figure is noise, and the bench says so
        print(f"step_ms {1e3 * step:.3f}: the two lengths' times are within their noise (widen --new)")
    return {
        "seconds": seconds,
        "step_ms": 1e3 * step,
        "tokens_per_s": len(prompts) * new[1] / best[new[1]],
        "first_call_s": seconds[new[0]][0],
        "last_tokens_sha256": digest,
    }


def profile(model, prompts, config, shapes, pad: int, new: int) -> dict:
    """Where a decode step goes, over one warm call of `new` tokens (the last backend's config): GPU time
    per kernel, and the GPU's busy time against the call's wall time (the rest is the GPU waiting on the
    host: launches, Python, the per-token sync of generate's stopping check). Printed; returned."""
    cfg = copy.deepcopy(config)
    cfg.max_new_tokens = new
    with generation.eval_mode(model):
        generation.generate_call(model, prompts, cfg, shapes, pad)
        sync()
        t0 = time.perf_counter()
        generation.generate_call(model, prompts, cfg, shapes, pad)
        sync()
        wall = time.perf_counter() - t0
        activities = [torch.profiler.ProfilerActivity.CPU]  # CPU: a smoke run, no kernels to count
        activities += [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else []
        with torch.profiler.profile(activities=activities) as prof:
            generation.generate_call(model, prompts, cfg, shapes, pad)
            sync()
    events = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=20), flush=True)
    with tempfile.TemporaryDirectory() as tmp:  # the trace is tens of MB: only its kernel spans are kept
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        trace_events = json.loads(trace.read_text())["traceEvents"]
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in trace_events if e.get("cat") == "kernel")
    busy, end = 0.0, None  # union of kernel intervals (us): streams may overlap
    for start, stop in spans:
        if end is None or start > end:
            busy += stop - start
            end = stop
        elif stop > end:
            busy += stop - end
            end = stop
    result = {
        "wall_ms_per_token": 1e3 * wall / new,
        "gpu_busy_ms_per_token": busy / 1e3 / new,
        "kernels_per_token": len(spans) / new,
        "kernels": [
            {"kernel": e.key[:120], "calls": e.count, "ms_per_step": e.device_time_total / 1e3 / new}
            for e in events[:20]
        ],
    }
    print("profile", json.dumps({k: v for k, v in result.items() if k != "kernels"}), flush=True)
    return result


def config_model(directory: Path, seed: int, device: torch.device, dtype: torch.dtype = torch.float32):
    """A seeded random-init model of `directory`'s config.json in `dtype`, and its pad id."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(directory)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype).to(device).eval()
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    return model, pad


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--config-dir", type=Path, help="a random-init model of this config.json instead")
    # float32: the rollouts' dtype (the policy's float32 masters on TF32 cores); bfloat16: the evaluation's copy,
    # or rollouts from a bf16 copy of the policy
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new", default="64,192", help="N1,N2 new tokens")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--backends", default="eager,compiled", help="of eager, compiled, compiled-torch, compiled-sync"
    )
    ap.add_argument("--bandwidth", type=float, default=4.8e12)
    ap.add_argument("--flops", type=float, default=790e12, help="bf16 matmul rate (KINDS.md measured)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--profile", type=int, default=0, help="also profile one call of N new tokens (CUDA)")
    ap.add_argument("--block-v", type=int, help="the Triton decode kernel's tile width (default its BLOCK_V)")
    ap.add_argument("--num-warps", type=int, help="the Triton decode kernel's warps (default its NUM_WARPS)")
    determinism_flags(ap)
    a = ap.parse_args(argv)
    apply_determinism(a)  # before any CUDA work, as trainer.train does
    a.p_ended, a.cap = 0.0, 1
    if a.block_v or a.num_warps:
        from engine import gated_delta_kernel

        gated_delta_kernel.BLOCK_V = a.block_v or gated_delta_kernel.BLOCK_V
        gated_delta_kernel.NUM_WARPS = a.num_warps or gated_delta_kernel.NUM_WARPS
    new = tuple(int(x) for x in a.new.split(","))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # CPU: a smoke run
    dtype = getattr(torch, a.dtype)
    if a.config_dir:
        model, pad = config_model(a.config_dir, a.seed, device, dtype)
        a.vocab = model.config.vocab_size
    else:
        tok = padded_tokenizer(a.vocab)
        model, pad = random_qwen35(a, tok, device).to(dtype).eval(), tok.pad_token_id
    g = torch.Generator().manual_seed(a.seed)
    prompts = torch.randint(10, min(1000, a.vocab), (a.batch, a.prompt), generator=g).tolist()
    result = {
        "args": vars(a) | {"out": str(a.out), "config_dir": str(a.config_dir)},
        "floor": floor(model, a.batch, a.prompt, new, a.bandwidth, a.flops),
    }
    result["floor"]["params"] = sum(p.numel() for n, p in model.named_parameters() if "visual" not in n)
    base = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, eos_token_id=None, pad_token_id=pad
    )
    shapes = generation.FixedShapes(a.batch, 64, new[1])
    for backend in a.backends.split(","):
        config = copy.deepcopy(base)
        config.disable_compile = True
        if backend.startswith("compiled"):
            config = generation.compiled_config(base, shapes, a.prompt)
        # compiled-torch: compiled, with transformers' own decode-step functions instead of ours (fused_decode);
        # compiled-sync: compiled, with generate's stopping check read every step (no deferred_stop_check)
        fused, deferred = generation.fused_decode, generation.DEFERRED_STOP_DEVICES
        if backend == "compiled-torch":
            generation.fused_decode = lambda model: contextlib.nullcontext()
        if backend == "compiled-sync":
            generation.DEFERRED_STOP_DEVICES = ()
        try:
            with generation.eval_mode(model):
                result[backend] = time_calls(model, prompts, config, new, shapes, pad, a.repeats)
        finally:
            generation.fused_decode, generation.DEFERRED_STOP_DEVICES = fused, deferred
        result[backend]["over_floor"] = result[backend]["step_ms"] / result["floor"]["floor_ms"]
        print(backend, json.dumps({k: v for k, v in result[backend].items() if k != "seconds"}), flush=True)
    print("floor", json.dumps(result["floor"]), flush=True)
    if a.profile:
        result["profile"] = profile(model, prompts, config, shapes, pad, a.profile)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "generation.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
