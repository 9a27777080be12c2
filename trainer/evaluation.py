"""Fixed-seed evaluation (SPEC §5): fixed32 × 8 and heldout300 × 1 with the same seeds at every step.

Sample i of task p is always drawn with `sample_seed(eval_seed, p, i)`, so differences between
evaluated steps come from the weights, not from sampling noise. Rows go to `results/eval_stepNNN.jsonl`
(docs/CONTRACTS.md); docs/evaluation.md says which reproducibility guarantee each backend gives.

    python -m trainer.evaluation RUN_DIR --steps 20,29 [--cap 24576]

re-evaluates saved checkpoints after the fact, with the run's own sets and seeds.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from accelerate import PartialState  # noqa: E402
from tqdm.auto import tqdm  # noqa: E402
from transformers import GenerationConfig, TrainerCallback  # noqa: E402

from data.atomic import refused_write  # noqa: E402
from data.eval_sets import FIXED, HELDOUT  # noqa: E402
from data.prompt import SYSTEM_PROMPT, render_prompt  # noqa: E402
from data.snapshot import load_snapshot  # noqa: E402
from engine import sharding  # noqa: E402
from engine.chunked_gated_delta import torch_on_cpu  # noqa: E402
from engine.cpu_generation import compact_decoding  # noqa: E402
from engine.generation import (  # noqa: E402
    BACKENDS,
    PROMPT_MULTIPLE,
    FixedShapes,
    compiled_config,
    eval_mode,
    generate_call,
)
from engine.micro_batch import longest_prompt  # noqa: E402
from rewards.grader import GraderPool, grade_batch  # noqa: E402
from rewards.outcome import GRADER_VERSION, Outcome, grader_name  # noqa: E402
from rundir.files import read_jsonl, step_dir, summarize, write_eval  # noqa: E402  (the run's files live there)
from rundir.run_json import RunDirError, read_run_json  # noqa: E402
from rundir.state import StateError  # noqa: E402
from rundir.step import verify_step  # noqa: E402
from trainer.config import CapGRPOConfig, grader_limits  # noqa: E402

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
        """A run's spec from its CapGRPOConfig and evaluation backend (trainer/backends.py): unset sampling
        settings are training's (SPEC §5)."""
        return cls(
            cap=args.eval_cap or args.max_completion_length,
            temperature=args.eval_temperature if args.eval_temperature is not None else args.temperature,
            top_p=args.eval_top_p if args.eval_top_p is not None else args.top_p,
            seed=args.eval_seed,
            samples={FIXED: args.fixed_samples, HELDOUT: args.heldout_samples},
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


# --- summaries and files --------------------------------------------------------------------------
def log_metrics(summary: Mapping[str, Mapping]) -> dict[str, float]:
    """Flat Trainer-log keys: `eval/<set>/accuracy` and `eval/<set>/<outcome>` as a share of the rows."""
    logs = {}
    for set_name, s in summary.items():
        if s["accuracy"] is not None:
            logs[f"eval/{set_name}/accuracy"] = s["accuracy"]
        logs.update({f"eval/{set_name}/{o}": c / s["n"] for o, c in s["outcomes"].items()})
    return logs


# --- during training ------------------------------------------------------------------------------
# what must match for another run's step-0 rows to be this run's: the same base, tasks, sets, eval settings
# and grader (the launcher starts every run of a plan from one base and recipe; this says so per run)
STEP0_SAME = ("base_model", "architecture", "snapshot", "eval_sets", "eval", "grader_version")


def shared_step0_rows(source: Path, run_dir: Path, tasks_by_set: Mapping[str, Sequence[Mapping]],
                      spec: EvalSpec) -> list[dict]:  # fmt: skip
    """The rows of another run's `results/eval_step000.jsonl` (`step0_eval_from`), checked to be the ones this
    run would write: its run.json agrees on STEP0_SAME, and its rows are this run's (set, task, sample, seed, cap)
    in order. Step 0 evaluates the base, which every run of a launch shares, with seeds that depend on the task
    and sample alone, so generating them again per run only repeats the same rows (issue 60)."""
    source = Path(source)
    theirs, ours = read_run_json(source.parent.parent), read_run_json(run_dir)
    if differ := [k for k in STEP0_SAME if theirs.get(k) != ours.get(k)]:
        raise RunDirError(f"step0_eval_from {source}: its run differs from this one in {', '.join(differ)}")
    rows = read_jsonl(source)
    want = [(name, task_id, i, sample_seed(spec.seed, task_id, i), spec.cap, 0)
            for name in sorted(tasks_by_set) for task_id in sorted(t["id"] for t in tasks_by_set[name])
            for i in range(spec.samples[name])]  # fmt: skip
    got = [
        (r.get("set"), r.get("task_id"), r.get("sample"), r.get("seed"), r.get("cap"), r.get("step"))
        for r in rows
    ]
    if got != want:
        bad = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        raise RunDirError(f"step0_eval_from {source}: row {bad + 1} is not this run's step-0 sample "
                          f"({len(got)} rows, {len(want)} expected)")  # fmt: skip
    return rows


class EvalCallback(TrainerCallback):
    """Evaluates at step 0 (not when resuming), every `eval_every` steps (or at `eval_steps` alone: the config's
    eval_at_steps) and at the last step. With `step0_rows` (another run's step-0 file) step 0 copies those rows
    instead of generating.

    After each evaluation: `last_step`, `last_summary` (steps.jsonl's `eval` object), `last_seconds`;
    `log_fn` (e.g. `trainer.log`) gets the flat `log_metrics`. Only the main process generates, with the
    weights as a checkpoint stores them (an FSDP2-sharded model is gathered into a whole bf16 copy first).
    `llm_fn`, when given, returns a vLLM engine already holding the current weights.
    """

    def __init__(
        self,
        run_dir,
        tasks_by_set: Mapping[str, Sequence[Mapping]],
        spec: EvalSpec,
        eval_every: int,
        tokenizer,
        *,
        log_fn: Callable[[dict], None] | None = None,
        grade_fn: GradeFn | None = None,
        llm_fn: Callable[[], object] | None = None,
        eval_steps: Sequence[int] = (),
        step0_rows: str | Path | None = None,
    ):
        if eval_every < 1:
            raise ValueError(f"eval_every must be >= 1, got {eval_every}")
        unknown = sorted(set(tasks_by_set) - set(spec.samples))
        if unknown:
            raise ValueError(f"eval sets {unknown} have no sample count in the eval spec")
        self.run_dir, self.tasks_by_set, self.spec = Path(run_dir), tasks_by_set, spec
        self.eval_every, self.tokenizer = eval_every, tokenizer
        self.log_fn, self.grade_fn, self.llm_fn = log_fn, grade_fn, llm_fn
        self.last_step: int | None = None
        self.last_summary: dict | None = None
        self.last_seconds = 0.0
        self.eval_steps, self.step0_rows = frozenset(eval_steps), step0_rows
        self.weights = None  # the rounded copy every evaluation reuses (refreshed_weights)

    def due(self, step: int, max_steps: int) -> bool:
        return step == max_steps or (
            step in self.eval_steps if self.eval_steps else step % self.eval_every == 0
        )

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.global_step == 0 and self.due(0, state.max_steps):
            if self.step0_rows is None:
                self.evaluate(model, 0)
            else:
                self.copy_step0()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.due(state.global_step, state.max_steps):
            self.evaluate(model, state.global_step)

    def copy_step0(self) -> None:
        start = time.perf_counter()
        dist = PartialState()
        if dist.is_main_process:
            rows = shared_step0_rows(self.step0_rows, self.run_dir, self.tasks_by_set, self.spec)
            write_eval(self.run_dir, 0, rows, overwrite=True)
            self.last_summary = summarize(rows)
            tqdm.write(f"step 0: {len(rows)} rows copied from {self.step0_rows}", file=sys.stderr)
            if self.log_fn is not None:
                self.log_fn(log_metrics(self.last_summary))
        dist.wait_for_everyone()
        self.last_step, self.last_seconds = 0, time.perf_counter() - start

    def evaluate(self, model, step: int) -> None:
        start = time.perf_counter()
        dist = PartialState()
        weights = None
        if sharding.is_sharded(model):  # FSDP2: every process gathers, the main one evaluates a whole copy
            full = sharding.full_parameters(model)
            if dist.is_main_process:
                weights = as_checkpoint(sharding.unsharded_copy(model, full, torch.bfloat16))
        elif dist.is_main_process:
            weights = self.weights = refreshed_weights(self.weights, model)
        if dist.is_main_process:
            n = sum(len(tasks) * self.spec.samples[name] for name, tasks in self.tasks_by_set.items())
            # its own phase on the console: the progress bar counts optimizer steps and stands still meanwhile
            tqdm.write(f"evaluating step {step}: {n} samples", file=sys.stderr)
            llm = self.llm_fn() if self.llm_fn is not None else None
            rows = run_eval(
                weights,
                self.tokenizer,
                self.tasks_by_set,
                self.spec,
                step,
                llm=llm,
                grade_fn=self.grade_fn,
            )
            # a resumed run redoing this step supersedes what the interrupted run wrote
            write_eval(self.run_dir, step, rows, overwrite=True)
            self.last_summary = summarize(rows)
            accuracy = ", ".join(
                f"{name} {v['accuracy']:.3f}"
                for name, v in self.last_summary.items()
                if v["accuracy"] is not None
            )
            tqdm.write(
                f"step {step} evaluated in {time.perf_counter() - start:.1f} s: {accuracy}", file=sys.stderr
            )
            if self.log_fn is not None:
                self.log_fn(log_metrics(self.last_summary))
        dist.wait_for_everyone()
        self.last_step = step
        self.last_seconds = time.perf_counter() - start


# --- after the fact -------------------------------------------------------------------------------
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


def checkpoint_weights(model):
    """The model as a checkpoint stores it (bf16 values), so `make eval` on stepNNN/ reproduces in-training
    rows. A bf16 model on a GPU is used as is; anything else is evaluated through a rounded copy."""
    if model is None or model.dtype == compute_dtype(model.device) == torch.bfloat16:
        return model
    rounded = copy.deepcopy(model)
    # deepcopy shares functions: transformers' compiled decode call (`get_compiled_call`), made by the rollouts,
    # would still run the training model's weights after this copy's prefill; the copy compiles its own
    for name in ("_compiled_call", "_last_compile_config"):
        rounded.__dict__.pop(name, None)
    return as_checkpoint(rounded)


def refreshed_weights(copy_, model):
    """`checkpoint_weights(model)` reusing `copy_` (an earlier evaluation's copy of the same model): its tensors
    take the new bf16 values in place, so its compiled decode call and CUDA graphs (which hold their addresses)
    run again instead of a new copy compiling its own and leaving the old one's graph memory behind (+2.5 GiB a
    evaluation on the 0.5B in docs/experiment-qwen's launch 1)."""
    if copy_ is None or model is None or model.dtype == compute_dtype(model.device) == torch.bfloat16:
        return checkpoint_weights(model)
    with torch.no_grad():
        for mine, theirs in zip(copy_.parameters(), model.parameters(), strict=True):
            mine.copy_(theirs.detach().to(torch.bfloat16))
    return copy_


def is_adapter(path: Path) -> bool:
    """A LoRA run's stepNNN/: the adapter alone (docs/gpu.md "LoRA")."""
    return (Path(path) / "adapter_config.json").is_file()


@contextmanager
def merged_adapter(path: Path) -> Iterator[Path]:
    """A LoRA stepNNN/ as a model directory: its base (adapter_config.json's base_model_name_or_path) with the
    stored adapter merged in by PEFT, bf16, with the checkpoint's tokenizer and processor files and the base's
    generation config; removed afterwards. What the run's vLLM engine held (engine/lora_push.py)."""
    import tempfile

    from peft import PeftConfig, PeftModel

    from trainer.checkpoint import PROCESSOR_FILES

    base = Path(PeftConfig.from_pretrained(path).base_model_name_or_path)
    model, _ = load_checkpoint(base, "cpu")
    merged = PeftModel.from_pretrained(model, path).merge_and_unload()
    with tempfile.TemporaryDirectory(prefix="capgrpo-merged-") as tmp:
        merged.to(torch.bfloat16).save_pretrained(tmp)
        transformers.AutoTokenizer.from_pretrained(path).save_pretrained(tmp)
        for name in (*PROCESSOR_FILES, "generation_config.json"):
            if (src := Path(path) / name).is_file() or (src := base / name).is_file():
                shutil.copy(src, Path(tmp) / name)
        yield Path(tmp)


def load_checkpoint(path: Path, device: str):
    """A saved stepNNN/ (or the base model) with the architecture class named in its config.json; a LoRA
    stepNNN/ merged into its base."""
    if is_adapter(path):
        with merged_adapter(path) as merged:
            return load_checkpoint(merged, device)
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{config_file}: no such checkpoint config")
    names = json.loads(config_file.read_text()).get("architectures") or []
    cls = getattr(transformers, names[0], None) if names else None
    if cls is None:
        raise ValueError(f"{config_file}: 'architectures' {names!r} names no transformers class")
    model = cls.from_pretrained(path, dtype=torch.bfloat16).to(device)  # the stored (bf16) values
    torch_on_cpu(model)  # fla installed: its Triton kernels for CUDA tensors only (`--device cpu`)
    return as_checkpoint(model), transformers.AutoTokenizer.from_pretrained(path)


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


def load_eval_tasks(run: Mapping, run_dir: Path) -> dict[str, list[dict]]:
    """The recorded eval sets, resolved against the snapshot pinned in run.json (sha256 verified)."""
    snap = run.get("snapshot") or {}
    if not snap.get("path"):
        raise ValueError(f"{run_dir / 'run.json'}: missing 'snapshot.path'")
    path = Path(snap["path"])
    if not path.is_absolute() and not path.exists():
        path = run_dir / path
    tasks = {t["id"]: t for t in load_snapshot(path, snap.get("sha256"))}
    sets = {}
    for set_name, ids in (run.get("eval_sets") or {}).items():
        unknown = [i for i in ids if i not in tasks]
        if unknown:
            raise ValueError(f"{path}: eval set {set_name!r} names task {unknown[0]!r}, not in the snapshot")
        sets[set_name] = [tasks[i] for i in ids]
    if not sets:
        raise ValueError(f"{run_dir / 'run.json'}: no 'eval_sets'")
    return sets


def _checkpoint_dir(run: Mapping, run_dir: Path, step: int) -> Path:
    if step == 0:  # the base model: no step000/ weights are saved
        if not run.get("base_model"):
            raise ValueError(f"{run_dir / 'run.json'}: step 0 needs 'base_model'")
        return Path(run["base_model"])
    verify_step(step_dir(run_dir, step), way_on="evaluate the run's other checkpoints")  # never a broken one
    return step_dir(run_dir, step)


def run_device(run: dict) -> str:
    """Where the run evaluated during training: a use_cpu run's rows are CPU rows, also on a GPU machine."""
    return "cpu" if (run.get("config") or {}).get("use_cpu") or not torch.cuda.is_available() else "cuda"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.evaluation", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument(
        "--steps", required=True, help="comma-separated optimizer steps, e.g. 20,29 (0: base)"
    )
    parser.add_argument("--cap", type=int, help="eval token cap (default: the run's)")
    parser.add_argument("--temperature", type=float)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--batch-size", type=int, help="transformers backend; other values change the rows")
    parser.add_argument(
        "--backend",
        choices=("auto", *BACKENDS),
        default="auto",
        help="auto: the run's own (run.json eval.generation); another one only at another --cap",
    )
    parser.add_argument(
        "--device", help="default: the run's own (cpu for a use_cpu run, else cuda if present)"
    )
    args = parser.parse_args(argv)
    run_file = args.run_dir / "run.json"
    stack = ExitStack()  # the grader pool, closed on every way out
    try:
        run = read_run_json(args.run_dir)
        args.device = args.device or run_device(run)
        run_spec = EvalSpec.from_run(run, str(run_file))
        overrides = {
            "cap": args.cap,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "batch_size": args.batch_size,
        }
        if args.backend != "auto":
            overrides["generation"] = args.backend
        spec = replace(run_spec, **{k: v for k, v in overrides.items() if v is not None})
        sampling = (spec.temperature, spec.top_p, spec.generation)
        if spec.cap == run_spec.cap and sampling != (
            run_spec.temperature,
            run_spec.top_p,
            run_spec.generation,
        ):
            raise ValueError(
                f"{run_file}: other sampling settings or another backend (eval.generation "
                f"{run_spec.generation!r}) at the run's own cap would pass for its training-time evaluation "
                "(eval_stepNNN.jsonl); evaluate them at another --cap"
            )
        if spec.generation == "compiled" and not str(args.device).startswith("cuda"):
            raise ValueError(
                f"{run_file}: eval.generation 'compiled' needs a CUDA device (got {args.device})"
            )
        steps = [int(s) for s in args.steps.split(",") if s.strip()]
        tasks_by_set = load_eval_tasks(run, args.run_dir)
        use_vllm = spec.generation == "vllm"
        grader = grader_name(run.get("grader_version", GRADER_VERSION))  # the run's own grader and limits
        pool = stack.enter_context(GraderPool(**grader_limits(run.get("config") or {}), grader=grader))
        grade_fn = pool.grade_batch
        for step in steps:
            start = time.perf_counter()
            path = _checkpoint_dir(run, args.run_dir, step)
            if use_vllm:
                from vllm import LLM

                # a LoRA checkpoint: vLLM loads the merged model, as the run's engine held it
                with merged_adapter(path) if is_adapter(path) else nullcontext(path) as model_dir:
                    llm, model = LLM(model=str(model_dir), seed=spec.seed, dtype="auto"), None
                    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
                    eos = eos_token_ids(tokenizer, _generation_config(model_dir))
            else:
                (model, tokenizer), llm, eos = load_checkpoint(path, args.device), None, None
                problems = [t["problem"] for tasks in tasks_by_set.values() for t in tasks]
                caps = {"--cap": spec.cap}  # vLLM refuses a cap past the model's length itself
                refuse_past_positions(model.config, tokenizer, problems, spec.system_prompt, caps, path)
            rows = run_eval(model, tokenizer, tasks_by_set, spec, step, llm=llm, eos=eos, grade_fn=grade_fn)
            cap_suffix = spec.cap if spec.cap != run_spec.cap else None
            out = write_eval(args.run_dir, step, rows, cap_suffix)
            summary = ", ".join(f"{s} {v['accuracy']} (n={v['n']})" for s, v in summarize(rows).items())
            print(f"step {step}: {summary} -> {out} [{time.perf_counter() - start:.1f}s]", flush=True)
            del model, llm
    except (OSError, ValueError, KeyError, StateError, RunDirError) as err:
        print(f"error: {refused_write(err) or err}", file=sys.stderr)  # a read-only disk: path and reason
        return 1
    finally:
        stack.close()
    return 0


def _generation_config(path: Path) -> GenerationConfig | None:
    has_one = (Path(path) / "generation_config.json").exists()
    return GenerationConfig.from_pretrained(path) if has_one else None


if __name__ == "__main__":
    sys.exit(main())
