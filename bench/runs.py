"""One run of bench/grpo_step.py: ours (CapGRPOTrainer) or plain TRL's GRPOTrainer on the same model, tasks,
seeds and settings, with the coin grading and the probe timing it; its record back."""

import functools
import hashlib
import importlib.util
import os
import time
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOTrainer

from bench.coin import CoinGrader
from bench.models import padded_tokenizer, random_qwen35
from bench.probe import Probe
from data.prompt import prompt_messages
from data.sampler import TaskSampler
from engine.chunked_gated_delta import FLA
from engine.cpu_adamw import CPUAdamW
from engine.sharding import is_sharded
from rewards.reward import OutcomeReward
from trainer.config import CapGRPOConfig
from trainer.grpo import CapGRPOTrainer
from trainer.setup import decide, load_base_model

VLLM_RUNS = ("ours-vllm", "ours-vllm-sleep", "ours-vllm-stale", "plain-vllm")


def rule_of(name: str, args, backends) -> str:
    """The chunked gated delta rule the run's training pass ran: plain TRL's GRPOTrainer never enters ours,
    though the shared config resolves it."""
    if FLA:  # transformers binds fla's kernels by itself, and ours steps aside
        return "fla"
    if name.startswith("plain") or not backends.chunked_gated_delta:
        return "transformers"
    return "ours, chunk terms compiled" if args.compile_gated_delta_terms else "ours"


def load_model(a, device: torch.device):
    if a.model == "random-qwen35":
        tokenizer = padded_tokenizer(a.vocab)
        return random_qwen35(a, tokenizer, device), tokenizer
    model, _ = load_base_model(a.model, "bfloat16" if device.type == "cuda" else "float32")
    return model.to(device), AutoTokenizer.from_pretrained(a.model, padding_side="left")


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
        deterministic_kv_writes=a.deterministic_kv_writes,
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
    eval_tasks = tasks[len(tasks) - a.eval_problems :] if a.eval_problems else []
    pool = tasks[: len(tasks) - a.eval_problems]
    # the setup's decisions (vLLM off, with a warning, where it is not installed); plain TRL takes the same args
    args, run = decide(args, model, tokenizer, {t["id"]: t for t in pool}, world=max(1, args.world_size))
    if args.use_vllm:
        engine_for(model, tokenizer, work / name / "model")
        if importlib.util.find_spec("flashinfer") is None:  # not carried: vLLM's sampler must not import it
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
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
        single = run.backends.cpu_adamw
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
            run=run,
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
            "micro_batch_basis": run.micro_batch.basis,
            "generation": "compiled"
            if getattr(trainer, "generation_shapes", None)
            else f"vllm colocate{', sleep mode' if args.vllm_enable_sleep_mode else ''}"
            if args.use_vllm
            else "trl",
            "gated_delta_rule": rule_of(name, args, run.backends),
            "adamw_state_on_gpu": run.micro_batch.adamw_state_on_gpu,
            "tf32": bool(args.tf32),
            "compile_norms_mlp": args.compile_norms_mlp and not name.startswith("plain"),  # ours only
            "fla_conv": run.backends.fla_conv and not name.startswith("plain"),  # ours only
            "deterministic": bool(args.deterministic),
            "deterministic_fill_memory": bool(args.deterministic_fill_memory),
            "deterministic_kv_writes": bool(args.deterministic_kv_writes),
        },
        "distributed_type": trainer.accelerator.distributed_type.value,
        "sharded": is_sharded(trainer.model),
        "steps": probe.records,
    }
