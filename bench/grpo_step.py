"""Time GRPO steps of one arm with CapGRPOTrainer and, side by side, with plain TRL `GRPOTrainer`.

    python -m bench.grpo_step --steps 2 --groups 32 --G 8 --cap 1024 --arm S2 --out bench_out
    python -m bench.grpo_step --hidden 64 --layers 4 --intermediate 128 --vocab 600 \\
        --groups 2 --G 4 --cap 16 --steps 1                                       # CPU smoke run
    accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 -m bench.grpo_step \\
        ... --no-plain --out bench_2gpu --compare-with bench_1gpu/grpo_step.json
    python -m bench.grpo_step --p-ended 0 --vllm --out bench_vllm    # + ours and plain TRL on vLLM colocate

--vllm adds `ours-vllm` and `plain-vllm` (`--vllm-sleep`: `ours-vllm-sleep` too), each in a process of its own
(an engine sets up torch.distributed and vLLM's globals once per process), at ours' micro-batch and
checkpointing when ours ran first, so that all four train alike; without vLLM installed they are skipped
with one line. vLLM comes to the GPU machine with tools/vllm_bundle.py (docs/gpu.md).

Ours trains in the micro-batches our trainer sizes (engine/micro_batch.py) unless --ours-batch / --ours-grad-ckpt
say otherwise; plain TRL at --batch with checkpointing (its defaults), and with --plain-tuned once more at ours'
micro-batch and checkpointing, so a ratio against plain-tuned is what our trainer adds beyond those settings.

Per step: seconds in generation, grading, training (log-prob forward + backward of every micro-batch),
optimizer step, optional eval and checkpoint; tokens generated per second; groups sampled per group
trained; CUDA graphs recorded (0 once the compiled decode step replays); peak GPU memory. Both trainers get the same model (rebuilt from the same seed), tasks in the same
order, seeds and settings. Ours runs with one selection round of `groups` problems, so it samples exactly
what plain TRL samples; `--refill` adds a run of ours with the arm's gate refilling (up to 8 rounds).

Random weights never answer anything, so grading is a seeded coin (docs/gpu.md): a rollout that really
hit the cap is `truncated`; any other is `correct` with probability --p-correct, `format_rejected` with
--p-format, else `wrong`, drawn from sha256(seed, task id, rollout index in its group, step). A random
model almost never emits its EOS token, so `--model random-qwen35` declares K extra stop tokens in the
generation config (real EOS ids to generation and to truncation detection alike), K chosen so that
about --p-ended of the rollouts end before the cap; K = 0 with --p-ended 0 (every rollout capped: the coin then
grades capped rollouts too, so that groups qualify and both trainers train every row). At the
defaults K = 168: past ~22 stop ids transformers' EOS test waits for the GPU every token (engine/generation.py
`eos_stopped` is ours without the wait; plain TRL keeps transformers').
"""

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.coin import bench_tasks
from bench.report import COMPARED, compare, environment, markdown, steady
from bench.runs import VLLM_RUNS, run_arm
from engine import generation
from policy.arms import ALL_ARMS
from trainer.setup import apply_determinism


def true_false(text: str) -> bool:
    return {"true": True, "false": False}[text.lower()]


def determinism_flags(ap: argparse.ArgumentParser, note: str = "") -> None:
    """The trainer's determinism switches as bench flags (trainer/setup.py apply_determinism reads them)."""
    ap.add_argument("--deterministic", action="store_true", help=f"deterministic: true; {note}".rstrip("; "))
    ap.add_argument(
        "--no-fill-memory",
        dest="deterministic_fill_memory",
        action="store_false",
        help="with --deterministic: deterministic_fill_memory false (no fill of new tensors' memory)",
    )
    ap.add_argument(
        "--kv-writes",
        dest="deterministic_kv_writes",
        type=true_false,
        nargs="?",
        const=True,
        default=True,
        help="with --deterministic: deterministic_kv_writes (engine/kv_writes.py; default true, as the trainer's)",
    )


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="random-qwen35", help="'random-qwen35' or a checkpoint directory")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--intermediate", type=int, default=6144)
    ap.add_argument("--vocab", type=int, default=248320)
    ap.add_argument("--arm", default="S2", choices=sorted(ALL_ARMS))
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--groups", type=int, default=32, help="groups per step (= problems sampled per step)")
    ap.add_argument("--G", type=int, default=8, help="rollouts per group")
    ap.add_argument("--cap", type=int, default=1024, help="max completion tokens")
    ap.add_argument("--batch", type=int, default=None, help="rows per micro-batch (default: 4 on CUDA, G)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--p-correct", type=float, default=0.3)
    ap.add_argument("--p-format", type=float, default=0.0)
    ap.add_argument(
        "--coin-rollouts",
        action="store_true",
        help="replace sampled rollouts by seeded ones (1- vs 2-GPU runs: nothing then depends on sampling)",
    )
    ap.add_argument("--p-ended", type=float, default=0.5, help="share of random-model rollouts ending early")
    ap.add_argument("--cpu-adamw", type=true_false, default=None)
    ap.add_argument(
        "--compile-gated-delta-terms",
        action="store_true",
        help="ours: compile_gated_delta_terms (the chunk-parallel part of our rule compiled)",
    )
    determinism_flags(ap, "--compare-with --rtol 0 checks two runs")
    ap.add_argument(
        "--compile-norms-mlp", action="store_true", help="ours: compile_norms_mlp (norms and MLPs compiled)"
    )
    ap.add_argument(
        "--fla-conv",
        type=true_false,
        default=None,
        help="ours: fla_causal_conv, fla's Triton causal conv in the training pass (default: on where fla is)",
    )
    ap.add_argument("--tf32", action="store_true", help="tf32: true (float32 products on TF32 tensor cores)")
    ap.add_argument(
        "--adamw-state-on-gpu",
        type=true_false,
        default=None,
        help="ours: CPUAdamW's state on the GPU (default: our trainer decides by its memory estimate)",
    )
    ap.add_argument("--no-grad-ckpt", action="store_true", help="CUDA: gradient checkpointing off")
    ap.add_argument(
        "--ours-batch",
        type=int,
        default=None,
        help="ours: rows per micro-batch (default: our trainer's sizing)",
    )
    ap.add_argument(
        "--ours-grad-ckpt",
        type=true_false,
        default=None,
        help="ours, CUDA: gradient checkpointing (default: our trainer's sizing)",
    )
    ap.add_argument(
        "--compiled",
        type=lambda s: {"auto": None, "true": True, "false": False}[s.lower()],
        default=None,
        help="ours: compiled generation (auto: on for one CUDA process)",
    )
    ap.add_argument(
        "--generation-cache",
        choices=("kept", "new"),
        default="kept",
        help="ours, compiled: one static cache kept per shape, or transformers' new cache per call",
    )
    ap.add_argument(
        "--plain-tuned", action="store_true", help="also plain TRL at ours' micro-batch and checkpointing"
    )
    ap.add_argument("--plain", action=argparse.BooleanOptionalAction, default=True, help="also plain TRL")
    ap.add_argument(
        "--plain-first", action="store_true", help="run plain TRL first (it then pays the CUDA warm-up)"
    )
    ap.add_argument("--refill", action="store_true", help="also ours with gate refill (8 rounds)")
    ap.add_argument("--vllm", action="store_true", help="also ours and plain TRL on vLLM colocate")
    ap.add_argument("--vllm-sleep", action="store_true", help="also ours on vLLM colocate with sleep mode")
    ap.add_argument(
        "--vllm-stale",
        action="store_true",
        help="also ours on vLLM with only the first weight push (its sampler agreement must fail; use --lr 1e-4)",
    )
    ap.add_argument("--lr", type=float, default=1e-6, help="learning rate (constant)")
    ap.add_argument("--vllm-memory", type=float, default=0.35, help="vllm_gpu_memory_utilization")
    ap.add_argument("--only", choices=VLLM_RUNS, help=argparse.SUPPRESS)  # a vLLM run's own process
    ap.add_argument("--settings-of-ours", help=argparse.SUPPRESS)  # "ROWS,CKPT" ours ran with
    ap.add_argument("--eval-problems", type=int, default=0, help="eval N problems after each step (0: off)")
    ap.add_argument("--checkpoint", action="store_true", help="time stepNNN/ (+ stateNNN/ for ours)")
    ap.add_argument("--out", type=Path, default=None, help="writes grpo_step.json and grpo_step.md")
    ap.add_argument("--compare-with", type=Path, default=None, help="a grpo_step.json to compare against")
    ap.add_argument(
        "--rtol", type=float, default=0.02, help="--compare-with: loss and grad norm tolerance (bf16)"
    )
    a = ap.parse_args(argv)
    if a.batch is None:
        a.batch = 4 if torch.cuda.is_available() else a.G
    return a


def in_own_process(argv: list[str], name: str, runs: dict, work: Path) -> dict:
    """One vLLM run in a fresh process of this script (same arguments, this run only), its record back."""
    out = work / f"{name}-result"
    subprocess.run(child_command(argv, name, runs, out), check=True)
    return json.loads((out / "grpo_step.json").read_text())["runs"][name]


def child_command(argv: list[str], name: str, runs: dict, out: Path) -> list[str]:
    """This script with `argv` less its outputs, for run `name` alone, told the settings ours ran with."""
    drop = {"--out", "--compare-with"}
    kept = [x for i, x in enumerate(argv) if x not in drop and (i == 0 or argv[i - 1] not in drop)]
    cmd = [sys.executable, "-m", "bench.grpo_step", *kept, "--only", name, "--out", str(out)]
    if "ours" in runs:
        settings = runs["ours"]["settings"]
        cmd += ["--settings-of-ours", f"{settings['micro_batch']},{settings['grad_ckpt']}"]
    return cmd


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    a = parse(argv)
    apply_determinism(a)  # --deterministic: before any CUDA work, as trainer.train does
    generation.KEEP_STATIC_CACHE = a.generation_cache == "kept"
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # CPU runs are smoke runs on small shared machines, where several intra-op threads oversubscribe
        torch.set_num_threads(1)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    env = environment(device)
    if rank0:
        print(f"environment: {json.dumps(env)}", flush=True)
        print(
            f"grading: seeded coin ({'every rollout by the coin (--p-ended 0)' if a.p_ended == 0 else 'truncated = hit the cap'}"
            f"{'; rollouts replaced by seeded ones' if a.coin_rollouts else ''}; else correct with p="
            f"{a.p_correct}, format_rejected with p={a.p_format}, else wrong)",
            flush=True,
        )
    result = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()}, "env": env}
    result["runs"] = runs = {}
    with tempfile.TemporaryDirectory(prefix="grpo_step-") as tmp:
        work = Path(tmp)
        tasks = bench_tasks(a, work)
        wanted = (a.vllm, a.vllm_sleep, a.vllm_stale, a.vllm)
        engines = [n for n, on in zip(VLLM_RUNS, wanted, strict=True) if on]
        pair = [("ours", 1)] + [(n, 1) for n in engines] + [("plain", 1)] * a.plain
        plan = (pair[::-1] if a.plain_first else pair) + [("plain-tuned", 1)] * a.plain_tuned
        plan = [(a.only, 1)] if a.only else plan + [("ours-refill", 8)] * a.refill
        if engines and not a.only and importlib.util.find_spec("vllm") is None:
            result["skipped"] = {n: "vLLM is not installed" for n in engines}
            plan = [(n, r) for n, r in plan if n not in engines]
            if rank0:
                print(
                    f"vLLM is not installed here: {', '.join(engines)} skipped (tools/vllm_bundle.py)",
                    flush=True,
                )
        for name, rounds in plan:
            t0 = time.perf_counter()
            if name in engines and not a.only:
                runs[name] = in_own_process(argv, name, runs, work)
            else:
                runs[name] = run_arm(a, name, tasks, work, device, rounds, runs)
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
            runs[name]["wall_seconds"] = round(time.perf_counter() - t0, 1)
            if "ours" in runs:
                for other in ("plain", "plain-tuned"):
                    if other in runs:
                        ratio = {
                            k: steady(runs["ours"]["steps"], k) / max(steady(runs[other]["steps"], k), 1e-9)
                            for k in ("generate", "train", "optimizer", "total")
                        }
                        ours_rate, their_rate = (
                            statistics.mean(
                                r["tokens_per_s"] for r in (runs[n]["steps"][1:] or runs[n]["steps"])
                            )
                            for n in ("ours", other)
                        )
                        ratio["tokens_per_s"] = ours_rate / max(their_rate, 1e-9)
                        result[f"ratio_ours_over_{other}".replace("-", "_")] = ratio
            if rank0 and a.out:  # after every run: a command stopped by its time limit keeps what it did
                a.out.mkdir(parents=True, exist_ok=True)
                (a.out / "grpo_step.json").write_text(json.dumps(result, indent=1) + "\n")
                (a.out / "grpo_step.md").write_text(markdown(result))
    if rank0:
        print(markdown(result), flush=True)
        if a.compare_with:
            lines = compare(result, a.compare_with, a.rtol)
            print(f"compared with {a.compare_with} ({', '.join(COMPARED)}; rtol {a.rtol}):")
            print("\n".join(lines))
            verdict = "DIFFERS" if any(x.startswith("DIFFERS") for x in lines) else "MATCH"
            print(f"comparison: {verdict}")
            result["comparison"] = {"with": str(a.compare_with), "verdict": verdict, "lines": lines}
            if a.out:
                (a.out / "grpo_step.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
