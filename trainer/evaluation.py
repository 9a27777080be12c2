"""Fixed-seed evaluation (SPEC §5): fixed32 × 8 and heldout300 × 1 with the same seeds at every step.

Sample i of task p is always drawn with `sample_seed(eval_seed, p, i)`, so differences between evaluated steps
come from the weights, not from sampling noise. Rows go to `results/eval_stepNNN.jsonl` (docs/CONTRACTS.md);
docs/evaluation.md says which reproducibility guarantee each backend gives.

What both evaluations share lives here: the spec (run.json's `eval`), the seeds, generation on each backend, the
graded rows and the weights as a checkpoint stores them. trainer/eval_callback.py evaluates during training,
trainer/eval_checkpoints.py (`make eval`) a run's saved checkpoints after the fact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import GenerationConfig

from data.eval_sets import FIXED, HELDOUT
from data.prompt import SYSTEM_PROMPT, render_prompt
from engine.cpu_generation import compact_decoding
from engine.generation import (
    BACKENDS,
    PROMPT_MULTIPLE,
    FixedShapes,
    compiled_config,
    eval_mode,
    generate_call,
)
from engine.micro_batch import longest_prompt
from rewards.grader import grade_batch
from rewards.outcome import Outcome
from trainer.config import CapGRPOConfig

GradeFn = Callable[[list[str], list[str], list[bool]], list]  # rewards.grader.grade_batch's shape


def _config_default(name: str):
    """The default of a CapGRPOConfig field: EvalSpec's defaults are the config's, not copies of them."""
    return CapGRPOConfig.__dataclass_fields__[name].default


@dataclass(frozen=True)
class EvalSpec:
    cap: int = _config_default("max_completion_length")  # max new tokens; without EOS within it: `truncated`
    temperature: float = _config_default("temperature")
    top_p: float = _config_default("top_p")
    seed: int = _config_default("eval_seed")  # eval seed: every per-sample seed derives from it
    samples: Mapping[str, int] = field(
        default_factory=lambda: {
            FIXED: _config_default("fixed_samples"),
            HELDOUT: _config_default("heldout_samples"),
        }
    )
    # transformers backends: the batch size is part of what fixes the random stream
    batch_size: int = _config_default("eval_batch_size")
    generation: str = "eager"  # the backend (engine/generation.py): its rows differ from another's
    system_prompt: str = _config_default("system_prompt")  # the recipe's system message (data/prompt.py)

    def __post_init__(self):
        if self.cap < 1 or self.batch_size < 1:
            raise ValueError(f"eval spec: cap and batch_size must be >= 1, got {self.cap}, {self.batch_size}")
        if not 0 < self.temperature < float("inf") or not 0 < self.top_p <= 1:  # NaN fails both
            raise ValueError(f"eval spec: need temperature > 0 and 0 < top_p <= 1, got {self}")
        if self.generation not in BACKENDS:
            raise ValueError(f"eval spec: generation must be one of {BACKENDS}, got {self.generation!r}")
        if any(n < 1 for n in self.samples.values()):
            raise ValueError(f"eval spec: samples per set must be >= 1, got {dict(self.samples)}")

    def to_json(self) -> dict:
        """The `eval` object of run.json."""
        return {
            "cap": self.cap,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "samples": dict(self.samples),
            "batch_size": self.batch_size,
            "generation": self.generation,
            "system_prompt": self.system_prompt,
        }

    @classmethod
    def from_config(cls, args, generation: str) -> EvalSpec:
        """A run's spec from its CapGRPOConfig: unset sampling settings are training's (SPEC §5)."""
        return cls(
            cap=args.eval_cap or args.max_completion_length,
            temperature=args.eval_temperature if args.eval_temperature is not None else args.temperature,
            top_p=args.eval_top_p if args.eval_top_p is not None else args.top_p,
            seed=args.eval_seed,
            # eval_set_files' sets (extra_evals): one sample a problem
            samples={
                FIXED: args.fixed_samples,
                HELDOUT: args.heldout_samples,
                **dict.fromkeys(args.eval_set_files or {}, 1),
            },
            batch_size=args.eval_batch_size,
            generation=generation,
            system_prompt=args.system_prompt,
        )

    @classmethod
    def from_run(cls, run: Mapping, where: str = "run.json") -> EvalSpec:
        """Read run.json's `eval` object; batch_size falls back to the resolved config's eval_batch_size."""
        ev = run.get("eval")
        if not isinstance(ev, Mapping):
            raise ValueError(f"{where}: missing object 'eval'")
        missing = [k for k in ("cap", "temperature", "top_p", "seed", "samples") if k not in ev]
        if missing:
            raise ValueError(f"{where}: 'eval' lacks {', '.join(missing)}")
        batch_size = ev.get("batch_size", (run.get("config") or {}).get("eval_batch_size", cls.batch_size))
        keys = ("cap", "temperature", "top_p", "seed")
        generation = ev.get("generation", "eager")  # run.json from before the compiled backend
        return cls(
            **{k: ev[k] for k in keys},
            samples=dict(ev["samples"]),
            batch_size=batch_size,
            generation=generation,
            system_prompt=ev.get("system_prompt", SYSTEM_PROMPT),  # run.json from before the prompt field
        )


def _hash63(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") >> 1


def sample_seed(eval_seed: int, task_id: str, sample: int) -> int:
    """The seed of sample `sample` of task `task_id`: the same at every step and in the standalone command."""
    return _hash63(f"capgrpo-eval:{eval_seed}:{task_id}:{sample}")


# --- generation -----------------------------------------------------------------------------------
def eos_token_ids(tokenizer, generation_config: GenerationConfig | None) -> list[int]:
    """Every EOS the model declares plus the tokenizer's, as TRL's GRPOTrainer uses while training."""
    declared = getattr(generation_config, "eos_token_id", None)
    ids = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    return ids if tokenizer.eos_token_id in ids else [tokenizer.eos_token_id, *ids]


def _cut(tokens: Sequence[int], eos: Sequence[int]) -> tuple[list[int], bool]:
    """(tokens before the first EOS, whether an EOS ended the completion)."""
    for i, token in enumerate(tokens):
        if token in eos:
            return list(tokens[:i]), True
    return list(tokens), False


def _generate_transformers(model, pad_id: int, prompts, seeds, spec: EvalSpec, eos: list[int]):
    """Left-padded fixed batches in the given order; each batch's stream is seeded from its members.
    Compiled: the fixed shapes of engine/generation.py (the last batch filled, widths bucketed)."""
    config = GenerationConfig(
        do_sample=True,
        temperature=spec.temperature,
        top_p=spec.top_p,
        max_new_tokens=spec.cap,
        # explicit neutral values: unset ones would be filled from the checkpoint's generation_config
        top_k=0,
        min_p=0.0,
        repetition_penalty=1.0,
        eos_token_id=eos,
        pad_token_id=pad_id,
        use_cache=True,
        disable_compile=True,
    )
    compiled = spec.generation == "compiled"
    shapes = FixedShapes(spec.batch_size, PROMPT_MULTIPLE if compiled else 1, spec.cap, compiled=compiled)
    if compiled:
        if model.device.type != "cuda":
            raise ValueError("eval spec: generation 'compiled' runs on a CUDA device")
        config = compiled_config(config, shapes, max(map(len, prompts)))
    out = []
    with compact_decoding(model):  # eager on a CPU: rows that ended leave the batch, the same tokens
        for start in range(0, len(prompts), spec.batch_size):
            batch, batch_seeds = prompts[start:][: spec.batch_size], seeds[start:][: spec.batch_size]
            torch.manual_seed(_hash63(",".join(map(str, batch_seeds))))
            out += [_cut(row, eos) for row in generate_call(model, batch, config, shapes, pad_id)]
    return out


def _generate_vllm(llm, prompts, seeds, spec: EvalSpec, eos: list[int]):
    """One request per sample with its own seed: each stream depends on that seed alone."""
    from vllm import SamplingParams

    params = [
        SamplingParams(
            temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.cap, seed=seed, stop_token_ids=eos
        )
        for seed in seeds
    ]
    results = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    out = []
    for result in results:
        completion = result.outputs[0]
        tokens, _ = _cut(completion.token_ids, eos)  # vLLM may or may not keep the stop token
        out.append((tokens, completion.finish_reason == "stop"))
    return out


@contextmanager
def _isolated(model) -> Iterator[None]:
    """Eval mode and private RNG: the training run's random stream and module modes come back untouched.

    On CPU each generate call decodes on one intra-op thread per share of its rows (compact_decoding): float
    reductions then do not depend on the machine's core count (so another machine reproduces the rows).
    """
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), eval_mode(model):
        yield


def generate_eval(
    model,
    tokenizer,
    tasks: Sequence[Mapping],
    spec: EvalSpec,
    set_name: str,
    *,
    step: int = 0,
    llm=None,
    grade_fn: GradeFn | None = None,
    eos: list[int] | None = None,
) -> list[dict]:
    """Generate and grade `spec.samples[set_name]` samples per task; rows sorted by (task_id, sample).

    With `llm` (a vLLM engine holding the same weights) generation runs there; otherwise `model.generate`.
    `model` may be None with `llm` given, then pass `eos` (the checkpoint's EOS ids).
    """
    if set_name not in spec.samples:
        raise KeyError(f"eval spec has no sample count for set {set_name!r} (has {sorted(spec.samples)})")
    by_id = {}
    for index, task in enumerate(tasks):
        for key in ("id", "problem", "answer"):
            if not isinstance(task.get(key), str):
                raise ValueError(
                    f"eval set {set_name!r}: task {index} ({task.get('id')!r}) lacks string {key!r}"
                )
        if by_id.setdefault(task["id"], task) is not task:
            raise ValueError(f"eval set {set_name!r}: task id {task['id']!r} appears twice")
    items = [(task_id, i) for task_id in sorted(by_id) for i in range(spec.samples[set_name])]
    seeds = [sample_seed(spec.seed, task_id, i) for task_id, i in items]
    encoded = {
        task_id: tokenizer(
            render_prompt(tokenizer, task["problem"], spec.system_prompt), add_special_tokens=False
        )["input_ids"]
        for task_id, task in by_id.items()
    }
    prompts = [encoded[task_id] for task_id, _ in items]
    eos = eos if eos is not None else eos_token_ids(tokenizer, getattr(model, "generation_config", None))
    with _isolated(model):
        if llm is not None:
            generated = _generate_vllm(llm, prompts, seeds, spec, eos)
        else:
            if tokenizer.pad_token_id is None:
                raise ValueError("evaluation needs a tokenizer with a pad token (left padding)")
            generated = _generate_transformers(model, tokenizer.pad_token_id, prompts, seeds, spec, eos)
    texts = [tokenizer.decode(tokens, skip_special_tokens=True) for tokens, _ in generated]
    truncated = [not ended for _, ended in generated]
    references = [by_id[task_id]["answer"] for task_id, _ in items]
    grades = (grade_fn or grade_batch)(texts, references, truncated)
    if len(grades) != len(items):
        raise RuntimeError(f"grader returned {len(grades)} grades for {len(items)} completions")
    return [
        {
            "step": step,
            "set": set_name,
            "task_id": task_id,
            "sample": i,
            "seed": seed,
            "outcome": Outcome(grade.outcome).value,
            "answer": grade.answer,
            "reference": reference,
            # like TRL's completion mask, the length counts the EOS that ended the completion
            "completion_tokens": len(tokens) + ended,
            "cap": spec.cap,
            "completion": text,
        }
        for (task_id, i), seed, (tokens, ended), text, reference, grade in zip(
            items, seeds, generated, texts, references, grades
        )
    ]


def run_eval(
    model, tokenizer, tasks_by_set: Mapping[str, Sequence[Mapping]], spec: EvalSpec, step: int, **kwargs
) -> list[dict]:
    """All sets, rows sorted by (set, task_id, sample); kwargs as for `generate_eval`."""
    rows = []
    for set_name in sorted(tasks_by_set):
        rows += generate_eval(model, tokenizer, tasks_by_set[set_name], spec, set_name, step=step, **kwargs)
    return rows


# --- Trainer logs ---------------------------------------------------------------------------------
def log_metrics(summary: Mapping[str, Mapping]) -> dict[str, float]:
    """Flat Trainer-log keys: `eval/<set>/accuracy` and `eval/<set>/<outcome>` as a share of the rows."""
    logs = {}
    for set_name, s in summary.items():
        if s["accuracy"] is not None:
            logs[f"eval/{set_name}/accuracy"] = s["accuracy"]
        logs.update({f"eval/{set_name}/{o}": c / s["n"] for o, c in s["outcomes"].items()})
    return logs


# --- the weights a checkpoint stores --------------------------------------------------------------
def compute_dtype(device: torch.device | str) -> torch.dtype:
    """Evaluation computes in bf16 on a GPU and in float32 on a CPU, always on bf16-rounded weights (what a
    checkpoint stores): CPUs without bf16 matrix units run bf16 matmuls ~5x slower, and float32 arithmetic
    on values that are exactly bf16 gives the same rows in training and in `make eval`."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def as_checkpoint(model):
    """`model` with every parameter rounded to bf16 and held in `compute_dtype` (buffers, the rotary
    frequencies among them, stay float32, as from_pretrained keeps them)."""
    dtype = compute_dtype(model.device)
    for p in model.parameters():
        p.data = p.data.to(torch.bfloat16).to(dtype)
    return model


# --- prompts past the model's positions -----------------------------------------------------------
def refuse_past_positions(
    model_config, tokenizer, problems, system: str, caps: dict, where: str, error=ValueError
):
    """A prompt and its cap past the model's positions, refused by the cap's name (`caps`: {name: cap}) before
    anything is written: the model was not built for them (its position tables end there)."""
    limit = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    if not limit:
        return
    longest = longest_prompt(tokenizer, problems, system)
    for name, cap in caps.items():
        if cap is not None and longest + cap > limit:
            raise error(
                f"{name}: {cap} tokens after the longest prompt ({longest} tokens) need {longest + cap} "
                f"positions, past max_position_embeddings {limit} of {where}"
            )
