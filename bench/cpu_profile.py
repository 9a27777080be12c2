"""The embedded default's generation on a CPU, transformers' decoding loop vs ours (engine/cpu_generation.py).

Side by side in one process, interleaved: one in-training evaluation (the recipe's eval sets and spec) and
one rollout round (`problems_per_round` prompts x `num_generations`, as TRL calls generate), each
`--repeats` times per arm. Prints wall and CPU seconds (user+sys of this process) as min/median/max, the
rows computed per decode step, and checks that both arms give the same tokens. `--profile N` instead
prints cProfile's top N functions of one evaluation and one round with our loop. `--threads` instead times
one training micro-batch (forward + backward of `per_device_train_batch_size` rollouts) and one rollout
round at one and at two intra-op threads, interleaved, and checks that logits, gradients and tokens are
bitwise the same at both. `--shares` instead compares our loop with itself at one and at two intra-op
threads (the call's rows decoded in one share, or in two shares on two threads), same tokens checked.

    python -m bench.cpu_profile [--recipe configs/embedded.yaml] [--repeats 3] [--profile 25] [--threads]
                                [--shares]
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
import yaml
from transformers import GenerationConfig

from data.eval_sets import FIXED, HELDOUT, choose_eval_sets
from data.prompt import render_prompt
from data.snapshot import load_snapshot
from engine import cpu_generation
from trainer import evaluation


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


def arms(shares: bool = False):
    """(name, context) pairs: transformers' loop (our context patched out) and ours; with `shares`, ours on
    one intra-op thread (one share) and on two (two shares on two threads)."""
    if shares:
        return [("1 share", _on_threads(1)), ("2 shares", _on_threads(2))]
    return [
        ("transformers", lambda model: contextlib.nullcontext()),
        ("compact", cpu_generation.compact_decoding),
    ]


def _on_threads(threads: int):
    @contextlib.contextmanager
    def context(model):
        torch.set_num_threads(threads)  # what compact_decoding finds: the share count
        with cpu_generation.compact_decoding(model):
            yield

    return context


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", default="configs/embedded.yaml")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", type=int, default=0, help="print cProfile's top N functions instead")
    parser.add_argument(
        "--threads", action="store_true", help="the training pass and a round at 1 vs 2 threads"
    )
    parser.add_argument("--shares", action="store_true", help="our loop at 1 vs 2 threads (shares)")
    args = parser.parse_args()
    recipe = yaml.safe_load(Path(args.recipe).read_text())
    torch.set_num_threads(1)  # what train.py sets for the embedded recipe (cpu_threads)
    model = transformers.Qwen3_5ForConditionalGeneration.from_pretrained(
        recipe["model_name_or_path"], dtype=torch.float32
    ).eval()
    model_under_test[0] = model
    tok = transformers.AutoTokenizer.from_pretrained(recipe["model_name_or_path"])
    tasks = {t["id"]: t for t in load_snapshot(Path(recipe["snapshot_path"]), recipe["snapshot_sha256"])}
    sets = choose_eval_sets(
        list(tasks), seed=0, heldout_size=recipe["heldout_size"], fixed_size=recipe["fixed_size"]
    )
    by_set = {FIXED: [tasks[t] for t in sets.fixed], HELDOUT: [tasks[t] for t in sets.heldout]}
    spec = evaluation.EvalSpec(cap=recipe["max_completion_length"], batch_size=recipe["eval_batch_size"])
    G, n = recipe["num_generations"], recipe["problems_per_round"]
    pool = sorted(sets.train_pool)
    rollout_config = GenerationConfig(
        max_new_tokens=recipe["max_completion_length"], do_sample=True, temperature=recipe["temperature"],
        top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0, pad_token_id=tok.pad_token_id,
        eos_token_id=[tok.eos_token_id], disable_compile=True,
    )  # fmt: skip

    def evaluate():
        with evaluation._isolated(model):
            return [
                tokens
                for name in sorted(by_set)
                for tokens in evaluation._generate_transformers(
                    model, tok.pad_token_id, *_eval_inputs(tok, by_set[name], spec, name), spec, [2]
                )
            ]

    def rollout(round_index: int):
        prompts = [
            render_prompt(tok, tasks[t]["problem"]) for t in pool[round_index * n :][:n] for _ in range(G)
        ]
        batch = tok(prompts, add_special_tokens=False, padding=True, padding_side="left", return_tensors="pt")
        torch.manual_seed(round_index)
        with torch.no_grad():
            return model.generate(**batch, generation_config=rollout_config).tolist()

    phases = {"evaluation (556 samples)": lambda r: evaluate(), f"rollout round ({n} x {G})": rollout}
    if args.threads:
        return thread_table(model, recipe, args.repeats, lambda r: rollout(r))
    if args.profile:
        for name, phase in phases.items():
            profiler = cProfile.Profile()
            with cpu_generation.compact_decoding(model), profiler:
                phase(0)
            print(f"--- {name}, our loop")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
        return 0
    rows_seen = []
    model.register_forward_pre_hook(
        lambda m, a, kw: rows_seen.append(kw["input_ids"].shape), with_kwargs=True
    )
    arm_list = arms(args.shares)
    first, second = (name for name, _ in arm_list)
    for name, phase in phases.items():
        times = {arm: [] for arm, _ in arm_list}
        work = {}
        for r in range(args.repeats):
            outputs = {}
            for arm, context in arm_list:
                rows_seen.clear()
                with _patched(context):
                    wall, cpu = time.perf_counter(), cpu_seconds()
                    outputs[arm] = phase(r)
                    times[arm].append((time.perf_counter() - wall, cpu_seconds() - cpu))
                work[arm] = sum(s[0] * s[1] for s in rows_seen)  # rows x tokens fed to the model
            if outputs[first] != outputs[second]:
                print(f"{name}: {first} and {second} gave different tokens", file=sys.stderr)
                return 1
        print(f"{name}: same tokens in {args.repeats} interleaved repeats; seconds min / median / max")
        for arm, values in times.items():
            wall, cpu = ([v[i] for v in values] for i in (0, 1))
            print(
                f"  {arm:>12}: wall {_mmm(wall)}  cpu {_mmm(cpu)}  row-tokens fed {work[arm]:,}"
                f" ({work[arm] / work[first]:.2f})"
            )
    return 0


def thread_table(model, recipe: dict, repeats: int, rollout) -> int:
    """One training micro-batch (padded to prompt + cap, as TRL pads a step's rollouts) and one rollout round
    (TRL's own generate, no compaction) at 1 and 2 intra-op threads, interleaved; outputs compared bitwise."""
    rows, width = recipe["per_device_train_batch_size"], 100 + recipe["max_completion_length"]
    torch.manual_seed(0)
    ids = torch.randint(10, model.config.text_config.vocab_size, (rows, width))

    def train_pass(_):
        model.train()
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        logits.log_softmax(-1).mean().backward()
        model.eval()
        return [logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]

    phases = {f"training micro-batch ({rows} x {width} tokens)": train_pass, "rollout round": rollout}
    for name, phase in phases.items():
        times, outputs = {1: [], 2: []}, {}
        for r in range(repeats):
            for threads in times:
                torch.set_num_threads(threads)
                wall, cpu = time.perf_counter(), cpu_seconds()
                outputs[threads] = phase(r)
                times[threads].append((time.perf_counter() - wall, cpu_seconds() - cpu))
            same = (
                all(torch.equal(a, b) for a, b in zip(*outputs.values(), strict=True))
                if name != "rollout round"
                else outputs[1] == outputs[2]
            )
            if not same:
                print(f"{name}: 1 and 2 threads gave different results", file=sys.stderr)
                return 1
        print(f"{name}: bitwise the same in {repeats} interleaved repeats; seconds min / median / max")
        for threads, values in times.items():
            wall, cpu = ([v[i] for v in values] for i in (0, 1))
            print(f"  {threads} thread{'s' if threads > 1 else ' '}: wall {_mmm(wall)}  cpu {_mmm(cpu)}")
    torch.set_num_threads(1)
    return 0


def _eval_inputs(tok, tasks, spec, set_name):
    items = [
        (t["id"], i) for t in sorted(tasks, key=lambda t: t["id"]) for i in range(spec.samples[set_name])
    ]
    encoded = {
        t["id"]: tok(render_prompt(tok, t["problem"]), add_special_tokens=False)["input_ids"] for t in tasks
    }
    seeds = [evaluation.sample_seed(spec.seed, task_id, i) for task_id, i in items]
    return [encoded[task_id] for task_id, _ in items], seeds


model_under_test = [None]


@contextlib.contextmanager
def _patched(context):
    """`context` for the model's generate calls, the evaluation module's own use of it included."""
    saved = evaluation.compact_decoding
    evaluation.compact_decoding = context
    try:
        with context(model_under_test[0]):
            yield
    finally:
        evaluation.compact_decoding = saved


def _mmm(values) -> str:
    return f"{min(values):6.2f} / {statistics.median(values):6.2f} / {max(values):6.2f}"


if __name__ == "__main__":
    sys.exit(main())
