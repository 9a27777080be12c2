"""What bench/grpo_step.py measures in a step: a TrainerCallback that marks each phase's wall clock, times the
generation calls and the coin's grading, evaluates and saves when asked, and keeps one record per step."""

import contextlib
import hashlib
import importlib
import json
import resource
import time
from pathlib import Path

import torch
from accelerate.utils import gather_object
from transformers import TrainerCallback
from trl import GRPOTrainer

from bench.coin import CoinGrader
from policy.arms import resolve_arm
from rewards.outcome import Outcome
from trainer.checkpoint import save_state_dir, save_weights
from trainer.evaluation import EvalSpec, generate_eval
from trainer.grpo import CapGRPOTrainer

# TRL's own sampler-agreement metrics (plain TRL + vLLM); ours records trainer/sampler_agreement.py's
TRL_SAMPLING = {
    "mean_abs_delta": "sampling/sampling_logp_difference/mean",
    "max_abs_delta": "sampling/sampling_logp_difference/max",
    "ratio_min": "sampling/importance_sampling_ratio/min",
    "ratio_max": "sampling/importance_sampling_ratio/max",
}
COLUMNS = ("generate", "grade", "train", "optimizer", "other", "eval", "save", "total")


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
        policy = resolve_arm(self.trainer.args.arm).policy
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
