"""Time (and profile) one GRPO step's training pass alone: forward + backward of every micro-batch, with TRL's
fused LM head (log-probs and entropies, as GRPOTrainer calls it), on the step benchmark's random Qwen3.5.

    python -m bench.training_pass --rows 256 --prompt 128 --completion 1024 --micro-batch 16 --profile
    python -m bench.training_pass --hidden 64 --layers 4 --intermediate 128 --vocab 600 --rows 8 \\
        --prompt 8 --completion 24 --micro-batch 4                                   # CPU smoke run

The loss is GRPO's at beta 0 with one iteration (advantage x log-prob, masked mean), which is what the step's
training phase computes; what surrounds it in a step (generation, grading, the optimizer) is not timed here.
The floor printed beside the time counts the matmul FLOPs of a training pass (forward + backward: 3x the
forward's 2 x params x tokens, the LM head over completion tokens only, its forward recomputed in the backward)
at the H200's dense bf16 rate.
"""

import argparse
import contextlib
import importlib.metadata
import inspect
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from trl.trainer.utils import add_fused_lm_head

from bench.models import padded_tokenizer, random_qwen35
from engine.chunked_gated_delta import NAME, chunked_gated_delta_rule, compiled_rule
from engine.compiled_parts import compiled_parts
from engine.fla_conv import fla_conv

H200_BF16_FLOPS = 790e12  # dense, the device README's figure


def floor_flops(model, rows: int, prompt: int, completion: int) -> float:
    text = model.config.get_text_config()
    head = text.vocab_size * text.hidden_size
    body = sum(p.numel() for n, p in model.named_parameters() if "visual" not in n) - 2 * head
    tokens = rows * (prompt + completion)
    return 6 * body * tokens + 8 * head * rows * completion  # head: forward, recompute, two gradient products


def batch(rows: int, prompt: int, completion: int, vocab: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (rows, prompt + completion), generator=g)
    mask = torch.ones_like(ids)
    for r in range(rows):  # left-padded prompts of varying length, as the trainer hands them over
        mask[r, : int(torch.randint(0, prompt // 4 + 1, (1,), generator=g))] = 0
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "advantages": torch.randn(rows, generator=g).to(device),
    }


def micro_step(model, b: dict, lo: int, hi: int, completion: int) -> None:
    ids, mask = b["input_ids"][lo:hi], b["attention_mask"][lo:hi]
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=ids.device.type == "cuda"):
        out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    logps = out.log_probs[:, -completion:]
    loss = -(logps * b["advantages"][lo:hi, None]).mean()
    loss.backward()


def training_pass(model, b: dict, micro: int, completion: int) -> float:
    sync()
    t0 = time.perf_counter()
    for lo in range(0, b["input_ids"].shape[0], micro):
        micro_step(model, b, lo, lo + micro, completion)
    sync()
    return time.perf_counter() - t0


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def profile(model, b: dict, micro: int, completion: int, top: int) -> dict:
    return profile_call(lambda: micro_step(model, b, 0, micro, completion), top)


def profile_call(call, top: int) -> dict:
    """One call under torch.profiler: wall time, device-busy time and the `top` ops by self device time."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    sync()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        call()
        sync()
    wall = time.perf_counter() - t0
    events = prof.key_averages()
    device_key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    rows = sorted(events, key=lambda e: getattr(e, device_key), reverse=True)
    table = [
        {
            "name": e.key[:120],
            "calls": e.count,
            "self_device_ms": getattr(e, device_key) / 1e3,
            "cpu_total_ms": e.cpu_time_total / 1e3,
        }
        for e in rows[:top]
    ]
    busy = sum(getattr(e, device_key) for e in events) / 1e3
    return {"wall_ms": wall * 1e3, "device_busy_ms": busy, "top": table}


def torch_fallback(bound):
    """transformers' torch reference under the name it binds: with fla importable that name dispatches to fla
    (transformers' `use_kernel_func_from_hub_with_fallback`), and `__wrapped__` leads back to the reference."""
    return inspect.unwrap(bound)


def fla_rule():
    """flash-linear-attention's chunked rule, what transformers binds when fla imports. fla 0.6.0 routes its
    backward's dq/dk/dw/dg kernel to tilelang on Hopper with Triton >= 3.4 (its Triton kernel is wrong there,
    fla #640) when tilelang and nvcc are present (`fla_versions()["tilelang_usable"]`; TileLang logs its compile)."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def fla_versions() -> dict:
    """What an `fla` row ran on: fla's and tilelang's versions, and whether fla may use tilelang here."""
    out = {}
    for dist in ("fla-core", "tilelang"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    if out["fla-core"]:
        from fla.backends import TileLangBackend

        out["tilelang_usable"] = TileLangBackend.is_available() and TileLangBackend().is_enabled()
    return out


@contextlib.contextmanager
def rule_in_place(model, rule: str) -> Iterator[None]:
    """The chosen chunked rule under the name the layers look up at each call, the bound one again after."""
    module = gdn_module(model)
    bound = getattr(module, NAME)
    rules = {"ours": lambda: chunked_gated_delta_rule, "ours-compiled-terms": compiled_rule}
    rules |= {"transformers": lambda: torch_fallback(bound), "fla": fla_rule}
    rules["compiled"] = lambda: torch.compile(torch_fallback(bound))
    setattr(module, NAME, rules[rule]())
    try:
        yield
    finally:
        setattr(module, NAME, bound)


def gdn_module(model):
    """The modeling module whose forward looks the chunked rule (NAME) up by name at each call."""
    return sys.modules[type(model.model.language_model.layers[0].linear_attn).__module__]


def time_gdn_function(model, micro: int, length: int, repeats: int = 3) -> float:
    """Seconds of the chunked gated delta rule alone (forward + backward, every linear-attention layer of one
    micro-batch), at the shapes the model's layers call it with: its share of a micro-batch's pass."""
    text = model.config.get_text_config()
    layers = sum(t == "linear_attention" for t in text.layer_types)
    hv, dk, dv = (
        text.linear_num_value_heads,
        text.linear_key_head_dim,
        text.linear_value_head_dim,
    )
    device, fn = model.device, getattr(gdn_module(model), NAME)
    g = torch.Generator(device=device).manual_seed(0)

    def leaf(*shape, scale=1.0):
        x = torch.randn(*shape, device=device, generator=g, dtype=torch.bfloat16) * scale
        return x.requires_grad_()

    # key heads repeated to the value heads, as transformers 5.17's layer passes them (5.24 repeats inside the
    # function; these shapes suit both)
    q, k = leaf(micro, length, hv, dk), leaf(micro, length, hv, dk)
    v = leaf(micro, length, hv, dv)
    decay = (-torch.rand(micro, length, hv, device=device, generator=g)).requires_grad_()
    beta = torch.rand(micro, length, hv, device=device, generator=g, dtype=torch.bfloat16).requires_grad_()

    def once():
        out, _ = fn(q, k, v, g=decay, beta=beta, use_qk_l2norm_in_kernel=True)
        out.float().square().mean().backward()

    once()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        for _ in range(layers):
            once()
    sync()
    return (time.perf_counter() - t0) / repeats


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--rows", type=int, default=256, help="rows of one step")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--completion", type=int, default=1024)
    ap.add_argument("--micro-batch", type=int, default=16)
    ap.add_argument("--checkpointing", action="store_true")
    ap.add_argument("--repeats", type=int, default=2, help="timed passes after one warm-up pass")
    ap.add_argument("--profile", action="store_true", help="also profile one micro-batch")
    ap.add_argument(
        "--rule",
        choices=("transformers", "ours", "ours-compiled-terms", "compiled", "fla"),
        default="ours",
        help="the linear attention's chunked gated delta rule: transformers' torch fallback (plain TRL's without "
        "fla), ours (engine/chunked_gated_delta.py, the trainer's on GPUs without fla), ours with its "
        "chunk-parallel part compiled (compile_gated_delta_terms), transformers' under torch.compile, or "
        "flash-linear-attention's kernels (what transformers and the trainer run when fla is installed)",
    )
    ap.add_argument(
        "--compile-norms-mlp", action="store_true", help="norms and MLPs compiled (engine/compiled_parts.py)"
    )
    ap.add_argument(
        "--fla-conv",
        action="store_true",
        help="the causal conv through fla's Triton kernel (engine/fla_conv.py; needs fla and CUDA)",
    )
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="writes training_pass.json")
    a = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.fla_conv and (device.type != "cuda" or not fla_versions()["fla-core"]):
        sys.exit(
            "--fla-conv: needs flash-linear-attention installed and a CUDA device (its kernel is Triton's)"
        )
    a.p_ended, a.cap = 0, a.completion  # what random_qwen35 reads besides the sizes: no extra stop tokens
    model = random_qwen35(a, padded_tokenizer(a.vocab), device)
    model.train()
    if a.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))  # as GRPOTrainer.__init__ does
    with (
        rule_in_place(model, a.rule),
        compiled_parts(model, a.compile_norms_mlp),
        fla_conv(model, a.fla_conv),
    ):
        b = batch(a.rows, a.prompt, a.completion, a.vocab, device)
        warm = training_pass(model, b, a.micro_batch, a.completion)  # with --rule compiled, the compile too
        times = [training_pass(model, b, a.micro_batch, a.completion) for _ in range(a.repeats)]
        flops = floor_flops(model, a.rows, a.prompt, a.completion)
        result = {
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
            "torch": torch.__version__,
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "fla": fla_versions(),
            "warm_up_s": warm,
            "pass_s": times,
            "floor_s": flops / H200_BF16_FLOPS,
            "floor_tflop": flops / 1e12,
            "peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None,
        }
        micro_batches = -(-a.rows // a.micro_batch)
        gdn = time_gdn_function(model, a.micro_batch, a.prompt + a.completion)
        result["gated_delta_rule_s"] = gdn * micro_batches  # the pass's share in that one function
        print(json.dumps({k: v for k, v in result.items() if k != "args"}), flush=True)
        if a.profile:
            result["profile"] = profile(model, b, a.micro_batch, a.completion, a.top)
            p = result["profile"]
            print(
                f"profile of one micro-batch: wall {p['wall_ms']:.1f} ms, device busy {p['device_busy_ms']:.1f} ms"
            )
            for row in p["top"]:
                print(f"{row['self_device_ms']:10.2f} ms {row['calls']:6d}x  {row['name']}")
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "training_pass.json").write_text(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
