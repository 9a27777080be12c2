"""bench/grpo_step.py's result in words: the steady-state means, the markdown table, the comparison with an
earlier result (--compare-with) and the environment the timings depend on."""

import importlib.util
import json
import os
import statistics
from pathlib import Path

import torch

from bench.probe import COLUMNS

# what --compare-with checks
COMPARED = ("sampled", "qualified", "trained", "loss", "grad_norm", "eval_sha256")


def steady(steps: list[dict], key: str) -> float:
    """Mean over the steps after the first (warm-up: allocator, kernels); the only step if there is one."""
    rows = steps[1:] or steps
    return statistics.mean(r["seconds"][key] for r in rows)


def markdown(result: dict) -> str:
    head = "| run | step | " + " | ".join(f"{c} s" for c in COLUMNS) + " | tok/s | sampled/trained | "
    head += "qualified | loss | peak GPU GiB | device GiB | peak host GiB |\n|" + "---|" * (len(COLUMNS) + 9)
    head += "\n"
    lines = []
    for name, run in result["runs"].items():
        for r in run["steps"]:
            cells = [
                name,
                r["step"],
                *(f"{r['seconds'][c]:.2f}" for c in COLUMNS),
                f"{r['tokens_per_s']:.0f}",
            ]
            cells += [
                f"{r['sampled']}/{r['trained']}",
                r["qualified"],
                _fmt(r.get("loss")),
                _fmt(r["peak_gpu_gib"]),
                _fmt(r.get("device_gib")),
                _fmt(r.get("peak_host_gib")),
            ]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    text = head + "\n".join(lines) + "\n\n"
    for name, run in result["runs"].items():
        text += f"{name}: {run['params']:,} parameters, {run['optimizer']}, {run['distributed_type']}, "
        text += f"trainer built in {run.get('init_seconds', 0):.1f} s, "
        text += ", ".join(f"{k} {v}" for k, v in run["settings"].items())
        text += ", sharded\n" if run["sharded"] else "\n"
    for name, run in result["runs"].items():
        for r in run["steps"]:
            if agree := r.get("sampler_agreement"):
                text += f"{name} step {r['step']} vLLM vs trainer log-probs: " + ", ".join(
                    f"{k} {_fmt(v)}" for k, v in agree.items()
                )
                text += "\n"
    for name, why in result.get("skipped", {}).items():
        text += f"{name}: skipped ({why})\n"
    for other in ("plain", "plain_tuned"):
        if ratio := result.get(f"ratio_ours_over_{other}"):
            text += f"\nours / {other} (steady-state mean): " + ", ".join(
                f"{k} {v:.3f}" for k, v in ratio.items()
            )
    return text + "\n"


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.4g}"


def compare(result: dict, path: Path, rtol: float) -> list[str]:
    """Per step and run, the COMPARED fields of this result against the one at `path`: counts must be equal,
    loss and grad norm within `rtol` (relative; each such pair is listed either way)."""
    other = json.loads(path.read_text())
    lines = []
    for name, run in result["runs"].items():
        theirs = {r["step"]: r for r in other["runs"].get(name, {}).get("steps", [])}
        for r in run["steps"]:
            t = theirs.get(r["step"])
            if t is None:
                lines.append(f"DIFFERS {name} step {r['step']}: not in {path}")
                continue
            for key in COMPARED:
                mine, ref = r.get(key), t.get(key)
                if isinstance(mine, float) and isinstance(ref, float):
                    rel = abs(mine - ref) / max(abs(ref), 1e-12)
                    verdict = "equal" if rel <= rtol else "DIFFERS"
                    lines.append(
                        f"{verdict} {name} step {r['step']} {key}: {mine:.7g} here, {ref:.7g} there, rel {rel:.2g}"
                    )
                elif mine != ref:
                    lines.append(f"DIFFERS {name} step {r['step']} {key}: {mine} here, {ref} in {path}")
        mine, ref = run.get("weights_sha256"), other["runs"].get(name, {}).get("weights_sha256")
        if mine and ref:
            lines.append(
                f"{'equal' if mine == ref else 'DIFFERS'} {name} weights sha256 {mine[:16]}, {ref[:16]} there"
            )
    return lines


def environment(device: torch.device) -> dict:
    """What the timings depend on. Without `fla` and `causal_conv1d`, transformers runs the gated-delta-net
    layers on its PyTorch fallbacks (correct, much slower); with them importable it uses them by itself."""
    import transformers
    import trl

    have = {name: importlib.util.find_spec(name) is not None for name in ("fla", "causal_conv1d", "vllm")}
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "trl": trl.__version__,
        **have,
    }
