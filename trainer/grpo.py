"""`CapGRPOTrainer`: TRL's `GRPOTrainer` with graded outcomes, cap policies, gates and dynamic group selection.

What TRL does unchanged: generation backends (transformers / vLLM), tokenisation, advantages (group mean and
std over rewards, NaN-aware, so indeterminate rollouts drop out of the baseline), the clipped token-level
loss (`loss_type="dapo"`: normalised by active tokens of the whole step) and logging.
What we change, each at the narrowest hook:
- which rollouts a step trains on: `_generate_and_score_completions` runs selection rounds first;
- the reward: outcomes are graded once during selection and reused (`_calculate_rewards`);
- which tokens carry loss: the cap policy's loss mask goes in TRL's `tool_mask` slot, which TRL applies to
  the loss, to the token-count normaliser and to its entropy/clip metrics.
One `StepRollouts` carries a step's selected rollouts from selection to the loss: TRL's scoring calls back
into `_generate_single_turn` and `_calculate_rewards`, which read it, and `_apply_cap_policy` masks from it.
"""

import statistics
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather, gather_object
from datasets import Dataset
from trl import GRPOTrainer
from trl.models import unwrap_model_for_generation

from cards.push import push
from cards.run_card import write_run_card
from data.prompt import prompt_messages
from engine import cpu_generation, generation, lora_push
from engine.chunked_gated_delta import chunked_gated_delta, torch_on_cpu
from engine.compiled_parts import compiled_parts
from engine.cpu_adamw import CPUAdamW
from engine.fla_conv import fla_conv
from engine.micro_batch import MicroBatch
from policy.arms import Arm
from rewards.outcome import Outcome, reward_of
from rewards.reward import OutcomeReward
from rundir.state import load_state, restore_rng_state
from trainer import sampler_agreement
from trainer.backends import Backends
from trainer.checkpoint import Resume, import_optimizer, load_masters_into_model
from trainer.config import CapGRPOConfig
from trainer.selection import Group, Selection, select_groups, shows_gate_gap
from trainer.step_record import StepRecord


def step_tickets(args: CapGRPOConfig) -> Dataset:
    """The Trainer's dataset: one epoch = one optimizer step. Problems come from the task sampler instead,
    because how many a step needs is only known after grading."""
    return Dataset.from_dict({"prompt": [prompt_messages("")] * args.groups_per_step})


@dataclass(frozen=True)
class RunSetup:
    """What the run's setup decided (trainer/setup.py), which the trainer follows: run.json `arm`, `launch`."""

    arm: Arm  # the cap policy, its gate and groups per step
    backends: Backends
    micro_batch: MicroBatch  # TRL's batch arithmetic in the trainer's args comes from it


@dataclass(frozen=True)
class StepRollouts:
    """This process's share of one optimizer step's selected rollouts, in training order, from selection to
    the loss. `active`: the row carries loss; `counted`: its tokens count in the token normaliser (both False
    for every row of a filler group, for indeterminate rollouts, and as the cap policy says otherwise)."""

    prompts: list[list[dict]]  # chat messages, one per rollout
    answers: list[str]
    completion_ids: list[list[int]]
    logprobs: list[list[float]] | None  # the sampler's, when the generation backend returns them
    outcomes: list[Outcome]
    active: list[bool]
    counted: list[bool]

    def inputs(self) -> list[dict]:
        """What TRL's `_generate_and_score_completions` is handed: the prompts (and the reference answers)."""
        return [{"prompt": p, "answer": a} for p, a in zip(self.prompts, self.answers, strict=True)]


class CapGRPOTrainer(GRPOTrainer):
    def __init__(
        self,
        model,
        args: CapGRPOConfig,
        *,
        run: RunSetup,
        tasks: dict[str, dict],
        sampler,
        grader,
        resume: Resume | None = None,
        **kwargs,
    ):
        # cuDNN's SDPA backward gives NaN grad_q on Hopper at padded lengths 64 mod 128 (pytorch/pytorch#196678, met
        # through Qwen2.5's attention in huggingface/trl#7181: 10 of 172 docs/experiment-qwen steps); flash and
        # memory-efficient SDPA stay on
        torch.backends.cuda.enable_cudnn_sdp(False)
        self.tasks = tasks  # task id -> {"problem", "answer", ...} of the training pool
        self.task_sampler = sampler
        self.run_setup = run
        self.arm = run.arm
        self.policy = self.arm.policy
        self.policy.check(args.max_completion_length, args.loss_type)
        eos = model.generation_config.eos_token_id
        self.outcome_reward = OutcomeReward(eos if isinstance(eos, list) else [eos], pool=grader)
        super().__init__(
            model=model,
            reward_funcs=[self.outcome_reward],
            args=args,
            train_dataset=step_tickets(args),
            **kwargs,
        )
        self.outcome_reward.eos_token_ids = frozenset(self.eos_token_ids)  # TRL adds the tokenizer's EOS
        torch_on_cpu(self.model)  # a caller's own model; with fla: CPU tensors take the torch reference
        lora_push.install(
            self
        )  # LoRA pushes to vLLM leave the base weights as they were (engine/lora_push.py)
        self.generation_shapes = None  # None: TRL's generation path
        if run.backends.compiled_rollouts:
            rows = args.generation_rows or args.problems_per_round * self.num_generations
            self.generation_shapes = generation.FixedShapes(
                rows, args.prompt_multiple, args.max_completion_length
            )
        self.step_record = StepRecord()  # steps.jsonl's row of the step in progress (StepsLog writes it)
        self._selected: StepRollouts | None = None  # set while TRL scores the selected rollouts, else None
        self._train_started: float | None = None  # when the step's batch was ready (its `seconds.train`)
        self._step_logps: list[torch.Tensor] = []
        self._last_logps: torch.Tensor | None = None  # the latest loss pass's, for _compute_loss
        # the stateNNN/ being resumed (train.py's load_resume_state verified it), its (tensors, meta)
        self.resume_state = resume.state if resume is not None else None
        self._resume = (resume.tensors, resume.meta) if self.resume_state is not None else None

    # --- selection ----------------------------------------------------------------------------------
    def _sample_round(self, task_ids: list[str]) -> list[Group]:
        """Generate G rollouts for this process's share of `task_ids`, grade them, return all groups."""
        G, world, rank = self.num_generations, self.accelerator.num_processes, self.accelerator.process_index
        share = len(task_ids) // world
        mine = task_ids[rank * share : (rank + 1) * share]
        prompts = [
            prompt_messages(self.tasks[t]["problem"], self.args.system_prompt) for t in mine for _ in range(G)
        ]
        t0 = time.perf_counter()
        prompt_ids, _, _ = self._tokenize_prompts(prompts)
        completion_ids, logprobs = self._generate_rollouts(prompt_ids, G)
        t1 = time.perf_counter()
        texts = self.processing_class.batch_decode(completion_ids, skip_special_tokens=True)
        answers = [self.tasks[t]["answer"] for t in mine for _ in range(G)]
        grades = self.outcome_reward.grade(texts, completion_ids, answers)
        t2 = time.perf_counter()
        seconds = self.step_record.seconds
        seconds["generate"] += t1 - t0
        seconds["grade"] += t2 - t1
        report = self.outcome_reward.last_report.to_log(prefix="")  # where the grader failed, per round
        seconds["grade_lost"] += report.pop("seconds_lost")  # on items that then timed out
        for timing in ("seconds", "cpu_seconds"):
            report.pop(timing)
        self.step_record.grader.update(report)
        rows = [
            (ids, None if logprobs is None else logprobs[i], g.outcome.value, g.answer)
            for i, (ids, g) in enumerate(zip(completion_ids, grades, strict=True))
        ]
        rows = [r for part in gather_object([rows]) for r in part]  # global, in task order
        return [
            Group(t, [Outcome(r[2]) for r in rows[i * G : (i + 1) * G]], rows[i * G : (i + 1) * G])
            for i, t in enumerate(task_ids)
        ]

    def _generate_rollouts(self, prompt_ids: list[list[int]], G: int) -> tuple[list[list[int]], Any]:
        # TRL's transformers path decodes eagerly (it sets disable_compile); on one GPU we run the same
        # model compiled at fixed shapes (engine/generation.py), elsewhere TRL's own path (or vLLM).
        # On a CPU, rows that ended leave the batch (engine/cpu_generation.py): the same tokens, less work.
        if self.generation_shapes is None:
            with cpu_generation.compact_decoding(self.accelerator.unwrap_model(self.model)):
                return super()._generate_single_turn(prompt_ids, None, {}, G)
        shapes = self.generation_shapes
        config = generation.compiled_config(self.generation_config, shapes, max(map(len, prompt_ids)))
        pad = self.processing_class.pad_token_id
        tokens = []
        with (
            unwrap_model_for_generation(
                self.model_wrapped,
                self.accelerator,
                generation_kwargs=self.generation_kwargs,
                gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs,
            ) as model,
            generation.eval_mode(model),
        ):
            for start in range(0, len(prompt_ids), shapes.rows):
                tokens += generation.generate_call(
                    model, prompt_ids[start : start + shapes.rows], config, shapes, pad
                )
        return [generation.cut_after_eos(t, self.eos_token_ids) for t in tokens], None

    def _select(self) -> tuple[list[Group], list[bool], Selection]:
        """Exactly groups_per_step groups: the qualifying ones, padded with loss-free copies if the bound hit."""
        args = self.args
        selection = select_groups(
            self._sample_round,
            self.task_sampler.take,
            self.policy,
            groups_per_step=args.groups_per_step,
            problems_per_round=args.problems_per_round,
            max_sampling_rounds=args.max_sampling_rounds,
        )
        groups, trained = list(selection.groups), [True] * len(selection.groups)
        # Batch shapes stay fixed (and equal on every process); padding groups carry no loss at all.
        kept = {id(g) for g in selection.groups}
        fillers = [g for g in selection.sampled if id(g) not in kept] or selection.sampled
        for i in range(selection.shortfall):
            groups.append(fillers[i % len(fillers)])
            trained.append(False)
        return groups, trained, selection

    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return super()._generate_and_score_completions(inputs)
        self.step_record = StepRecord()
        groups, trained, selection = self._select()
        step = self._step_rollouts(groups, trained)
        self._selected = step  # read by the two hooks TRL calls back into while it scores these rollouts
        try:
            output = super()._generate_and_score_completions(step.inputs())
        finally:
            self._selected = None
        self._record_sampler_agreement(output)
        output = self._apply_cap_policy(output, step)
        self._record_selection(selection, groups, trained, output)
        self._train_started = time.perf_counter()
        return output

    def _step_rollouts(self, groups: list[Group], trained: list[bool]) -> StepRollouts:
        """Every rollout of the step in global order, cut to this process's contiguous slice."""
        rows = []
        for group, ok in zip(groups, trained, strict=True):
            task = self.tasks[group.task_id]
            for ids, logps, outcome, _ in group.rollouts:
                outcome = Outcome(outcome)
                rows.append(
                    (
                        prompt_messages(task["problem"], self.args.system_prompt),
                        task["answer"],
                        ids,
                        logps,
                        outcome,
                        ok and self.policy.carries_loss(outcome),
                        ok and self.policy.counts_in_normaliser(outcome),
                    )
                )
        share = len(rows) // self.accelerator.num_processes
        mine = rows[self.accelerator.process_index * share :][:share]
        prompts, answers, ids, logps, outcomes, active, counted = (list(c) for c in zip(*mine, strict=True))
        logprobs = None if logps[0] is None else logps
        return StepRollouts(prompts, answers, ids, logprobs, outcomes, active, counted)

    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, **kwargs):
        # During training the rollouts were generated (and graded) by selection rounds; hand them to TRL.
        if self._selected is None:
            return super()._generate_single_turn(
                prompt_ids, images, multimodal_fields, num_generations, **kwargs
            )
        assert len(self._selected.completion_ids) == len(prompt_ids), (
            "selected rollouts and prompts out of step"
        )
        return self._selected.completion_ids, self._selected.logprobs

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        # Outcomes were graded once during selection; grading again would double the grader's cost.
        # The cap policy turns outcome and length into the reward (NaN: out of the baseline, advantage 0).
        if self._selected is None:
            return super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        cap = self.args.max_completion_length
        rewards = [
            [self.policy.reward(outcome, len(ids), cap)]
            for outcome, ids in zip(self._selected.outcomes, completion_ids_list, strict=True)
        ]
        return gather(torch.tensor(rewards, device=self.accelerator.device))

    def _apply_cap_policy(self, output: dict, step: StepRollouts) -> dict:
        """Rows that carry no loss (policy-masked, indeterminate, padding) leave the loss; the normaliser counts
        the rows the policy counts (the same rows for every policy but one that splits them, see arms.py)."""
        device, completion = self.accelerator.device, output["completion_mask"]

        def row_mask(rows: list[bool]) -> torch.Tensor:
            mask = torch.tensor(rows, device=device)[:, None].expand_as(completion).to(completion.dtype)
            return mask * output["tool_mask"] if "tool_mask" in output else mask

        counted = row_mask(step.counted)
        output["tool_mask"] = row_mask(step.active).contiguous()
        output["num_items_in_batch"] = gather((completion * counted).sum()).sum()
        return output

    def _record_sampler_agreement(self, output: dict) -> None:
        """The sampler's log-probs of the step's tokens against the trainer's, recomputed with the weights
        just pushed (trainer/sampler_agreement.py): over every sampled token, masked rows included."""
        if output.get("sampling_per_token_logps") is None or output.get("old_per_token_logps") is None:
            return  # no vLLM, or TRL's importance-sampling correction off: nothing to compare
        local = sampler_agreement.agreement(
            output["old_per_token_logps"], output["sampling_per_token_logps"], output["completion_mask"]
        )
        if (record := sampler_agreement.combine(gather_object([local]))) is not None:
            self.step_record.update(sampler_agreement=record)

    def record_train_seconds(self) -> None:
        """`seconds.train` of the step in progress: from its selected batch to now (StepsLog, at step end)."""
        if self._train_started is not None:
            self.step_record.seconds["train"] = time.perf_counter() - self._train_started

    def _record_selection(self, selection: Selection, groups, trained, output) -> None:
        sampled = [o for g in selection.sampled for o in g.outcomes]
        lengths = [len(r[0]) for g in selection.sampled for r in g.rollouts]
        trained_outcomes = [o for g, ok in zip(groups, trained, strict=True) if ok for o in g.outcomes]
        graded = [reward_of(o) for o in sampled if o is not Outcome.INDETERMINATE]
        self.step_record.update(
            groups={
                "sampled": len(selection.sampled),
                "qualified": selection.qualified,
                "trained": sum(trained),
                "rounds": selection.rounds,
                "bound_hit": selection.shortfall > 0,
                "rejected": dict(sorted(selection.rejected.items())),
            },
            gate_stat=sum(shows_gate_gap(g.outcomes) for g in selection.sampled)
            / max(len(selection.sampled), 1),
            outcomes_sampled=outcome_counts(sampled),
            outcomes_trained=outcome_counts(trained_outcomes),
            reward_mean=sum(graded) / len(graded) if graded else None,
            completion_length={
                "median": statistics.median(lengths),
                "mean": sum(lengths) / len(lengths),
                "max": max(lengths),
            },
            tokens_trained=int(output["num_items_in_batch"].item()),
            task_ids_trained=[g.task_id for g, ok in zip(groups, trained, strict=True) if ok],
            sampler=self.task_sampler.state_dict(),
        )
        scalars = {
            "groups/sampled": len(selection.sampled),
            "groups/qualified": selection.qualified,
            "groups/trained": sum(trained),
            "groups/rounds": selection.rounds,
            "gate_stat": self.step_record.gate_stat,
            **{
                f"outcomes/{k}": v / max(len(sampled), 1)
                for k, v in self.step_record.outcomes_sampled.items()
            },
        }
        for k, v in scalars.items():
            self._metrics["train"][f"capgrpo/{k}"].append(float(v))

    # --- metrics of the policy on its own samples ---------------------------------------------------
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        # Keep the loss pass's log-probs so the step can report their median over active tokens; on GPUs the
        # forward runs our chunked gated delta rule (its backward moves ~half the bytes of transformers') or,
        # with fla installed, fla's rule and causal conv; with compile_norms_mlp fused norms and MLPs.
        backends = self.run_setup.backends
        rule = (
            chunked_gated_delta(self.model, self.args.compile_gated_delta_terms)
            if backends.chunked_gated_delta
            else nullcontext()
        )
        with (
            rule,
            fla_conv(self.model, backends.fla_conv),
            compiled_parts(self.model, self.args.compile_norms_mlp),
        ):
            logps, entropies, aux = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        self._last_logps = logps
        return logps, entropies, aux

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        self.step_record.nonfinite_losses += int(not torch.isfinite(loss.detach()).all())
        mask = (inputs["completion_mask"] * inputs["tool_mask"]).bool()
        self._step_logps.append(self._last_logps.detach()[mask].float().cpu())
        return loss

    def log_eval_metrics(self, metrics: dict[str, float]) -> None:
        """Step-0 evaluation gets a log of its own; later ones join their step's log (and steps.jsonl row)."""
        if self.state.global_step == 0:
            self.log(metrics)
        else:
            for k, v in metrics.items():
                self._metrics["train"][k].append(v)

    def pop_logprob_stats(self) -> dict[str, float | None]:
        """Median and mean log-prob of the sampled tokens under the current policy, over the step's active
        tokens. The mean is there for near-deterministic models (the embedded base), whose median is ~0."""
        local = torch.cat(self._step_logps) if self._step_logps else torch.empty(0)
        self._step_logps = []
        everything = torch.cat(gather_object([local]))
        if not everything.numel():
            return {"logprob_median": None, "logprob_mean": None}
        return {"logprob_median": everything.median().item(), "logprob_mean": everything.mean().item()}

    def synced_vllm_engine(self):
        """The colocated vLLM engine holding this step's weights (in-training evaluation): pushed as TRL pushes
        them before a step's first rollout, and marked so, so that the step's rollouts do not push them again."""
        if self.state.global_step != self._last_loaded_step:
            self.vllm_generation.sync_weights()
            self._last_loaded_step = self.state.global_step
        return self.vllm_generation.llm

    # --- cards and the Hub: the run directory is the unit we publish (SPEC §8) ----------------------------
    def create_model_card(self, *args, **kwargs):
        # TRL's generic card would overwrite the run card; ours is generated from the run's own files.
        write_run_card(self.args.output_dir)

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, **kwargs):
        # Trainer.push_to_hub would upload the whole output dir (states included) under TRL's card.
        repo = self.args.hub_model_id or Path(self.args.output_dir).name
        revision = kwargs.get("revision") or self.args.hub_revision or "main"
        private = bool(self.args.hub_private_repo)
        return push(
            self.args.output_dir, repo, revision=revision, private=private, commit_message=commit_message
        )

    # --- optimizer: CPU-offloaded AdamW for single-process GPU runs (SPEC §6) -----------------------------
    def create_optimizer(self, model=None):
        if not self.run_setup.backends.cpu_adamw:
            return super().create_optimizer(model)
        model = model or self.model
        decay = set(self.get_decay_parameter_names(model))
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        groups = [
            {"params": [(n, p) for n, p in named if n in decay], "weight_decay": self.args.weight_decay},
            {"params": [(n, p) for n, p in named if n not in decay], "weight_decay": 0.0},
        ]
        groups = [g for g in groups if g["params"]]  # torch refuses an empty group beside named ones (LoRA)
        on_device = self.run_setup.micro_batch.adamw_state_on_gpu  # sized with the micro-batch
        self.optimizer = CPUAdamW(
            groups,
            lr=self.args.learning_rate,
            betas=(self.args.adam_beta1, self.args.adam_beta2),
            eps=self.args.adam_epsilon,
            on_device=on_device,
            chunk_elems=2**26 if on_device else 2**20,  # few, large batches: a GPU pass is launch-bound below
        )
        return self.optimizer

    # --- exact resume from stateNNN/ (the Trainer's own format pickles the optimizer) -------------------
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if self._resume is None:  # train.py verified and loaded it up front
            self._resume = load_state(Path(resume_from_checkpoint))
        load_masters_into_model(self.accelerator.unwrap_model(model or self.model), self._resume[0])

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None:
            return super()._load_optimizer_and_scheduler(checkpoint)
        tensors, meta = self._resume
        import_optimizer(self, tensors, meta["optimizer"])
        self.lr_scheduler.load_state_dict(meta["scheduler"])
        self.task_sampler.load_state_dict(meta["task_sampler"])

    def _load_rng_state(self, checkpoint):
        # Called right before the next step's dataloader iterator is built, exactly where the state was taken.
        # Each process continues its own streams (load_resume_state checked the process count).
        if checkpoint is not None:
            restore_rng_state(self._resume[1]["rng"][self.accelerator.process_index])


def outcome_counts(outcomes: Sequence[Outcome]) -> dict[str, int]:
    c = Counter(outcomes)
    return {o.value: c.get(o, 0) for o in Outcome}
