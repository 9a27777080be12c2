"""The GPU-only branches, checked on CPU: vLLM settings reaching TRL, the vLLM rollouts (and their log-probs)
flowing through selection, CPUAdamW's default, per-sample eval seeds on the vLLM path, and the recipes."""

import dataclasses
import sys
import types
from pathlib import Path

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo
from trl import ModelConfig, TrlParser, get_peft_config

from data.sampler import TaskSampler
from engine.cpu_adamw import CPUAdamW
from engine.micro_batch import MicroBatch
from tests.scripted import TEXT, TextGrader, tiny_random_model
from trainer import setup
from trainer.backends import decide_backends
from trainer.config import CapGRPOConfig
from trainer.evaluation import EvalSpec, generate_eval, sample_seed
from trainer.grpo import CapGRPOTrainer

REPO = Path(__file__).resolve().parent.parent
G = 4
GROUPS = 2
CAP = 24
SPELLED = "CWCW"  # every group qualifies under every gate


class FakeVLLM:
    """Stands in for TRL's VLLMGeneration: records how TRL built it and what it was asked to generate."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.synced = kwargs, [], 0
        self.rollouts: list[list[int]] = []
        # server mode: TRL asks the server whether its log-probs suit the importance-sampling correction
        info = {"model_config": {"logprobs_mode": "processed_logprobs"}}
        self.vllm_client = types.SimpleNamespace(get_server_info=lambda: info)

    def sync_weights(self):
        self.synced += 1

    def generate(self, prompts, images, num_generations, profiler=None):
        self.calls.append((list(prompts), num_generations))
        completions = [self.rollouts[i % G] for i in range(len(prompts))]
        logprobs = [[[-0.5 - 0.01 * t] for t in range(len(c))] for c in completions]
        return prompts, completions, logprobs, None


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def make_trainer(tiny, tmp_path, **overrides) -> CapGRPOTrainer:
    tok, model = tiny
    tasks = {f"p{k}": {"id": f"p{k}", "problem": f"problem p{k}", "answer": "1"} for k in range(4)}
    kw = dict(
        output_dir=str(tmp_path / "run"),
        arm="S2",
        groups_per_step=GROUPS,
        num_generations=G,
        per_device_train_batch_size=G,
        max_completion_length=CAP,
        max_sampling_rounds=1,
        temperature=0.9,
        top_p=0.95,
        beta=0.0,
        use_cpu=True,
        bf16=False,
        report_to="none",
        max_steps=1,
        seed=0,
    )
    kw.update(overrides)
    args, run = setup.decide(CapGRPOConfig(**kw), model, tok, tasks)
    trainer = CapGRPOTrainer(
        model,
        args,
        run=run,
        tasks=tasks,
        sampler=TaskSampler(sorted(tasks), seed=0),
        grader=TextGrader(),
        processing_class=tok,
    )
    trainer.model.train()
    return trainer


# --- vLLM ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["colocate", "server"])
def test_vllm_settings_reach_trl_and_rollouts_flow_through_selection(tiny, tmp_path, monkeypatch, mode):
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", FakeVLLM)
    monkeypatch.setattr(setup, "vllm_installed", lambda: True)  # the fake engine stands in
    tok = tiny[0]
    trainer = make_trainer(
        tiny,
        tmp_path,
        use_vllm=True,
        vllm_mode=mode,
        vllm_gpu_memory_utilization=0.35,
        vllm_tensor_parallel_size=1,
        vllm_importance_sampling_correction=True,
    )
    vllm = trainer.vllm_generation
    kw = vllm.kwargs
    assert (kw["mode"], kw["gpu_memory_utilization"], kw["tensor_parallel_size"]) == (mode, 0.35, 1)
    assert (kw["max_completion_length"], kw["temperature"], kw["top_p"]) == (CAP, 0.9, 0.95)
    # one selection round generates a whole step's rollouts in one call: vLLM must admit them all
    assert kw["max_num_seqs"] == GROUPS * G

    vllm.rollouts = [
        tok(TEXT[c], add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for c in SPELLED
    ]
    trainer.current_gradient_accumulation_steps = 1
    output = trainer._generate_and_score_completions(None)

    (prompts, n), *more = vllm.calls
    assert not more and n == G and len(prompts) == GROUPS * G  # G copies of each problem, then TRL's `n`
    assert vllm.synced == 1  # weights pushed once per step, before the first generation
    for k, task_id in enumerate(trainer.step_record.task_ids_trained):
        for ids in prompts[k * G : (k + 1) * G]:
            assert f"problem {task_id}" in tok.decode(ids)
    assert trainer.step_record.groups["qualified"] == GROUPS
    assert trainer.step_record.outcomes_sampled["correct"] == GROUPS * G // 2
    # vLLM's sampling log-probs ride with the selected rollouts into TRL's importance-sampling correction
    assert "importance_sampling_ratio" in output
    lengths = output["completion_mask"].sum(1)
    assert (lengths == torch.tensor([len(vllm.rollouts[i % G]) for i in range(GROUPS * G)])).all()


def test_a_trainer_turns_cudnn_attention_off_for_its_backward(tiny, tmp_path):
    """pytorch/pytorch#196678: cuDNN's SDPA backward returns NaN grad_q on H100/H200 at padded lengths 64 mod 128
    (10 of 172 steps of docs/experiment-qwen's launch 1 skipped their update for it); the flag is global."""
    import torch

    torch.backends.cuda.enable_cudnn_sdp(True)
    make_trainer(tiny, tmp_path)
    assert not torch.backends.cuda.cudnn_sdp_enabled()


def test_transformers_generation_stays_off_vllm(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(trl_grpo, "VLLMGeneration", FakeVLLM)
    trainer = make_trainer(tiny, tmp_path)
    assert not trainer.use_vllm and not hasattr(trainer, "vllm_generation")
    assert trainer.generation_config.max_new_tokens == CAP


# --- CPUAdamW default --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("cpu_adamw", "cuda", "processes", "expected"),
    [
        (None, True, 1, CPUAdamW),  # the default: single-process GPU run
        (None, False, 1, torch.optim.AdamW),  # CPU
        (None, True, 2, torch.optim.AdamW),  # multi-GPU: FSDP2 / ZeRO-3 shard plain AdamW
        (False, True, 1, torch.optim.AdamW),
        (True, False, 1, CPUAdamW),
    ],
)
def test_cpu_adamw_default(tiny, tmp_path, cpu_adamw, cuda, processes, expected):
    trainer = make_trainer(tiny, tmp_path, cpu_adamw=cpu_adamw)
    # what the setup decides for a GPU recipe (use_cpu false) on a machine with (or without) CUDA and this
    # many processes
    trainer.args.use_cpu = False
    backends = decide_backends(trainer.args, world=processes, cuda=cuda)
    trainer.run_setup = dataclasses.replace(trainer.run_setup, backends=backends)
    trainer.optimizer = None
    optimizer = trainer.create_optimizer()
    assert type(optimizer) is expected
    assert backends.cpu_adamw == (expected is CPUAdamW)  # what run.json's launch.optimizer records
    trainable = {id(p) for p in trainer.model.parameters() if p.requires_grad}
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == trainable


# --- evaluation seeds on the vLLM path ---------------------------------------------------------------------
def test_vllm_eval_builds_one_seeded_request_per_sample(tiny, monkeypatch):
    tok = tiny[0]
    made = []

    class SamplingParams:
        def __init__(self, **kwargs):
            made.append(kwargs)
            self.kwargs = kwargs

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(SamplingParams=SamplingParams))
    eos = [tok.eos_token_id]
    answers = {"t1": " \\boxed{1}", "t2": " \\boxed{2}"}

    class FakeLLM:
        def generate(self, requests, params, use_tqdm):
            assert len(requests) == len(params)
            out = []
            for request, p in zip(requests, params, strict=True):
                task = "t1" if "problem one" in tok.decode(request["prompt_token_ids"]) else "t2"
                ids = tok(answers[task], add_special_tokens=False)["input_ids"]
                stop = p.kwargs["seed"] % 2 == 0  # some samples stop, the others run to the cap
                finish = types.SimpleNamespace(
                    token_ids=ids + eos if stop else ids, finish_reason="stop" if stop else "length"
                )
                out.append(types.SimpleNamespace(outputs=[finish]))
            return out

    tasks = [
        {"id": "t2", "problem": "problem two", "answer": "2"},
        {"id": "t1", "problem": "problem one", "answer": "1"},
    ]
    spec = EvalSpec(cap=CAP, temperature=0.7, top_p=0.9, seed=99, samples={"fixed32": 3})
    rows = generate_eval(
        None, tok, tasks, spec, "fixed32", llm=FakeLLM(), grade_fn=TextGrader().grade_batch, eos=eos
    )

    expected = [sample_seed(99, t, i) for t in ("t1", "t2") for i in range(3)]
    assert [p["seed"] for p in made] == expected == [r["seed"] for r in rows]
    assert len(set(expected)) == len(expected)
    assert all(
        (p["max_tokens"], p["temperature"], p["top_p"], p["stop_token_ids"]) == (CAP, 0.7, 0.9, eos)
        for p in made
    )
    for r in rows:
        stopped = r["seed"] % 2 == 0
        want = ("correct" if r["task_id"] == "t1" else "wrong") if stopped else "truncated"
        assert r["outcome"] == want
    assert sample_seed(99, "t1", 0) != sample_seed(100, "t1", 0) != sample_seed(99, "t1", 1)


# --- recipes ---------------------------------------------------------------------------------------------
RECIPES = sorted(REPO.glob("configs/mimo9b*.yaml"))


@pytest.mark.parametrize("recipe", RECIPES, ids=[p.stem for p in RECIPES])
def test_recipes_parse(recipe, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")  # more would make TrainingArguments start torch.distributed
    monkeypatch.setattr(setup, "vllm_installed", lambda: True)
    # bf16 recipes need `use_cpu` to parse on a machine without a GPU; nothing else is overridden
    args, model_args = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(recipe), "--arm", "S4", "--use_cpu", "true"]
    )
    arm = setup.resolve(args)
    assert args.arm == "S4" and arm.policy.gate == "v2" and args.bf16
    args = setup.settled(args, arm, world=1)
    rows = args.per_device_train_batch_size
    args = setup.batch_arithmetic(args, MicroBatch(rows, False, 0, "explicit"), world=1)
    # one GPU: our compiled generation (measured faster, docs/PERFORMANCE.md); LoRA keeps vLLM (unmeasured)
    assert args.use_vllm == recipe.stem.endswith("-lora")
    assert args.vllm_mode == "colocate" and args.max_completion_length == 8192
    rollouts = args.groups_per_step * args.num_generations
    assert args.gradient_accumulation_steps * args.per_device_train_batch_size == rollouts
    # TRL sizes vLLM's batch from these: a selection round's rollouts fit in one vLLM call
    assert args.per_device_train_batch_size * args.steps_per_generation == rollouts
    # the same recipe under FSDP2 / ZeRO-3 on 2, 4 or 8 GPUs passes CapGRPOConfig's divisibility rules
    for world in (2, 4, 8):
        assert (
            rollouts % (world * args.per_device_train_batch_size) == 0
            and args.problems_per_round % world == 0
        )
    peft = get_peft_config(model_args)
    assert (peft is not None) == recipe.stem.endswith("-lora")
    if peft is not None:
        assert peft.r == model_args.lora_r and not args.cpu_adamw


def test_recipe_asking_for_vllm_falls_back_without_it(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setattr(setup, "vllm_installed", lambda: False)
    args, _ = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(
        ["--config", str(REPO / "configs/mimo9b-lora.yaml"), "--use_cpu", "true"]
    )
    with pytest.warns(UserWarning, match="vLLM is not installed"):
        run = setup.settled(args, setup.resolve(args), world=1)
    assert not run.use_vllm and args.use_vllm  # the run's settings; the declaration stays as written


@pytest.mark.parametrize("extra", [[], ["--eval_every", "0", "--resume", "{run}"]])
def test_deepspeed_launch_refuses_eval_and_resume(extra, monkeypatch, tmp_path):
    """ZeRO-3 partitions what in-training evaluation and stateNNN/ need whole: refused up front, by name."""

    extra = [x.format(run=tmp_path / "run") for x in extra]  # a resume continues output_dir in place
    argv = ["--config", str(REPO / "configs/embedded.yaml"), "--output_dir", str(tmp_path / "run"), *extra]
    args, model_args = TrlParser((CapGRPOConfig, ModelConfig)).parse_args_and_config(argv)
    monkeypatch.setenv(
        "ACCELERATE_USE_DEEPSPEED", "true"
    )  # after parsing: deepspeed itself is not installed here
    with pytest.raises(ValueError, match="under DeepSpeed set eval_every: 0 .* and do not --resume"):
        setup.build_trainer(args, model_args)
    assert not (tmp_path / "run").exists()  # nothing loaded, nothing written
