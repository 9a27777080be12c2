"""Time GRPO steps of one arm with CapGRPOTrainer and, side by side, with plain TRL `GRPOTrainer`.

    python bench/grpo_step.py --steps 2 --groups 32 --G 8 --cap 1024 --arm S2 --out bench_out
    python bench/grpo_step.py --hidden 64 --layers 4 --intermediate 128 --vocab 600 \\
        --groups 2 --G 4 --cap 16 --steps 1                                       # CPU smoke run
    accelerate launch --config_file configs/accelerate/fsdp2.yaml --num_processes 2 bench/grpo_step.py \\
        ... --no-plain --out bench_2gpu --compare-with bench_1gpu/grpo_step.json
    python bench/grpo_step.py --p-ended 0 --vllm --out bench_vllm    # + ours and plain TRL on vLLM colocate

--vllm adds `ours-vllm` and `plain-vllm` (`--vllm-sleep`: `ours-vllm-sleep` too), each in a process of its own
(an engine sets up torch.distributed and vLLM's globals once per process), at ours' micro-batch and
checkpointing when ours ran first, so that all four train alike; without vLLM installed they are skipped
with one line. vLLM comes to the GPU machine with tools/vllm_bundle.py (docs/gpu.md).

Ours trains in the micro-batches our trainer sizes (trainer/micro_batch.py) unless --ours-batch / --ours-grad-ckpt
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
defaults K = 168: past ~22 stop ids transformers' EOS test waits for the GPU every token (trainer/generation.py
`eos_stopped` is ours without the wait; plain TRL keeps transformers').
"""

import argparse
import contextlib
import functools
import gc
import hashlib
import importlib.util
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

import torch  # noqa: E402
from accelerate.utils import gather_object  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from transformers import (  # noqa: E402
    AutoTokenizer,
    PreTrainedTokenizerFast,
    Qwen3_5ForConditionalGeneration,
    TrainerCallback,
)
from trl import GRPOTrainer  # noqa: E402

from data.prompt import prompt_messages  # noqa: E402
from data.sampler import TaskSampler  # noqa: E402
from data.snapshot import load_snapshot, write_snapshot  # noqa: E402
from data.synthetic import generate_tasks  # noqa: E402
from embedded.build import (  # noqa: E402
    SPECIAL_TOKENS,
    BuildConfig,
    build_tokenizer,
    qwen35_config,
    sampling_config,
)
from policy.arms import ALL_ARMS  # noqa: E402
from rewards.grader import BatchReport, Grade  # noqa: E402
from rewards.outcome import Outcome  # noqa: E402
from rewards.reward import OutcomeReward  # noqa: E402
from trainer import generation  # noqa: E402
from trainer.checkpoint import save_state_dir, save_weights  # noqa: E402
from trainer.chunked_gated_delta import FLA, torch_on_cpu  # noqa: E402
from trainer.config import CapGRPOConfig  # noqa: E402
from trainer.cpu_adamw import CPUAdamW  # noqa: E402
from trainer.evaluation import EvalSpec, generate_eval  # noqa: E402
from trainer.grpo import CapGRPOTrainer  # noqa: E402
from trainer.sharding import is_sharded  # noqa: E402
from trainer.train import apply_determinism, load_base_model  # noqa: E402

VLLM_RUNS = ("ours-vllm", "ours-vllm-sleep", "ours-vllm-stale", "plain-vllm")
# TRL's own sampler-agreement metrics (plain TRL + vLLM); ours records trainer/sampler_agreement.py's
TRL_SAMPLING = {
    "mean_abs_delta": "sampling/sampling_logp_difference/mean",
    "max_abs_delta": "sampling/sampling_logp_difference/max",
    "ratio_min": "sampling/importance_sampling_ratio/min",
    "ratio_max": "sampling/importance_sampling_ratio/max",
}
COLUMNS = ("generate", "grade", "train", "optimizer", "other", "eval", "save", "total")
# what --compare-with checks
COMPARED = ("sampled", "qualified", "trained", "loss", "grad_norm", "eval_sha256")


def rule_of(name: str, args) -> str:
    """The chunked gated delta rule the run's training pass ran: plain TRL's GRPOTrainer never enters ours,
    though the shared config resolves it."""
    if FLA:  # transformers binds fla's kernels by itself, and ours steps aside
        return "fla"
    if name.startswith("plain") or not args.resolved_backends().chunked_gated_delta:
        return "transformers"
    return "ours, chunk terms compiled" if args.compile_gated_delta_terms else "ours"


# --- the coin grader ------------------------------------------------------------------------------
class CoinGrader:
    """GraderPool's `grade_batch` API with a seeded coin instead of math-verify.

    Rows come in groups of `group_size` consecutive rollouts of one task (how both trainers order them);
    the reference answer carries the task id (the benchmark's snapshot stores it there, see `bench_tasks`).
    """

    def __init__(self, p_correct, p_format, seed: int, group_size: int, step_fn, grade_capped: bool = False):
        if not (0 <= p_correct and 0 <= p_format and p_correct + p_format <= 1):
            raise ValueError(f"--p-correct {p_correct} and --p-format {p_format} must be >= 0, sum <= 1")
        self.p_correct, self.p_format, self.seed, self.group_size = p_correct, p_format, seed, group_size
        self.step_fn, self.grade_capped = step_fn, grade_capped
        self.last_report = BatchReport()  # GraderPool's per-batch report: a coin never fails
        self.seconds = 0.0
        self.outcomes: list[list[Outcome]] = []  # the groups graded since the last `pop_groups`

    def draw(self, task_id: str, index: int, step: int) -> float:
        digest = hashlib.sha256(f"capgrpo-coin:{self.seed}:{task_id}:{index}:{step}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def grade_batch(self, completions, references, truncated) -> list[Grade]:
        t0 = time.perf_counter()
        if len(references) % self.group_size:
            raise ValueError(f"coin grader: {len(references)} rows are not whole groups of {self.group_size}")
        step, grades = self.step_fn(), []
        for row, (task_id, capped) in enumerate(zip(references, truncated, strict=True)):
            u = self.draw(task_id, row % self.group_size, step)
            if capped and not self.grade_capped:
                outcome = Outcome.TRUNCATED
            elif u < self.p_correct:
                outcome = Outcome.CORRECT
            elif u < self.p_correct + self.p_format:
                outcome = Outcome.FORMAT_REJECTED
            else:
                outcome = Outcome.WRONG
            grades.append(Grade(outcome, None))
        g = self.group_size
        self.outcomes += [[x.outcome for x in grades[i : i + g]] for i in range(0, len(grades), g)]
        self.seconds += time.perf_counter() - t0
        return grades

    def rollouts(self, prompt_ids, step: int, cap: int, p_ended: float, vocab: int, never) -> list:
        """--coin-rollouts: what replaces the sampled rollouts, from the coin alone. Rollout k of a prompt gets
        a seeded length (1 to cap - 1 tokens ending in the first of `never`, with probability p_ended; else cap
        tokens without EOS) and seeded tokens from range(vocab) minus `never` (EOS, stop and special tokens)."""
        seen: dict[str, int] = {}
        out = []
        for prompt in prompt_ids:
            key = hashlib.sha256(json.dumps([int(t) for t in prompt]).encode()).hexdigest()[:16]
            index = seen[key] = seen.get(key, -1) + 1  # rollouts of one prompt come in order: index in group
            u = self.draw(f"rollout:{key}", index, step)
            rng = random.Random(f"{self.seed}:{key}:{index}:{step}")
            ended = u < p_ended
            length = 1 + int(u / p_ended * (cap - 2)) if ended else cap
            ids = []
            while len(ids) < length - ended:
                if (t := rng.randrange(vocab)) not in never:
                    ids.append(t)
            out.append(ids + [never[0]] * ended)
        return out

    def pop_groups(self) -> list[list[Outcome]]:
        groups, self.outcomes = self.outcomes, []
        return groups


# --- model and tokenizer ---------------------------------------------------------------------------
def padded_tokenizer(vocab: int) -> PreTrainedTokenizerFast:
    """tiny_base's byte-level BPE tokenizer, its vocabulary padded with never-merged dummy tokens to `vocab`
    entries, so that the embedding and output layers have the real row count."""
    small = build_tokenizer(BuildConfig(vocab_size=min(1024, vocab), tokenizer_corpus_size=300))
    spec = json.loads(small.backend_tokenizer.to_str())
    table = spec["model"]["vocab"]
    i = 0
    while len(table) < vocab:  # ASCII letters and digits decode as themselves under the byte-level decoder
        table.setdefault(f"dummy{i}x", len(table))
        i += 1
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=small.eos_token,
        pad_token=small.pad_token,
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],  # as build_tokenizer
        chat_template=small.chat_template,
        padding_side="left",
    )


def random_qwen35(a, tokenizer, device: torch.device) -> Qwen3_5ForConditionalGeneration:
    """A seeded random-init Qwen3.5 in bf16 (fp32 on CPU), built on `device`: layers 3 linear : 1 full."""
    head_dim = 128 if a.hidden >= 512 else 16
    heads = max(2, a.hidden // head_dim)
    freqs = head_dim // 4  # rotary on half of head_dim, split over the t/h/w grids like Qwen3.5
    text = {
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "layer_types": ["full_attention" if i % 4 == 3 else "linear_attention" for i in range(a.layers)],
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, heads // 4),
        "head_dim": head_dim,
        "linear_num_key_heads": heads,
        "linear_num_value_heads": 2 * heads,
        "linear_key_head_dim": head_dim,
        "linear_value_head_dim": head_dim,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [freqs - 2 * (freqs // 3), freqs // 3, freqs // 3],
            "mrope_interleaved": True,
        },
    }
    config = qwen35_config(tokenizer, text)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(a.seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = Qwen3_5ForConditionalGeneration(config)
    finally:
        torch.set_default_dtype(before)
    for name, p in model.named_parameters():
        if "visual" in name:
            p.requires_grad_(False)  # as load_base_model does: text-only RL never updates the vision tower
    eos = [tokenizer.eos_token_id, *stop_tokens(a, len(tokenizer))]
    model.generation_config = sampling_config(eos, tokenizer.pad_token_id)
    torch_on_cpu(model)  # as load_base_model does: with fla installed, CPU tensors take the torch reference
    return model


def stop_tokens(a, vocab: int) -> list[int]:
    """K ids from the top of the vocabulary (dummy tokens when padded). A random model samples near-uniformly,
    so each token stops a rollout with probability ~K/V: P(ended before cap) ~ 1 - exp(-cap K / V)."""
    k = round(vocab * -math.log(1 - a.p_ended) / a.cap) if a.p_ended > 0 else 0
    if k >= vocab // 2:
        raise ValueError(f"--p-ended {a.p_ended} at --cap {a.cap} needs {k} stop tokens of {vocab}")
    return list(range(vocab - k, vocab))


def load_model(a, device: torch.device):
    if a.model == "random-qwen35":
        tokenizer = padded_tokenizer(a.vocab)
        return random_qwen35(a, tokenizer, device), tokenizer
    model, _ = load_base_model(a.model, "bfloat16" if device.type == "cuda" else "float32")
    return model.to(device), AutoTokenizer.from_pretrained(a.model, padding_side="left")


def bench_tasks(a, work: Path) -> list[dict]:
    """Synthetic tasks through a snapshot file; each `answer` is replaced by the task id, which is what the
    coin grader reads (it never compares answers)."""
    tasks = generate_tasks(max(64, a.groups * a.steps * (8 if a.refill else 1) + a.eval_problems), a.seed)
    path = work / "bench.tasks.json"
    write_snapshot([{**t, "answer": t["id"]} for t in tasks], path)
    return list(load_snapshot(path))


# --- measurement ---------------------------------------------------------------------------------------
def device_used_gib() -> float | None:
    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return round((total - free) / 2**30, 2)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


class Probe(TrainerCallback):
    """Wall-clock marks of each step, the generation calls (patched on GRPOTrainer, which both trainers'
    real generation goes through) and the grader's time; one record per optimizer step."""

    def __init__(self, trainer, coin: CoinGrader, name: str, a, eval_tasks: list[dict], work: Path):
        self.trainer, self.coin, self.name, self.a = trainer, coin, name, a
        self.eval_tasks, self.work = eval_tasks, work
        self.records: list[dict] = []
        self.gen_seconds = self.gen_tokens = self.graphs_recorded = 0
        wrapped = trainer._generate_and_score_completions

        def timed_scoring(inputs):
            out = wrapped(inputs)
            sync()
            self.scored_at = time.perf_counter()
            return out

        trainer._generate_and_score_completions = timed_scoring  # TRL calls it through the instance

    @contextlib.contextmanager
    def generation_timer(self):
        # ours generates through _generate_rollouts (compiled, or TRL's path inside it); plain TRL directly
        cls = CapGRPOTrainer if isinstance(self.trainer, CapGRPOTrainer) else GRPOTrainer
        name = "_generate_rollouts" if cls is CapGRPOTrainer else "_generate_single_turn"
        original = getattr(cls, name)

        def timed(trainer, *args, **kwargs):
            sync()
            t0 = time.perf_counter()
            completion_ids, logprobs = original(trainer, *args, **kwargs)
            sync()
            self.gen_seconds += time.perf_counter() - t0
            self.gen_tokens += sum(len(ids) for ids in completion_ids)
            if self.a.coin_rollouts:  # generation ran and was timed; its text is replaced
                tok, a = trainer.processing_class, self.a
                never = [tok.eos_token_id, *trainer.eos_token_ids, *tok.all_special_ids]
                step = trainer.state.global_step
                completion_ids = self.coin.rollouts(args[0], step, a.cap, a.p_ended, len(tok), never)
                logprobs = None  # they belonged to the sampled tokens
            return completion_ids, logprobs

        setattr(cls, name, timed)
        manager = getattr(
            importlib.import_module("torch._inductor.cudagraph_trees"), "CUDAGraphTreeManager", None
        )
        record = getattr(manager, "record_function", None)
        if record is not None:  # how often CUDA graphs are captured: a replayed step captures none

            def counted(tree, *args, **kwargs):
                self.graphs_recorded += 1
                return record(tree, *args, **kwargs)

            manager.record_function = counted
        try:
            yield
        finally:
            setattr(cls, name, original)
            if record is not None:
                manager.record_function = record

    def on_step_begin(self, args, state, control, **kwargs):
        sync()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        self.gen_seconds = self.gen_tokens = self.graphs_recorded = 0
        self.coin.seconds = 0.0
        self.coin.pop_groups()
        self.started = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        sync()
        self.pre_optimizer = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        sync()
        self.optimized = time.perf_counter()

    def on_step_end(self, args, state, control, model=None, **kwargs):
        sync()
        ended = time.perf_counter()
        step = state.global_step
        eval_s, eval_sha = self.evaluate(model, step) if self.eval_tasks else (0.0, None)
        save_s = self.save(step) if self.a.checkpoint else 0.0
        # every process generated and graded its share: sum the shares
        tokens = sum(gather_object([self.gen_tokens]))
        groups = [g for part in gather_object([self.coin.pop_groups()]) for g in part]
        policy = self.trainer.args.resolved_arm().policy
        record = getattr(getattr(self.trainer, "step_record", None), "groups", None)
        sampled = record["sampled"] if record else len(groups)
        seconds = {
            "generate": self.gen_seconds,
            "grade": self.coin.seconds,
            "train": self.pre_optimizer - self.scored_at,
            "optimizer": self.optimized - self.pre_optimizer,
            "eval": eval_s,
            "save": save_s,
        }
        seconds["total"] = ended - self.started + eval_s + save_s
        seconds["other"] = seconds["total"] - sum(seconds[k] for k in COLUMNS[:4]) - eval_s - save_s
        self.records.append(
            {
                "step": step,
                "seconds": {k: round(seconds[k], 3) for k in COLUMNS},
                "tokens_generated": tokens,
                "tokens_per_s": round(tokens / max(self.gen_seconds, 1e-9), 1),
                "sampled": sampled,
                "qualified": record["qualified"] if record else sum(map(policy.qualifies, groups)),
                "trained": record["trained"] if record else len(groups),
                "rounds": record["rounds"] if record else 1,
                "eval_sha256": eval_sha,  # the evaluation's completions and outcomes (--eval-problems)
                "cudagraphs_recorded": self.graphs_recorded,
                "outcomes": {o.value: sum(x is o for g in groups for x in g) for o in Outcome},
                "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2)
                if torch.cuda.is_available()
                else None,
                # the whole device at the step's end (a colocated engine's memory included; a slept one's not)
                "device_gib": device_used_gib(),
                "sampler_agreement": getattr(
                    getattr(self.trainer, "step_record", None), "sampler_agreement", None
                ),
                # the process's peak resident set so far (Linux reports KiB): CPUAdamW's state lives here
                "peak_host_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
            }
        )

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs and self.records and self.records[-1]["step"] == state.global_step:
            self.records[-1]["loss"] = logs["loss"]
            self.records[-1]["grad_norm"] = logs.get("grad_norm")
            if self.records[-1]["sampler_agreement"] is None and TRL_SAMPLING["mean_abs_delta"] in logs:
                self.records[-1]["sampler_agreement"] = {k: logs.get(v) for k, v in TRL_SAMPLING.items()}

    def evaluate(self, model, step: int) -> tuple[float, str]:
        """Seconds of one evaluation, and a sha256 of its rows' completions and outcomes."""
        sync()
        t0 = time.perf_counter()
        spec = EvalSpec(
            cap=self.a.cap, temperature=1.0, top_p=1.0, seed=1234, samples={"bench": 1}, batch_size=64
        )
        coin = CoinGrader(
            self.a.p_correct, self.a.p_format, self.a.seed, 1, lambda: step, self.a.p_ended == 0
        )
        model = self.trainer.accelerator.unwrap_model(model)
        rows = generate_eval(
            model, self.trainer.processing_class, self.eval_tasks, spec, "bench", grade_fn=coin.grade_batch
        )
        sync()
        seconds = time.perf_counter() - t0
        digest = hashlib.sha256(json.dumps([[r["completion"], r["outcome"]] for r in rows]).encode())
        return seconds, digest.hexdigest()

    def save(self, step: int) -> float:
        sync()
        t0 = time.perf_counter()
        save_weights(self.trainer, self.work / self.name / f"step{step:03d}")
        if isinstance(self.trainer, CapGRPOTrainer):  # every process: it gathers under FSDP2
            save_state_dir(self.trainer, self.work / self.name, step)
        return time.perf_counter() - t0


# --- the runs ------------------------------------------------------------------------------------------
def training_settings(a, name: str, runs: dict, on_cuda: bool) -> tuple[int | None, bool | None]:
    """(micro-batch, checkpointing) of a run. Plain TRL: --batch and --no-grad-ckpt; ours: --ours-batch and
    --ours-grad-ckpt, unset ones sized by our trainer; plain-tuned: what ours ran with."""
    if name == "plain":
        return a.batch, on_cuda and not a.no_grad_ckpt
    if name == "plain-tuned":
        return runs["ours"]["settings"]["micro_batch"], runs["ours"]["settings"]["grad_ckpt"]
    if name in VLLM_RUNS and a.settings_of_ours:  # a vLLM run's process, told what ours ran with
        rows, ckpt = a.settings_of_ours.split(",")
        return int(rows), ckpt == "True"
    if name == "plain-vllm":
        return a.batch, on_cuda and not a.no_grad_ckpt
    return a.ours_batch, a.ours_grad_ckpt if on_cuda else False


def grpo_args(a, out: Path, *, rounds: int, on_cuda: bool, batch, checkpointing, vllm=None) -> CapGRPOConfig:
    """One config for both trainers: TRL reads its own fields and ignores ours (plain TRL gets both set).
    `vllm`: None, "awake" or "sleep" (TRL's colocated engine, with or without sleep mode)."""
    return CapGRPOConfig(
        use_vllm=vllm is not None,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=a.vllm_memory,
        vllm_enable_sleep_mode=vllm == "sleep",
        vllm_max_model_length=a.cap + 1024,  # prompts are short synthetic problems
        output_dir=str(out),
        arm=a.arm,
        groups_per_step=a.groups,
        problems_per_round=a.groups,
        max_sampling_rounds=rounds,
        num_generations=a.G,
        per_device_train_batch_size=batch,
        max_completion_length=a.cap,
        max_steps=a.steps,
        seed=a.seed,
        learning_rate=a.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        temperature=1.0,
        shuffle_dataset=False,  # plain TRL then takes the prompts in the task sampler's order
        bf16=on_cuda,
        gradient_checkpointing=checkpointing,
        compiled_generation=a.compiled,
        use_cpu=not on_cuda,
        cpu_adamw=a.cpu_adamw,
        adamw_state_on_gpu=a.adamw_state_on_gpu,  # ours only: plain TRL gets cpu_adamw_for()
        deterministic=a.deterministic,
        deterministic_fill_memory=a.deterministic_fill_memory,
        compile_gated_delta_terms=a.compile_gated_delta_terms,
        compile_norms_mlp=a.compile_norms_mlp,
        fla_causal_conv=a.fla_conv,
        tf32=a.tf32 or None,  # TrainingArguments' switch: float32 products on TF32 cores, whole run
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def cpu_adamw_for(model, args) -> CPUAdamW:
    """The optimizer CapGRPOTrainer.create_optimizer builds, for plain TRL (no weight-decay split: wd=0)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    return CPUAdamW(
        named,
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
    )


def engine_for(model, tokenizer, directory: Path) -> None:
    """What TRL's colocated engine loads: `model.name_or_path` must be a directory with config.json (naming
    the architecture) and the tokenizer. A random model is saved there first (its weights are pushed before
    the first rollout anyway). Qwen3.5 needs two engine arguments TRL does not pass: without flashinfer
    (not carried), vLLM's SM90 default GDN prefill fails at the first generate, so the triton one; and its
    text model alone (no vision tower, no processor files)."""
    if not model.name_or_path or not Path(model.name_or_path).is_dir():  # Path("") is ".", a directory
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        model.config._name_or_path = str(directory)
        model.name_or_path = str(
            directory
        )  # PreTrainedModel copies it from the config at init: what TRL reads
    if model.config.model_type.startswith("qwen3_5"):
        from trl.generation import vllm_generation

        llm = getattr(vllm_generation.LLM, "func", vllm_generation.LLM)
        vllm_generation.LLM = functools.partial(
            llm, additional_config={"gdn_prefill_backend": "triton"}, language_model_only=True
        )


def run_arm(
    a, name: str, tasks: list[dict], work: Path, device: torch.device, rounds: int, runs: dict
) -> dict:
    model, tokenizer = load_model(a, device)
    on_cuda = device.type == "cuda"
    batch, checkpointing = training_settings(a, name, runs, on_cuda)
    vllm = ("sleep" if name.endswith("-sleep") else "awake") if name in VLLM_RUNS else None
    args = grpo_args(
        a, work / name, rounds=rounds, on_cuda=on_cuda, batch=batch, checkpointing=checkpointing, vllm=vllm
    )
    if args.use_vllm:  # (CapGRPOConfig turns it off, with a warning, where vLLM is not installed)
        engine_for(model, tokenizer, work / name / "model")
        if importlib.util.find_spec("flashinfer") is None:  # not carried: vLLM's sampler must not import it
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    eval_tasks = tasks[len(tasks) - a.eval_problems :] if a.eval_problems else []
    pool = tasks[: len(tasks) - a.eval_problems]
    coin = CoinGrader(
        a.p_correct, a.p_format, a.seed, a.G, lambda: trainer.state.global_step, grade_capped=a.p_ended == 0
    )
    built = time.perf_counter()
    if name.startswith("plain"):
        order = TaskSampler([t["id"] for t in pool], seed=args.task_seed).take(a.groups * a.steps)
        by_id = {t["id"]: t for t in pool}
        data = Dataset.from_list(
            [{"prompt": prompt_messages(by_id[t]["problem"]), "answer": t, "task_id": t} for t in order]
        )
        eos = model.generation_config.eos_token_id
        reward = OutcomeReward(eos if isinstance(eos, list) else [eos], pool=coin)
        single = args.resolved_backends().cpu_adamw
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=[reward],
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            optimizers=(cpu_adamw_for(model, args) if single else None, None),
        )
        reward.eos_token_ids = frozenset(trainer.eos_token_ids)
    else:
        trainer = CapGRPOTrainer(
            model,
            args,
            tasks={t["id"]: t for t in pool},
            sampler=TaskSampler([t["id"] for t in pool], seed=args.task_seed),
            grader=coin,
            processing_class=tokenizer,
        )
    init_seconds = time.perf_counter() - built  # a vLLM run starts its engine here
    if name == "ours-vllm-stale" and args.use_vllm:  # the engine keeps the weights of its first push
        push, pushed = trainer.vllm_generation.sync_weights, []

        def first_push_only():
            if not pushed:
                pushed.append(push())

        trainer.vllm_generation.sync_weights = first_push_only
    probe = Probe(trainer, coin, name, a, eval_tasks, work)
    trainer.add_callback(probe)
    with probe.generation_timer():
        trainer.train()
    opt = getattr(trainer.optimizer, "optimizer", trainer.optimizer)
    optimizer = type(opt).__name__ + (" (state on the GPU)" if getattr(opt, "on_device", False) else "")
    params = sum(p.numel() for p in model.parameters())
    weights = hashlib.sha256()  # the trained weights' bytes in parameter order: --compare-with checks them
    for p in model.parameters():
        weights.update(p.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    probe.trainer = None  # the caller frees the GPU memory once this frame's references are gone
    return {
        "optimizer": optimizer,
        "params": params,
        "weights_sha256": weights.hexdigest(),
        "max_sampling_rounds": rounds,
        "init_seconds": round(init_seconds, 1),
        "settings": {
            "micro_batch": args.per_device_train_batch_size,
            "grad_ckpt": args.gradient_checkpointing,
            "micro_batch_basis": getattr(args.resolved_micro_batch(), "basis", "given"),
            "generation": "compiled"
            if getattr(trainer, "generation_shapes", None)
            else f"vllm colocate{', sleep mode' if args.vllm_enable_sleep_mode else ''}"
            if args.use_vllm
            else "trl",
            "gated_delta_rule": rule_of(name, args),
            "adamw_state_on_gpu": getattr(args.resolved_micro_batch(), "adamw_state_on_gpu", False),
            "tf32": bool(args.tf32),
            "compile_norms_mlp": args.compile_norms_mlp and not name.startswith("plain"),  # ours only
            "fla_conv": args.resolved_backends().fla_conv and not name.startswith("plain"),  # ours only
            "deterministic": bool(args.deterministic),
            "deterministic_fill_memory": bool(args.deterministic_fill_memory),
        },
        "distributed_type": trainer.accelerator.distributed_type.value,
        "sharded": is_sharded(trainer.model),
        "steps": probe.records,
    }


# --- reporting -----------------------------------------------------------------------------------------
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


def true_false(text: str) -> bool:
    return {"true": True, "false": False}[text.lower()]


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
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic: true (trainer/train.py apply_determinism); --compare-with --rtol 0 checks two runs",
    )
    ap.add_argument(
        "--no-fill-memory",
        dest="deterministic_fill_memory",
        action="store_false",
        help="with --deterministic: deterministic_fill_memory false (no fill of new tensors' memory)",
    )
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
    cmd = [sys.executable, str(Path(__file__).resolve()), *kept, "--only", name, "--out", str(out)]
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
