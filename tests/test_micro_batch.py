"""Training micro-batches the trainer sizes itself (engine/micro_batch.py), on CPU with fake memory budgets."""

import json

import pytest
import torch

from data.prompt import SYSTEM_PROMPT
from engine import micro_batch
from tests.scripted import G, make_trainer, tiny_random_model
from trainer import setup
from trainer.backends import decide_backends
from trainer.config import CapGRPOConfig, ConfigError
from trainer.grpo import CapGRPOTrainer

PROMPT, CAP = 40, 24


@pytest.fixture(scope="module")
def tiny():
    return tiny_random_model()


def row_bytes(text, tokens: int, cap: int, checkpointing: bool) -> float:
    every, completion = micro_batch.bytes_per_token(text, 4, checkpointing)  # float32
    return tokens * every + cap * completion


def on_cpu(args):
    """The backends of `args` decided on this machine (no CUDA), as the setup decides them."""
    return decide_backends(args, world=1, cuda=False)


def config(tmp_path, **kw) -> CapGRPOConfig:
    base = dict(output_dir=str(tmp_path), num_generations=G, groups_per_step=8, max_completion_length=CAP)
    args = CapGRPOConfig(**base | kw, use_cpu=True, bf16=False, report_to="none", max_steps=1)
    return setup.settled(args, setup.resolve(args), world=1)  # the run's settings, which the sizing reads


def test_a_fake_budget_gets_the_largest_micro_batch_that_fits(tiny, tmp_path):
    _, model = tiny
    text = model.config.get_text_config()
    args = config(tmp_path)  # 32 rollouts: micro-batches of 32, 16, 8, 4, 2 or 1
    assert args.per_device_train_batch_size is None and args.gradient_checkpointing is None
    plain, recomputed = (row_bytes(text, PROMPT + CAP, CAP, c) for c in (False, True))
    assert recomputed < 0.6 * plain  # checkpointing keeps the layers' inputs and one layer's activations
    budget = 4.5 * plain
    chosen = micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args), budget_bytes=budget)
    # 4 rows of 64 tokens without checkpointing are far below SATURATING_TOKENS: recomputing buys more rows
    want = max(n for n in (32, 16, 8, 4, 2, 1) if n * recomputed <= budget)
    assert want > 4 and (chosen.rows, chosen.checkpointing) == (want, True)
    assert chosen.tokens_per_row == PROMPT + CAP
    args.gradient_checkpointing = False  # given: the micro-batch is sized under it
    assert micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args), budget_bytes=budget).rows == 4
    longer = config(tmp_path, gradient_checkpointing=False, max_completion_length=8 * CAP)
    assert (
        micro_batch.size_micro_batch(longer, model, PROMPT, on_cpu(longer), budget_bytes=budget).rows == 1
    )  # longer: fewer


def test_given_settings_win(tiny, tmp_path):
    _, model = tiny
    tight = 1.5 * row_bytes(model.config.get_text_config(), PROMPT + CAP, CAP, False)
    args = config(tmp_path, per_device_train_batch_size=16, gradient_checkpointing=False)
    chosen = micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args), budget_bytes=tight)
    assert (chosen.rows, chosen.checkpointing, chosen.basis) == (16, False, "explicit")
    rows_only = config(tmp_path, per_device_train_batch_size=16)
    chosen = micro_batch.size_micro_batch(rows_only, model, PROMPT, on_cpu(rows_only), budget_bytes=tight)
    assert (chosen.rows, chosen.checkpointing) == (16, True)  # 16 rows do not fit without checkpointing
    roomy = micro_batch.size_micro_batch(
        rows_only, model, PROMPT, on_cpu(rows_only), budget_bytes=100 * tight
    )
    assert (roomy.rows, roomy.checkpointing) == (16, False)


def test_saturating_micro_batch_skips_checkpointing():
    def per_token(checkpointing):
        return (1.0, 0.0) if checkpointing else (4.0, 0.0)

    # without checkpointing 2 rows of 8192 tokens fit: enough to keep a GPU busy, no recomputation
    assert micro_batch.choose(64, 8192, 100, per_token, 2.5 * 4 * 8192) == (2, False)
    # 2 rows of 100 tokens would leave it idle: checkpointing fits 8
    assert micro_batch.choose(64, 100, 100, per_token, 2.5 * 4 * 100) == (8, True)
    # not even one row fits: one row, checkpointed (the estimate is conservative)
    assert micro_batch.choose(64, 100, 100, per_token, 1.0) == (1, True)


def test_the_choice_sets_trls_batch_arithmetic(tmp_path):
    declared = config(tmp_path)
    args = setup.batch_arithmetic(declared, micro_batch.MicroBatch(8, False, 64, "test"), world=1)
    assert declared.per_device_train_batch_size is None  # the declaration is never written to
    assert declared.gradient_checkpointing is None
    rollouts = 8 * G
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps) == (8, rollouts // 8)
    assert args.steps_per_generation == rollouts // 8 and args.generation_batch_size == rollouts
    assert args.gradient_checkpointing is False  # and activation_checkpointing, where it exists (5.2x)
    assert getattr(args, "activation_checkpointing", False) is False
    with pytest.raises(ConfigError, match="per_device_train_batch_size=3"):
        setup.batch_arithmetic(declared, micro_batch.MicroBatch(3, False, 64, "test"), world=1)


def test_trainer_sizes_once_and_trains_one_step_in_those_micro_batches(tiny, tmp_path, monkeypatch):
    """On a CPU the token budget decides; one optimizer step then runs exactly its micro-batches."""
    tok, _ = tiny
    script = {"p1": "CWCW", "p2": "CWWC"}
    trainer = make_trainer(tiny, tmp_path, monkeypatch, "S2", script, per_device_train_batch_size=None)
    chosen = trainer.run_setup.micro_batch
    assert chosen.basis == f"cpu: {micro_batch.CPU_TOKEN_BUDGET} tokens" and chosen.rows == 2 * G  # all fit
    longest = micro_batch.longest_prompt(tok, ["problem p1"], SYSTEM_PROMPT)
    assert chosen.tokens_per_row == longest + trainer.args.max_completion_length

    monkeypatch.setattr(micro_batch, "CPU_TOKEN_BUDGET", 2 * chosen.tokens_per_row)  # 2 rows a micro-batch
    trainer = make_trainer(
        tiny, tmp_path / "small", monkeypatch, "S2", script, per_device_train_batch_size=None
    )
    assert trainer.args.per_device_train_batch_size == 2 and trainer.args.gradient_accumulation_steps == G
    passes = []
    loss = CapGRPOTrainer._compute_loss
    monkeypatch.setattr(
        CapGRPOTrainer,
        "_compute_loss",
        lambda self, m, inputs: passes.append(len(inputs["prompt_ids"])) or loss(self, m, inputs),
    )
    trainer.train()
    assert trainer.state.global_step == 1 and passes == [2] * G  # one generation, G micro-batches of 2


def test_cuda_budget_is_free_memory_less_what_stays_on_the_device(tiny, tmp_path, monkeypatch):
    """The CUDA path with a fake device: 90 % of its memory, less weights, grads and optimizer state (AdamW's
    two moments on the GPU, none with CPUAdamW), TRL's fused-head workspace, the kept generation cache and
    vLLM's share."""
    _, model = tiny
    text = model.config.get_text_config()
    args = config(tmp_path, gradient_checkpointing=False)
    args.use_cpu = False  # a GPU run, decided on a machine without one
    weights = sum(p.numel() * 4 for p in model.parameters())
    trainable = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    row = row_bytes(text, PROMPT + CAP, CAP, False)
    head = micro_batch.head_workspace_bytes(text, 4)  # TRL's fused head, once per micro-batch
    total = (4.5 * row + weights + 3 * trainable + head) / (1 - micro_batch.RESERVE)  # 4.5 rows with AdamW
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (total, total))
    assert micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args)).rows == 4
    used = (
        total * micro_batch.RESERVE + 2.4 * row
    )  # another process holds 2.4 rows beyond the reserve: 2.1 left
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (total - used, total))
    assert micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args)).rows == 2
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (total, total))
    args.use_vllm, args.vllm_mode, args.vllm_gpu_memory_utilization = True, "colocate", 2.4 * row / total
    assert (
        micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args)).rows == 2
    )  # the engine's share is not ours
    args.use_vllm = False
    args.gpu_memory_share = (weights + 3 * trainable + head + 2.2 * row) / (total * (1 - micro_batch.RESERVE))
    assert (
        micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args)).rows == 2
    )  # one of several runs on this GPU
    args.gpu_memory_share = 1.0
    gpu = decide_backends(args, world=1, cuda=True)  # CPUAdamW (no moments on the GPU) and compiled rollouts
    # kept caches: the rollouts' (32 rows, prompt width 64 + cap, the model's float32) and the evaluation's (64
    # rows, 64 + cap, its bf16 copy's: on a GPU evaluation decodes a bf16 copy of the model)
    cache = micro_batch.kept_caches_bytes(args, gpu, text, PROMPT, 4, eval_bytes=2)
    per_row, bf16_row = (micro_batch.kept_cache_bytes(text, 1, 64 + CAP, b) for b in (4, 2))
    assert cache == args.problems_per_round * G * per_row + args.eval_batch_size * bf16_row
    assert per_row > bf16_row > 0  # the K/V halve, the linear layers' float32 state does not
    assert (
        micro_batch.kept_caches_bytes(args, gpu, text, PROMPT, 4)
        == (args.problems_per_round * G + args.eval_batch_size) * per_row
    )
    freed = 2 * trainable - cache  # moments moved to the host, the kept cache added
    want = next((n for n in (32, 16, 8, 4, 2, 1) if n * row <= 4.5 * row + freed), 1)
    assert micro_batch.size_micro_batch(args, model, PROMPT, gpu).rows == want != 4


@pytest.mark.parametrize("family", ["qwen35", "llama"])
def test_the_estimate_covers_what_autograd_saves(family, monkeypatch):
    """Per layer type and in TRL's fused head, the bytes a forward saves for its backward (counted by
    bench/activation_memory.py) stay within the estimate, on small models of the real proportions (attention
    widths of about the hidden size, head dim 128 in the linear attention). Before the gated delta rule's
    float32 term the estimate counted a third of a linear-attention layer (on the 1.82B benchmark 102 of 452
    KB per token); the vocabulary term it had counted logits TRL's fused head never holds."""
    from types import SimpleNamespace

    from transformers import LlamaConfig, LlamaForCausalLM

    from bench import activation_memory as memory

    torch.manual_seed(0)
    if family == "qwen35":
        shape = SimpleNamespace(
            hidden=512, layers=4, intermediate=1536, vocab=2048, p_ended=0, cap=64, seed=0
        )
        model = memory.random_qwen35(shape, memory.padded_tokenizer(shape.vocab), torch.device("cpu"))
    else:
        config = LlamaConfig(
            hidden_size=256, intermediate_size=768, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=64, vocab_size=1024,
        )  # fmt: skip
        model = LlamaForCausalLM(config)
    text = model.config.get_text_config()
    # a CPU pass runs transformers' torch rule even where fla is installed (fla's is Triton's): its estimate
    monkeypatch.setattr(micro_batch, "FLA", False)
    found = memory.measure(model, rows=2, prompt=64, completion=64)
    for kind, saved in found["saved_bytes_per_token_per_layer"].items():
        assert saved <= micro_batch.layer_bytes(text, kind, 4) * micro_batch.SAFETY, kind
    assert found["saved_bytes_per_token_head"] <= micro_batch.bytes_per_token(text, 4, False)[1]


def test_adamw_state_goes_to_the_gpu_only_when_the_same_micro_batch_fits_beside_it(
    tiny, tmp_path, monkeypatch
):
    monkeypatch.setattr(micro_batch, "FLA", False)  # the budgets below are in the estimate without fla's rule
    _, model = tiny
    text = model.config.get_text_config()
    state = 12 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    row = row_bytes(text, PROMPT + CAP, CAP, False)
    args = config(tmp_path, cpu_adamw=True, gradient_checkpointing=False)  # 32 rollouts
    roomy = micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args), budget_bytes=32 * row + state)
    assert (roomy.rows, roomy.adamw_state_on_gpu) == (32, True)
    # a budget the state would take a row from: the state stays on the host and the micro-batch keeps 32 rows
    tight = micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args), budget_bytes=32 * row + state / 2)
    assert (tight.rows, tight.adamw_state_on_gpu) == (32, False)
    # asked for: the micro-batch is sized in what the state leaves
    forced = config(tmp_path, cpu_adamw=True, gradient_checkpointing=False, adamw_state_on_gpu=True)
    chosen = micro_batch.size_micro_batch(
        forced, model, PROMPT, on_cpu(forced), budget_bytes=32 * row + state / 2
    )
    assert (chosen.rows, chosen.adamw_state_on_gpu) == (16, True)
    off = config(tmp_path, cpu_adamw=True, gradient_checkpointing=False, adamw_state_on_gpu=False)
    assert not micro_batch.size_micro_batch(
        off, model, PROMPT, on_cpu(off), budget_bytes=1e15
    ).adamw_state_on_gpu
    # torch's AdamW keeps its own state on the device: nothing to decide, and asking for it is refused
    assert not micro_batch.size_micro_batch(
        config(tmp_path), model, PROMPT, on_cpu(config(tmp_path)), budget_bytes=1e15
    ).adamw_state_on_gpu
    with pytest.raises(ConfigError, match="adamw_state_on_gpu: true needs CPUAdamW"):
        on_cpu(config(tmp_path, cpu_adamw=False, adamw_state_on_gpu=True))


def test_adamw_state_takes_rows_from_a_micro_batch_that_still_saturates(tiny, tmp_path):
    # rows of 8232 tokens: one row alone keeps the matmuls busy (SATURATING_TOKENS), so the state goes to the
    # GPU at the price of a row, which the host's update would cost more than (docs/PERFORMANCE.md, 1.82B)
    _, model = tiny
    text, cap = model.config.get_text_config(), micro_batch.SATURATING_TOKENS
    state = 12 * sum(p.numel() for p in model.parameters() if p.requires_grad)
    row = row_bytes(text, PROMPT + cap, cap, False)
    args = config(tmp_path, cpu_adamw=True, gradient_checkpointing=False, max_completion_length=cap)
    long = micro_batch.size_micro_batch(args, model, PROMPT, on_cpu(args), budget_bytes=2 * row + state / 2)
    assert (long.rows, long.checkpointing, long.adamw_state_on_gpu) == (1, False, True)
    # the same budget at rows of 64 tokens: half the rows would no longer saturate, so the state stays home
    short = config(tmp_path, cpu_adamw=True, gradient_checkpointing=False)
    budget = 32 * row_bytes(text, PROMPT + CAP, CAP, False) + state / 2
    assert (
        micro_batch.size_micro_batch(
            short, model, PROMPT, on_cpu(short), budget_bytes=budget
        ).adamw_state_on_gpu
        is False
    )


@pytest.mark.parametrize("measured", ["act.json", "act_conv.json"])
def test_with_fla_the_linear_attention_term_covers_what_the_h200_measured(monkeypatch, measured):
    """fla's rule (and its conv) keep far less than ours' float32 intermediates: the estimate with fla installed
    must still cover the bytes per token a 1.82B-shaped linear-attention layer saved on the H200
    (bench/activation_memory.py --device cuda [--fla-conv], committed beside the lease that ran it), without
    falling back to ours' count."""
    from pathlib import Path
    from types import SimpleNamespace

    path = Path(__file__).resolve().parent.parent / "docs" / "performance" / "h200-2026-12-04e" / measured
    found = json.loads(path.read_text())
    assert found["rule"] == "fla"
    text = SimpleNamespace(  # bench/models.py random_qwen35's text config at --hidden 2048 --intermediate 6144
        hidden_size=2048, intermediate_size=6144, linear_num_value_heads=32, linear_key_head_dim=128,
        linear_value_head_dim=128,
    )  # fmt: skip
    saved = found["saved_bytes_per_token_per_layer"]["linear_attention"]
    monkeypatch.setattr(micro_batch, "FLA", True)
    with_fla = micro_batch.layer_bytes(text, "linear_attention", 2)
    monkeypatch.setattr(micro_batch, "FLA", False)
    ours = micro_batch.layer_bytes(text, "linear_attention", 2)
    assert saved <= with_fla < ours / 1.5
