"""The embedded default base model: a tiny Qwen3_5ForConditionalGeneration warm-started on synthetic math.

It has the real architecture (hybrid gated-delta-net / full-attention text model plus a vision tower,
tiny but present so the real load/save path is exercised), a small byte-level BPE tokenizer trained
on synthetic task text with Qwen3.5's pre-tokenizer and chat tokens, and a TRL SFT warm start on
worked solutions of problems that are not in the embedded snapshot, in float32, deterministic for a
seed. The SFT uses a GPU when there is one (the shipped embedded/base: 6 minutes on an H200), else the
CPU (hours on 2 cores; docs/embedded_default.md).

    python -m embedded.build --out artifacts/base --snapshot artifacts/synthetic.tasks.json   # = make base
    python -m embedded.build ... --overrides configs/h200-base.json --report-cap 384            # the H200 base

writes the embedded task snapshot (printing its sha256), builds and warm-starts the model, saves it
to --out, and reports pass@1, the outcome mix and the gate-qualifying share of 8-sample groups on the
held-out set at the embedded cap (`base_report.json`).
"""

import argparse
import hashlib
import json
import os
import random
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
import trl  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import (  # noqa: E402
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3_5Config,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5Tokenizer,
)

from data.eval_sets import choose_eval_sets  # noqa: E402
from data.prompt import SYSTEM_PROMPT, prompt_messages  # noqa: E402
from data.snapshot import write_snapshot  # noqa: E402
from data.synthetic import generate_tasks  # noqa: E402

# --- embedded defaults: configs/embedded.yaml repeats them (a recipe is plain YAML and imports nothing);
# tests/test_tiny_base.py checks that the two agree ---------------------------------------------------
# completion tokens: every reference solution fits (but 0.8% at level 5), re-check loops often do not
EMBEDDED_CAP = 160
EMBEDDED_SNAPSHOT_SEED = 0
EMBEDDED_SNAPSHOT_SIZE = 1200
EMBEDDED_HELDOUT_SIZE = 300
EMBEDDED_FIXED_SIZE = 32
EMBEDDED_EVAL_SETS_SEED = 0
# The base `make train` uses is shipped in the repo (built on a GPU in 6 minutes; docs/embedded_default.md);
# `make base` rebuilds an equivalent one on the CPU into artifacts/.
SHIPPED_BASE = Path("embedded/base")
SHIPPED_SNAPSHOT = Path("embedded/synthetic.tasks.json")
EMBEDDED_SNAPSHOT = Path("artifacts/synthetic.tasks.json")
EMBEDDED_BASE = Path("artifacts/base")

MANIFEST = "tiny_base.json"  # written last: its presence means the directory is complete
REPORT = "base_report.json"
ARCHITECTURE = "Qwen3_5ForConditionalGeneration"

SPECIAL_TOKENS = [
    "<|endoftext|>",  # pad
    "<|im_start|>",
    "<|im_end|>",  # EOS: ends every assistant turn
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen's turn format without the thinking/tool branches the synthetic tasks never use.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass(frozen=True)
class BuildConfig:
    """Everything that determines the built weights; its hash is recorded in the manifest."""

    seed: int = 0
    vocab_size: int = 1024
    tokenizer_corpus_size: int = 3000
    tokenizer_corpus_seed: int = 1001
    hidden_size: int = 256
    intermediate_size: int = 768
    # one gated-delta-net layer keeps the hybrid path; on CPU its torch fallback costs several full layers
    layer_types: tuple[str, ...] = ("linear_attention", "full_attention", "full_attention", "full_attention")
    sft_pool_seed: int = 2002
    sft_pool_size: int = 30000
    sft_levels: tuple[int, ...] = (1, 2, 3, 4, 5)
    sft_steps: int = 3000
    sft_batch_size: int = 64
    sft_learning_rate: float = 2e-3
    sft_max_length: int = 384  # prompt + solution: long re-checks are cut (they run past the cap anyway)
    # Behaviour seeded into the warm-start solutions (see sft_pool): the base, like a real one, sometimes
    # misses the answer format, re-checks until it runs out of tokens, or miscopies its final answer.
    unboxed_share: float = 0.15
    recheck_share: float = 0.3
    recheck_continue: float = 0.5
    slip_share: float = 0.1
    snapshot_seed: int = EMBEDDED_SNAPSHOT_SEED
    snapshot_size: int = EMBEDDED_SNAPSHOT_SIZE
    # Added after the shipped base, for larger bases (configs/h200-base.json), with the values it was built
    # with as defaults; new fields go below them (digest).
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    linear_num_key_heads: int = 1
    linear_num_value_heads: int = 2
    linear_head_dim: int = 32
    recheck_max_repeats: int = 6
    sft_bf16: bool = False  # bf16 mixed precision in the SFT (float32 master weights, saved float32)

    def digest(self) -> str:
        fields = asdict(self)
        # the fields from num_attention_heads on came after the shipped base: hashed only when they differ
        # from their defaults, so that builds made before they existed keep their hash
        names = list(fields)
        for name in names[names.index("num_attention_heads") :]:
            if fields[name] == self.__dataclass_fields__[name].default:
                del fields[name]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]


# --- tokenizer -----------------------------------------------------------------------------------
def build_tokenizer(cfg: BuildConfig) -> PreTrainedTokenizerFast:
    """Byte-level BPE trained on synthetic task text with Qwen3.5's own normalizer and pre-tokenizer.

    `AutoTokenizer` loads any checkpoint of this architecture as `Qwen3_5Tokenizer`, which rebuilds that
    pipeline (NFC, Qwen's split regex with one digit per token, byte level) around the saved vocab and
    merges; training under the same pipeline makes the saved tokenizer encode exactly like this one.
    """
    corpus = [SYSTEM_PROMPT, RECHECK] * 200  # weighted so that text every example may carry encodes short
    for t in generate_tasks(cfg.tokenizer_corpus_size, cfg.tokenizer_corpus_seed):
        corpus += [t["problem"], t["solution"]]
    qwen = Qwen3_5Tokenizer().backend_tokenizer
    tok = Tokenizer(models.BPE())
    tok.normalizer, tok.pre_tokenizer = qwen.normalizer, qwen.pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=cfg.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
        padding_side="left",  # generation pads on the left
    )


# --- model ---------------------------------------------------------------------------------------
def qwen35_config(tokenizer, text: dict) -> Qwen3_5Config:
    """A Qwen3.5 config around `text` (the text model's sizes) with a tiny vision tower: present so the
    real class and its loading/saving path are exercised, never run on text-only prompts."""
    ids = tokenizer.convert_tokens_to_ids
    text = {
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
        **text,
    }
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "patch_size": 4,
        "out_hidden_size": text["hidden_size"],
        "num_position_embeddings": 16,
    }
    return Qwen3_5Config(
        text_config=text,
        vision_config=vision,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def build_model(cfg: BuildConfig, tokenizer: PreTrainedTokenizerFast) -> Qwen3_5ForConditionalGeneration:
    """A randomly initialised tiny model of the real architecture (seeded)."""
    text = {
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": len(cfg.layer_types),
        "layer_types": list(cfg.layer_types),
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "linear_num_key_heads": cfg.linear_num_key_heads,
        "linear_num_value_heads": cfg.linear_num_value_heads,
        "linear_key_head_dim": cfg.linear_head_dim,
        "linear_value_head_dim": cfg.linear_head_dim,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 2048,
        # rotary on half of head_dim (head_dim 32: 16 dims = 8 frequencies, [4, 2, 2]), split over the
        # t/h/w grids like Qwen3.5
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "mrope_section": [cfg.head_dim // 8, cfg.head_dim // 16, cfg.head_dim // 16],
            "mrope_interleaved": True,
        },
    }
    config = qwen35_config(tokenizer, text)
    torch.manual_seed(cfg.seed)
    model = Qwen3_5ForConditionalGeneration(config)
    model.generation_config = sampling_config(tokenizer.eos_token_id, tokenizer.pad_token_id)
    return model


def sampling_config(eos_token_id, pad_token_id: int) -> GenerationConfig:
    """Plain sampling at temperature 1 (no top-k), the generation config our models ship with."""
    return GenerationConfig(
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
    )


# --- SFT warm start ------------------------------------------------------------------------------
RECHECK = "Let me check that again."


def sft_pool(cfg: BuildConfig, exclude_problems: set[str]) -> list[dict]:
    """Worked solutions for the warm start: a separate seed, never a problem of the embedded snapshot.

    Each solution is written in one of four styles, drawn with the pool's seed, so that the base has every
    outcome GRPO has to deal with (docs/embedded_default.md):
    - unboxed (`unboxed_share`): ends in a bare "The answer is X." -> format_rejected;
    - re-check (`recheck_share`): the steps are repeated after "Let me check that again." 1 + k times,
      k geometric with `recheck_continue`; at the embedded cap the longer loops never reach the answer
      -> truncated, the shorter ones finish and can be correct;
    - slip (`slip_share`): the boxed final answer is miscopied by one -> completed wrong;
    - plain: the reference solution.
    """
    rng = random.Random(f"capgrpo-sft-styles-{cfg.sft_pool_seed}")
    tasks = [
        t
        for t in generate_tasks(cfg.sft_pool_size, cfg.sft_pool_seed, cfg.sft_levels)
        if t["problem"] not in exclude_problems
    ]
    for t in tasks:
        *body, last = t["solution"].split("\n")
        u = rng.random()
        if u < cfg.unboxed_share:
            last = f"The answer is {t['answer']}."
        elif u < cfg.unboxed_share + cfg.slip_share:
            last = f"The answer is $\\boxed{{{_miscopy(t['answer'])}}}$."
        elif u < cfg.unboxed_share + cfg.slip_share + cfg.recheck_share:
            repeats = 1
            while repeats < cfg.recheck_max_repeats and rng.random() < cfg.recheck_continue:
                repeats += 1
            steps = [line for line in body if not line.startswith("We ")]
            body = body + [RECHECK, *steps] * repeats
        t["solution"] = "\n".join([*body, last])
    return tasks


def _miscopy(answer: str) -> str:
    """The answer off by one (in the numerator for a fraction): a completed but wrong final answer."""
    if "\\frac" in answer:
        sign, rest = ("-", answer[1:]) if answer.startswith("-") else ("", answer)
        num, den = rest.removeprefix("\\frac{").removesuffix("}").split("}{")
        return f"{sign}\\frac{{{int(num) + 1}}}{{{den}}}"
    return str(int(answer) + 1)


def warm_start(model, tokenizer, tasks: list[dict], cfg: BuildConfig, work_dir: Path) -> dict:
    """TRL SFT on prompt/completion conversations; the loss is on the completion (solution) tokens only."""
    data = datasets.Dataset.from_list(
        [
            {
                "prompt": prompt_messages(t["problem"]),
                "completion": [{"role": "assistant", "content": t["solution"]}],
            }
            for t in tasks
        ]
    )
    args = trl.SFTConfig(
        output_dir=str(work_dir),
        max_steps=cfg.sft_steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=cfg.sft_learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, cfg.sft_steps // 20),
        weight_decay=0.0,
        max_length=cfg.sft_max_length,
        completion_only_loss=True,
        seed=cfg.seed,
        data_seed=cfg.seed,
        use_cpu=not torch.cuda.is_available(),  # same recipe on CPU (`make base`) and GPU (the shipped base)
        bf16=cfg.sft_bf16,
        save_strategy="no",
        report_to="none",
        logging_steps=max(1, cfg.sft_steps // 10),
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    result = trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    return {"steps": result.global_step, "train_loss": result.training_loss, "loss_curve": losses}


# --- evaluation at the embedded cap --------------------------------------------------------------
def sample_completions(model, tokenizer, problems: list[str], *, cap: int, samples: int, seed: int):
    """`samples` completions per problem at temperature 1; returns (texts, token counts, truncated flags)."""
    prompts = [
        tokenizer.apply_chat_template(prompt_messages(p), tokenize=False, add_generation_prompt=True)
        for p in problems
    ]
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    torch.manual_seed(seed)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **enc,
            max_new_tokens=cap,
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            num_return_sequences=samples,
        )
    texts, lengths, truncated = [], [], []
    for row in out[:, enc["input_ids"].shape[1] :].tolist():
        ended = tokenizer.eos_token_id in row
        row = row[: row.index(tokenizer.eos_token_id)] if ended else row
        texts.append(tokenizer.decode(row, skip_special_tokens=True))
        lengths.append(len(row) + int(ended))
        truncated.append(not ended)
    return texts, lengths, truncated


def evaluate_base(model, tokenizer, tasks: list[dict], *, cap: int, samples: int = 8, seed: int = 0) -> dict:
    """pass@1, outcome mix and gate-qualifying share of `samples`-sample groups (SPEC §2-3)."""
    from policy.arms import gate_v1, gate_v2
    from rewards.grader import GraderPool
    from rewards.outcome import GRADER_VERSION, Outcome

    t0 = time.perf_counter()
    texts, lengths, truncated = sample_completions(
        model, tokenizer, [t["problem"] for t in tasks], cap=cap, samples=samples, seed=seed
    )
    t1 = time.perf_counter()
    references = [t["answer"] for t in tasks for _ in range(samples)]
    with GraderPool() as pool:
        grades = pool.grade_batch(texts, references, truncated)
    outcomes = [Outcome(g.outcome) for g in grades]
    groups = [outcomes[i * samples : (i + 1) * samples] for i in range(len(tasks))]
    counts = {o.value: outcomes.count(o) for o in Outcome}
    graded = len(outcomes) - counts["indeterminate"]
    by_level: dict[int, list[Outcome]] = {}
    for t, group in zip(tasks, groups):
        by_level.setdefault(t["level"], []).extend(group)
    share = lambda xs, pred: sum(map(pred, xs)) / max(1, len(xs))  # noqa: E731
    return {
        "cap": cap,
        "samples": samples,
        "seed": seed,
        "problems": len(tasks),
        "grader_version": GRADER_VERSION,
        "pass@1": counts["correct"] / max(1, graded),
        "outcomes": counts,
        "pass@1_by_level": {
            str(lv): share([o for o in os_ if o is not Outcome.INDETERMINATE], lambda o: o is Outcome.CORRECT)
            for lv, os_ in sorted(by_level.items())
        },
        "gate_v1_share": share(groups, gate_v1),
        "gate_v2_share": share(groups, gate_v2),
        # the groups only gate v2 admits: a correct answer and unresolved failures, but no completed wrong
        "gate_stat": share(groups, lambda g: gate_v2(g) and not gate_v1(g)),
        "completion_tokens": {"median": sorted(lengths)[len(lengths) // 2], "max": max(lengths)},
        "seconds": {"generate": round(t1 - t0, 1), "grade": round(time.perf_counter() - t1, 1)},
    }


@contextmanager
def single_thread():
    """One intra-op thread: on a shared 2-core CPU two threads oversubscribe and run ~10x slower,
    and a fixed thread count keeps the float reductions, hence the weights, reproducible."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def reference_fit(tokenizer, tasks: list[dict], cap: int) -> dict[str, float]:
    """Per level, the share of reference worked solutions (plus the EOS) that fit in `cap` tokens."""
    by_level: dict[int, list[bool]] = {}
    for t in tasks:
        n = len(tokenizer(t["solution"], add_special_tokens=False)["input_ids"]) + 1
        by_level.setdefault(t["level"], []).append(n <= cap)
    return {str(lv): sum(fits) / len(fits) for lv, fits in sorted(by_level.items())}


# --- the whole build -----------------------------------------------------------------------------
def embedded_tasks() -> list[dict]:
    return generate_tasks(EMBEDDED_SNAPSHOT_SIZE, EMBEDDED_SNAPSHOT_SEED)


def embedded_eval_sets(tasks: list[dict]):
    return choose_eval_sets(
        [t["id"] for t in tasks],
        seed=EMBEDDED_EVAL_SETS_SEED,
        heldout_size=EMBEDDED_HELDOUT_SIZE,
        fixed_size=EMBEDDED_FIXED_SIZE,
    )


def is_complete(out: str | os.PathLike, cfg: BuildConfig) -> bool:
    """Whether `out` holds a finished build of exactly this config (the manifest is written last)."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        return False
    manifest = json.loads(path.read_text())
    return manifest.get("config_hash") == cfg.digest() and manifest.get("seed") == cfg.seed


def build_base(
    out: str | os.PathLike,
    cfg: BuildConfig,
    *,
    snapshot: str | os.PathLike | None = None,
    eval_problems: int = 0,
    report_cap: int = EMBEDDED_CAP,
) -> dict:
    """Build, warm-start and save the tiny base to `out`; optionally report on held-out problems."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MANIFEST).unlink(missing_ok=True)
    tasks = generate_tasks(cfg.snapshot_size, cfg.snapshot_seed)
    manifest = {
        "versions": {m.__name__: m.__version__ for m in (torch, transformers, trl)},
        "seed": cfg.seed,
        "config_hash": cfg.digest(),
        "config": asdict(cfg),
        "architecture": ARCHITECTURE,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
    }
    if snapshot is not None:
        manifest["snapshot"] = {"path": str(snapshot), "sha256": write_snapshot(tasks, snapshot)}

    with single_thread(), tempfile.TemporaryDirectory() as work:
        t0 = time.perf_counter()
        tokenizer = build_tokenizer(cfg)
        model = build_model(cfg, tokenizer)
        manifest["parameters"] = model.num_parameters()
        pool = sft_pool(cfg, exclude_problems={t["problem"] for t in tasks})
        manifest["sft"] = warm_start(model, tokenizer, pool, cfg, Path(work))
        manifest["sft"].update(pool_size=len(pool), seconds=round(time.perf_counter() - t0, 1))
        # SFTTrainer may align the generation config with the tokenizer (transformers 5.17 wrote eos [2, 2])
        model.generation_config = sampling_config(tokenizer.eos_token_id, tokenizer.pad_token_id)
        model.save_pretrained(out)  # float32: see docs/embedded_default.md
        tokenizer.save_pretrained(out)
        if eval_problems:
            by_id = {t["id"]: t for t in tasks}
            heldout = [by_id[i] for i in embedded_eval_sets(tasks).heldout[:eval_problems]]
            report = evaluate_base(model, tokenizer, heldout, cap=report_cap, samples=8, seed=cfg.seed)
            report["reference_fit_by_level"] = reference_fit(tokenizer, tasks, report_cap)
            (out / REPORT).write_text(json.dumps(report, indent=1) + "\n")
            manifest["report"] = REPORT
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _print_report(report: dict) -> None:
    n = sum(report["outcomes"].values())
    print(f"held-out {report['problems']} problems x {report['samples']} samples, cap {report['cap']} tokens")
    print(f"  pass@1             {report['pass@1']:.3f}")
    for name, count in report["outcomes"].items():
        print(f"  {name:<18} {count:>4}  ({count / max(1, n):.1%})")
    print(f"  gate v1 groups     {report['gate_v1_share']:.1%}")
    stat = f"correct + unresolved, no wrong: {report['gate_stat']:.1%}"
    print(f"  gate v2 groups     {report['gate_v2_share']:.1%}  ({stat})")
    print("  pass@1 by level    " + "  ".join(f"L{k} {v:.2f}" for k, v in report["pass@1_by_level"].items()))
    fit = report["reference_fit_by_level"]
    print("  references in cap  " + "  ".join(f"L{k} {v:.2f}" for k, v in fit.items()) + "  (whole snapshot)")


def _overrides(pairs: list[str], path: str | None = None) -> dict:
    """BuildConfig fields from a JSON object file (`--overrides`), then from `--set FIELD=JSON` pairs."""
    fields = BuildConfig.__dataclass_fields__
    items = []
    if path:
        try:
            loaded = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SystemExit(f"error: --overrides {path}: {e}") from None
        if not isinstance(loaded, dict):
            raise SystemExit(f"error: --overrides {path}: not a JSON object of BuildConfig fields")
        # keys starting with "_" are comments
        items += [(f"{path}: {k}", k, v) for k, v in loaded.items() if not k.startswith("_")]
    for pair in pairs:
        name, _, value = pair.partition("=")
        items.append((f"--set {pair!r}", name, None if name not in fields else json.loads(value)))
    out = {}
    for where, name, value in items:
        if name not in fields:
            raise SystemExit(f"error: {where}: BuildConfig has no field {name!r}")
        out[name] = tuple(value) if isinstance(value, list) else value
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="Build the embedded tiny base model (see docs/embedded_default.md)"
    )
    ap.add_argument("--out", default=str(EMBEDDED_BASE))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--snapshot", default=str(EMBEDDED_SNAPSHOT), help="where to write the embedded task snapshot"
    )
    ap.add_argument("--sft-steps", type=int, default=None, help=f"default {BuildConfig.sft_steps}")
    ap.add_argument(
        "--overrides",
        metavar="FILE",
        help="a JSON object of BuildConfig fields (e.g. configs/h200-base.json); --set pairs apply after it",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=JSON",
        help="override a BuildConfig field, e.g. --set hidden_size=192 (recorded in the manifest)",
    )
    ap.add_argument("--eval-problems", type=int, default=EMBEDDED_HELDOUT_SIZE, help="0 skips the report")
    ap.add_argument(
        "--report-cap", type=int, default=EMBEDDED_CAP, help="completion-token cap of the base report"
    )
    args = ap.parse_args(argv)
    datasets.disable_progress_bars()
    t0 = time.perf_counter()
    fields = _overrides([], args.overrides)
    if args.sft_steps is not None:
        fields["sft_steps"] = args.sft_steps
    fields.update(_overrides(args.set))
    manifest = build_base(
        args.out,
        BuildConfig(seed=args.seed, **fields),
        snapshot=args.snapshot,
        eval_problems=args.eval_problems,
        report_cap=args.report_cap,
    )
    print(f"snapshot {manifest['snapshot']['path']} sha256 {manifest['snapshot']['sha256']}")
    print(
        f"base model {args.out}: SFT {manifest['sft']['steps']} steps, loss {manifest['sft']['train_loss']:.3f}"
    )
    if args.eval_problems:
        _print_report(json.loads((Path(args.out) / REPORT).read_text()))
    print(f"wall time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
