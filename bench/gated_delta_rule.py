"""Time transformers' chunked gated delta rule (Qwen3.5's linear attention in training) alone, forward and
backward, at one layer's shapes, in the ways the training pass could run it:

    python -m bench.gated_delta_rule --rows 16 --length 1152 --variants eager,ours,compiled --profile
    python -m bench.gated_delta_rule --rows 2 --length 128 --heads 4 --dim 16 --variants eager,ours  # CPU

`eager` is transformers' torch fallback (what plain TRL runs when fla is not installed); `ours` is
engine/chunked_gated_delta.py, what our training pass runs on GPUs; `compiled` is transformers' function under
torch.compile (Inductor fuses its float32 elementwise passes; the matmuls and triangular solves stay library
calls), `compiled-ours` ours under it (its chunk loop unrolls: one compilation per chunk count),
`ours-compiled-terms` ours with only its chunk-parallel part compiled, dynamic in the chunk count; `fla`
flash-linear-attention's kernels (bf16 Triton, with tilelang for one backward kernel on Hopper: what transformers
binds when fla is installed, and then `eager` is still its torch fallback); `+tf32` lets float32 products use TF32
tensor cores. Each variant's outputs and
input gradients are compared with eager's (max abs difference over max abs value), and its peak memory above
the inputs is recorded: what the micro-batch estimate has to cover.
"""

import argparse
import contextlib
import functools
import json
import time
from pathlib import Path

import torch
from transformers.models.qwen3_5 import modeling_qwen3_5

from bench.training_pass import fla_rule, fla_versions, profile_call, sync, torch_fallback
from engine.chunked_gated_delta import chunk_terms, chunked_gated_delta_rule
from engine.generation import tf32_matmuls


def inputs(rows: int, length: int, heads: int, dim: int, device) -> list[torch.Tensor]:
    """q, k, v, decay (log space, <= 0) and beta, as a Qwen3.5 layer hands them over: key heads already
    repeated to the value heads (transformers 5.17's layer does; 5.24's function accepts both)."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (
        torch.randn(rows, length, heads, dim, device=device, generator=g, dtype=torch.bfloat16) for _ in "qkv"
    )
    decay = -torch.rand(rows, length, heads, device=device, generator=g) * 0.1
    beta = torch.rand(rows, length, heads, device=device, generator=g, dtype=torch.bfloat16)
    return [x.requires_grad_() for x in (q, k, v, decay, beta)]


def run(fn, xs, grad_out) -> tuple[torch.Tensor, list[torch.Tensor]]:
    for x in xs:
        x.grad = None
    out, _ = fn(*xs[:3], g=xs[3], beta=xs[4], use_qk_l2norm_in_kernel=True)
    out.backward(grad_out)
    return out.detach(), [x.grad.detach() for x in xs]


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30)).item()


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=16, help="rows of a micro-batch")
    ap.add_argument("--length", type=int, default=1152, help="tokens of a row")
    ap.add_argument("--heads", type=int, default=32, help="value heads")
    ap.add_argument("--dim", type=int, default=128, help="key and value head dim")
    ap.add_argument("--variants", default="eager,ours,compiled")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--profile",
        action="store_true",
        help="also the top kernels of one eager, one ours and (when asked) one fla call",
    )
    ap.add_argument("--out", type=Path, default=None, help="writes gated_delta_rule.json")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fn = torch_fallback(modeling_qwen3_5.torch_chunk_gated_delta_rule)
    xs = inputs(a.rows, a.length, a.heads, a.dim, device)
    grad_out = torch.randn(a.rows, a.length, a.heads, a.dim, device=device, dtype=torch.bfloat16)
    reference = run(fn, xs, grad_out)
    functions = {"eager": fn, "ours": chunked_gated_delta_rule}
    functions |= {"compiled": torch.compile(fn), "compiled-ours": torch.compile(chunked_gated_delta_rule)}
    terms = torch.compile(chunk_terms, dynamic=True)
    functions["ours-compiled-terms"] = functools.partial(chunked_gated_delta_rule, terms=terms)
    if "fla" in a.variants.split(","):
        functions["fla"] = fla_rule()
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}, "variants": {}}
    result["torch"], result["device"], result["fla"] = torch.__version__, str(device), fla_versions()
    for name in a.variants.split(","):
        f = functions[name.removesuffix("+tf32")]
        scope = tf32_matmuls() if name.endswith("+tf32") else contextlib.nullcontext()
        with scope:
            t0 = time.perf_counter()
            out, grads = run(f, xs, grad_out)  # the first call: compilation for the compiled ones
            sync()
            first = time.perf_counter() - t0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            sync()
            t0 = time.perf_counter()
            for _ in range(a.repeats):
                run(f, xs, grad_out)
            sync()
            each = (time.perf_counter() - t0) / a.repeats
        row = {
            "first_call_s": first,
            "call_ms": each * 1e3,
            "out_rel_diff": rel_diff(out, reference[0]),
            "grad_rel_diff": {
                n: rel_diff(g, r) for n, g, r in zip(("q", "k", "v", "g", "beta"), grads, reference[1])
            },
            "peak_above_inputs_gib": (torch.cuda.max_memory_allocated() - base) / 2**30
            if device.type == "cuda"
            else None,
        }
        if "compiled" in name and a.length > 128:  # a row length the first call did not have
            shorter = inputs(a.rows, a.length - 64, a.heads, a.dim, device)
            t0 = time.perf_counter()
            with scope:
                run(f, shorter, grad_out[:, : a.length - 64])
            sync()
            row["first_call_other_length_s"] = time.perf_counter() - t0
        result["variants"][name] = row
        print(name, json.dumps(row), flush=True)
    for name in [n for n in ("eager", "ours", "fla") if n in functions] if a.profile else ():
        p = profile_call(lambda f=functions[name]: run(f, xs, grad_out), top=30)
        result[f"profile_{name}"] = p
        print(
            f"profile of one {name} call: wall {p['wall_ms']:.1f} ms, device busy {p['device_busy_ms']:.1f} ms"
        )
        for e in p["top"]:
            print(f"{e['self_device_ms']:9.2f} ms {e['calls']:5d}x  {e['name']}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "gated_delta_rule.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
