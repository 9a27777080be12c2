"""Benchmark CPUAdamW against torch.optim.AdamW, and the stateNNN/ save / verified-load throughput.

    .venv/bin/python -m bench.cpu_adamw                         # CPU: ~3M and ~100M parameters
    python -m bench.cpu_adamw --device cuda --params 2e9        # GPU: also peak GPU memory
    python -m bench.cpu_adamw --device cuda --params 1.8e9 --on-device   # the state on the GPU too

The model is a stack of square bias-free Linear weights (no forward pass: gradients are random), so
the figures are the optimizer's alone. On CPU both optimizers update fp32 parameters in place of the
model; on CUDA CPUAdamW drives bf16 parameters on the GPU (fp32 state on the host) and AdamW the usual
fp32 parameters with fp32 state on the GPU. Save and load go through the page cache: on a machine
with enough free RAM the load figure measures hashing and deserialisation more than the disk.
"""

import argparse
import gc
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from engine.cpu_adamw import CPUAdamW
from rundir.state import load_state, save_state


def make_params(n: float, device: str, dtype: torch.dtype) -> list[tuple[str, torch.nn.Parameter]]:
    width = 512 if n < 1e7 else 2048 if n < 1e9 else 8192
    layers = max(1, round(n / width**2))
    g = torch.Generator(device).manual_seed(0)
    params = []
    for i in range(layers):
        p = torch.nn.Parameter(torch.randn(width, width, generator=g, device=device, dtype=dtype) * 0.02)
        p.grad = torch.randn(width, width, generator=g, device=device, dtype=dtype) * 1e-3
        params.append((f"layers.{i}.weight", p))
    return params


def time_steps(opt, steps: int, device: str) -> float:
    """Median seconds per step, after one warm-up step that allocates the state."""
    times = []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[1:])


def run_optimizer(kind: str, n: float, args) -> tuple[float, float | None, CPUAdamW | None, int]:
    """(seconds per step, peak GPU GiB or None, the optimizer if CPUAdamW, parameter count)."""
    cuda = args.device == "cuda"
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    dtype = torch.bfloat16 if cuda and kind == "cpu_adamw" else torch.float32
    params = make_params(n, args.device, dtype)
    count = sum(p.numel() for _, p in params)
    if kind == "cpu_adamw":
        opt = CPUAdamW(
            params, lr=1e-5, weight_decay=0.1, chunk_elems=args.chunk_elems, on_device=args.on_device
        )
    else:
        opt = torch.optim.AdamW([p for _, p in params], lr=1e-5, weight_decay=0.1)
    seconds = time_steps(opt, args.steps, args.device)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    return seconds, peak, opt if kind == "cpu_adamw" else None, count


def bench_state(opt: CPUAdamW, state_dir: Path) -> tuple[float, float, float]:
    """(GB written, save GB/s, verified-load GB/s)."""
    tensors, meta = opt.export_state()
    t0 = time.perf_counter()
    target = save_state(state_dir / "state001", tensors=tensors, meta={"optimizer": meta})
    save_s = time.perf_counter() - t0
    gb = sum(f.stat().st_size for f in target.iterdir()) / 1e9
    t0 = time.perf_counter()
    loaded, _ = load_state(target)
    load_s = time.perf_counter() - t0
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    return gb, gb / save_s, gb / load_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--params", type=float, nargs="+", default=[3e6, 1e8], help="parameter counts to run")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per optimizer (after one warm-up)")
    ap.add_argument("--chunk-elems", type=int, default=2**20, help="CPUAdamW chunk_elems")
    ap.add_argument("--on-device", action="store_true", help="CPUAdamW's state on the parameters' device")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--no-adamw", action="store_true", help="skip the torch.optim.AdamW baseline")
    ap.add_argument("--no-state", action="store_true", help="skip the state save/load measurement")
    ap.add_argument(
        "--state-dir", type=Path, default=None, help="where to write the state (default: a temp dir)"
    )
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    gpu = f", {torch.cuda.get_device_name()}" if args.device == "cuda" else ""
    print(f"# {platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads{gpu}, "
          f"torch {torch.__version__}, chunk_elems={args.chunk_elems}")  # fmt: skip
    for n in args.params:
        seconds, peak, opt, count = run_optimizer("cpu_adamw", n, args)
        where = "state on the device" if args.on_device else "state on the host"
        line = f"params={count / 1e6:.1f}M  CPUAdamW ({where}) step {seconds * 1e3:.1f} ms"
        if peak is not None:
            line += f" (peak GPU {peak:.2f} GiB)"
        if not args.no_state:
            with tempfile.TemporaryDirectory(dir=args.state_dir) as d:
                gb, save_gbs, load_gbs = bench_state(opt, Path(d))
            line += f"  state {gb:.2f} GB: save {save_gbs:.2f} GB/s, verified load {load_gbs:.2f} GB/s"
        del opt
        if not args.no_adamw:
            seconds, peak, _, _ = run_optimizer("adamw", n, args)
            line += f"  |  torch AdamW step {seconds * 1e3:.1f} ms"
            if peak is not None:
                line += f" (peak GPU {peak:.2f} GiB)"
        print(line, flush=True)


if __name__ == "__main__":
    main()
