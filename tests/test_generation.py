"""The fixed-shape generation path (engine/generation.py) samples what eager generation samples.

On a CPU transformers does not compile generation, so these tests run the fixed shapes (filled rows,
bucketed widths) and the static cache eagerly; the compiled decode step is checked on a GPU by
`test_compiled_greedy_equals_eager_on_cuda` (bench/generation.py measures its speed).
"""

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, GenerationConfig, Qwen3_5ForConditionalGeneration
from trl import GRPOTrainer

from data.prompt import render_prompt
from data.snapshot import load_snapshot
from engine import generation
from tests.scripted import STEP_ARGS, TextGrader, tiny_random_model
from trainer.backends import decide_backends
from trainer.config import CapGRPOConfig, ConfigError
from trainer.evaluation import EvalSpec, generate_eval
from trainer.grpo import CapGRPOTrainer
from trainer.setup import decide

ROOT = Path(__file__).resolve().parent.parent
BASE = ROOT / "embedded" / "base"
NEW = 24


def greedy(**kw) -> GenerationConfig:
    return GenerationConfig(do_sample=False, max_new_tokens=NEW, use_cache=True, disable_compile=True, **kw)


@pytest.fixture(scope="module")
def embedded():
    model = Qwen3_5ForConditionalGeneration.from_pretrained(BASE, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(BASE)
    tasks = load_snapshot(ROOT / "embedded" / "synthetic.tasks.json")
    prompts = [
        tok(render_prompt(tok, t["problem"]), add_special_tokens=False)["input_ids"]
        for t in (tasks[i] for i in range(0, 700, 100))
    ]
    return model, tok, prompts


def eager_one_by_one(model, prompts, config) -> list[list[int]]:
    out = []
    for p in prompts:
        ids = torch.tensor([p])
        out.append(
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)[
                0, len(p) :
            ].tolist()
        )
    return out


def test_shapes_round_widths_and_refuse_nonsense():
    shapes = generation.FixedShapes(rows=8, prompt_multiple=64, max_new_tokens=10)
    assert [shapes.width(n) for n in (1, 64, 65, 130)] == [64, 64, 128, 192]
    with pytest.raises(ValueError, match="must be >= 1"):
        generation.FixedShapes(rows=0, prompt_multiple=64, max_new_tokens=10)
    config = generation.compiled_config(greedy(), shapes, longest_prompt=70)
    assert (config.cache_implementation, config.max_cache_len, config.disable_compile) == (
        "static",
        138,
        False,
    )
    assert config.compile_config.dynamic is False and greedy().disable_compile  # the input is left as it was


def test_cut_after_eos_keeps_the_eos_like_trl():
    assert generation.cut_after_eos([5, 6, 2, 7, 2], {2}) == [5, 6, 2]
    assert generation.cut_after_eos([5, 6], {2}) == [5, 6]


@pytest.mark.parametrize("which", ["embedded", "random"])
def test_fixed_shapes_and_static_cache_give_the_eager_greedy_tokens(which, embedded):
    if which == "embedded":
        model, tok, prompts = embedded
    else:
        tok, model = tiny_random_model()
        model = model.float().eval()
        prompts = [tok(f"problem {i} " * (1 + i), add_special_tokens=False)["input_ids"] for i in range(5)]
    pad = tok.pad_token_id
    want = eager_one_by_one(model, prompts, greedy(pad_token_id=pad))
    shapes = generation.FixedShapes(rows=4, prompt_multiple=16, max_new_tokens=NEW)
    config = generation.compiled_config(greedy(pad_token_id=pad), shapes, max(map(len, prompts)))
    got = []
    for start in range(0, len(prompts), shapes.rows):  # the last call is filled with copies
        got += generation.generate_call(model, prompts[start : start + shapes.rows], config, shapes, pad)
    assert len(got) == len(prompts)
    eos = {tok.eos_token_id}
    assert [generation.cut_after_eos(g, eos) for g in got] == [generation.cut_after_eos(w, eos) for w in want]


def test_eval_mode_restores_modes_and_accelerates_forward(embedded):
    model = embedded[0]
    model.train()
    model.forward = lambda *a, **k: None  # what accelerate's prepare() leaves on the instance
    with generation.eval_mode(model):
        assert not any(m.training for m in model.modules()) and "forward" not in model.__dict__
    assert all(m.training for m in model.modules()) and "forward" in model.__dict__
    del model.forward
    model.eval()


def trainer_on(tmp_path, compiled: bool, **kw):
    tok, model = tiny_random_model()
    tasks = {f"p{i}": {"id": f"p{i}", "problem": f"problem {i} " * (1 + i), "answer": "1"} for i in range(3)}
    from data.sampler import TaskSampler

    args = CapGRPOConfig(
        **dict(
            STEP_ARGS, output_dir=str(tmp_path / "run"), groups_per_step=2, compiled_generation=compiled, **kw
        )
    )
    args, run = decide(args, model.float(), tok, tasks)
    return CapGRPOTrainer(
        model,
        args,
        run=run,
        tasks=tasks,
        sampler=TaskSampler(sorted(tasks), seed=0),
        grader=TextGrader(),
        processing_class=tok,
    )


def test_trainer_rollouts_through_fixed_shapes_equal_trls_path(tmp_path):
    trainer = trainer_on(tmp_path, True, generation_kwargs={"do_sample": False}, prompt_multiple=16)
    assert trainer.generation_shapes.rows == 2 * STEP_ARGS["num_generations"]  # one round's rollouts
    prompts = [[{"role": "user", "content": f"problem {i} " * (1 + i)}] for i in range(3) for _ in range(2)]
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    ours, logprobs = trainer._generate_rollouts(prompt_ids, 2)
    trls, _ = GRPOTrainer._generate_single_turn(trainer, prompt_ids, None, {}, 2)
    assert logprobs is None and ours == trls
    assert trainer.model.training  # the training mode is back after generation


def test_trainer_default_on_cpu_is_trls_path(tmp_path):
    assert trainer_on(tmp_path, None).generation_shapes is None


def test_setup_refuses_compiled_generation_with_vllm_or_processes(tmp_path):
    args = CapGRPOConfig(
        **STEP_ARGS | dict(output_dir=str(tmp_path), groups_per_step=2, compiled_generation=True)
    )
    for world, use_vllm in ((2, False), (1, True)):
        args.use_vllm = use_vllm
        with pytest.raises(ConfigError, match="compiled_generation: one process"):
            decide_backends(args, world=world, cuda=True)


def test_eval_spec_records_its_backend(embedded):
    spec = EvalSpec(cap=8, samples={"s": 1}, generation="compiled")
    assert EvalSpec.from_run({"eval": spec.to_json()}) == spec
    old = {k: v for k, v in spec.to_json().items() if k != "generation"}
    assert EvalSpec.from_run({"eval": old}).generation == "eager"  # run.json from before the field
    with pytest.raises(ValueError, match="generation must be one of"):
        EvalSpec(generation="fast")
    model, tok, _ = embedded
    task = [{"id": "t", "problem": "1+1", "answer": "2"}]
    with pytest.raises(ValueError, match="'compiled' runs on a CUDA device"):
        generate_eval(model, tok, task, spec, "s", grade_fn=TextGrader().grade_batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled decode step runs on CUDA only")
def test_compiled_greedy_equals_eager_on_cuda(embedded):
    model, tok, prompts = embedded
    model = model.cuda()
    pad = tok.pad_token_id
    want = eager_one_by_one(model, prompts, greedy(pad_token_id=pad))
    shapes = generation.FixedShapes(rows=4, prompt_multiple=64, max_new_tokens=NEW)
    config = generation.compiled_config(greedy(pad_token_id=pad), shapes, max(map(len, prompts)))
    for _ in range(2):  # the second pass replays the captured graphs
        got = []
        for start in range(0, len(prompts), shapes.rows):
            got += generation.generate_call(model, prompts[start : start + shapes.rows], config, shapes, pad)
        eos = {tok.eos_token_id}
        assert [generation.cut_after_eos(g, eos) for g in got] == [
            generation.cut_after_eos(w, eos) for w in want
        ]
    model.cpu()


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_training_forward_logprobs_of_sampled_tokens_match_the_generators(device, embedded):
    """The fixed-shape generator samples from the policy the loss scores: the full-sequence forward (what the
    training pass computes) gives the sampled tokens the log-probs the generator's own logits gave them."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the compiled decode step runs on CUDA only")
    model, tok, prompts = embedded
    model = model.to(device, torch.bfloat16 if device == "cuda" else torch.float32)
    pad, eos = tok.pad_token_id, tok.eos_token_id
    shapes = generation.FixedShapes(rows=len(prompts), prompt_multiple=64, max_new_tokens=NEW)
    sampling = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW, pad_token_id=pad,
        eos_token_id=eos, output_logits=True, return_dict_in_generate=True, disable_compile=True,
    )  # fmt: skip
    config = generation.compiled_config(sampling, shapes, max(map(len, prompts)))
    width = shapes.width(max(map(len, prompts)))
    ids, mask = generation.pad_left(prompts, width, pad, model.device)
    torch.manual_seed(0)
    with torch.no_grad(), generation.eval_mode(model):
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        sampled = out.sequences[:, width:]
        generator = torch.stack(out.logits, 1).float().log_softmax(-1).gather(-1, sampled[..., None])[..., 0]
        # after a row's EOS generate pads; those positions carry no loss
        alive = (sampled == eos).int().cumsum(1) - (sampled == eos).int() == 0
        full = torch.cat([mask, alive.long()], 1)
        logits = model(input_ids=out.sequences, attention_mask=full).logits[:, width - 1 : -1].float()
        trained = logits.log_softmax(-1).gather(-1, sampled[..., None])[..., 0]
    gap = (generator - trained)[alive].abs()
    assert alive.sum() > len(prompts) * 4 and (sampled != eos).any()
    if device == "cpu":  # float32: the same function up to summation order
        assert gap.max() < 1e-3, gap.max()
    else:  # bf16 activations, compiled kernels: rounding only
        assert gap.mean() < 0.05 and gap.max() < 1.0, (gap.mean(), gap.max())
    model.to("cpu", torch.float32)


class _Qwen35:  # a stand-in model whose class lives in transformers' Qwen3.5 module (what fused_decode keys on)
    pass


_Qwen35.__module__ = "transformers.models.qwen3_5.modeling_qwen3_5"


def _reference_repeats_key_heads(modeling_qwen3_5) -> bool:
    """Whether transformers' recurrent function takes fewer key than value heads (>= 5.2x repeats them inside;
    5.17 needs them repeated). Asked by calling it: in 5.25 the function is a kernelized `Func` module whose
    source `inspect` cannot read. Two key heads for four value heads: one key head would broadcast in 5.17."""
    q = k = torch.zeros(1, 1, 2, 2)
    try:
        modeling_qwen3_5.torch_recurrent_gated_delta_rule(
            q, k, torch.zeros(1, 1, 4, 2), g=torch.zeros(1, 1, 4), beta=torch.zeros(1, 1, 4)
        )
    except RuntimeError:
        return False
    return True


def test_our_decode_functions_run_inside_a_qwen35_decode_step(embedded, monkeypatch):
    """The model's own forward calls ours, not a kernelized wrapper that bypasses the module-level names
    (transformers 5.25 wraps both in `use_kernelized_func`): one call a linear-attention layer and token."""
    model, tok, prompts = embedded
    calls = {"delta": 0, "conv": 0}
    delta, conv = generation.gated_delta_decode_step, generation.conv_decode_step

    def counted_delta(*a, **k):
        calls["delta"] += a[0].shape[1] == 1
        return delta(*a, **k)

    def counted_conv(*a, **k):
        calls["conv"] += 1
        return conv(*a, **k)

    monkeypatch.setattr(generation, "gated_delta_decode_step", counted_delta)
    monkeypatch.setattr(generation, "conv_decode_step", counted_conv)
    shapes = generation.FixedShapes(rows=2, prompt_multiple=16, max_new_tokens=NEW)
    config = generation.compiled_config(greedy(pad_token_id=tok.pad_token_id), shapes, max(map(len, prompts)))
    generation.generate_call(model, prompts[:2], config, shapes, tok.pad_token_id)
    layers = model.config.get_text_config().layer_types.count("linear_attention")
    assert layers > 0
    steps = config.max_new_tokens - 1  # the first new token comes from the prefill
    assert calls == {"delta": steps * layers, "conv": steps * layers}


@pytest.mark.parametrize("l2norm,key_heads", [(True, 4), (False, 4), (True, 2)])  # 2: grouped value heads
def test_decode_step_is_transformers_recurrent_function(l2norm, key_heads):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    gen = torch.Generator().manual_seed(0)
    B, H, dk, dv = 3, 4, 8, 16
    q, k = (torch.randn(B, 1, key_heads, dk, generator=gen, dtype=torch.bfloat16) for _ in range(2))
    theirs_q, theirs_k = q, k
    if key_heads != H and not _reference_repeats_key_heads(modeling_qwen3_5):  # 5.17: repeated for it
        theirs_q, theirs_k = (x.repeat_interleave(H // key_heads, dim=2) for x in (q, k))
    v = torch.randn(B, 1, H, dv, generator=gen, dtype=torch.bfloat16)
    g, beta = -torch.rand(B, 1, H, generator=gen), torch.rand(B, 1, H, generator=gen)
    state = torch.randn(B, H, dk, dv, generator=gen)
    want_out, want_state = modeling_qwen3_5.torch_recurrent_gated_delta_rule(
        theirs_q,
        theirs_k,
        v,
        g=g,
        beta=beta,
        initial_state=state.clone(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=l2norm,
    )
    mine = state.clone()
    with generation.fused_decode(_Qwen35()):
        out, new_state = generation.gated_delta_decode_step(
            q,
            k,
            v,
            g=g,
            beta=beta,
            initial_state=mine,
            output_final_state=True,
            use_qk_l2norm_in_kernel=l2norm,
        )
    assert new_state is mine  # in place: the cache's own tensor, so its copy back is a no-op
    torch.testing.assert_close(new_state, want_state, atol=1e-5, rtol=1e-5)
    assert out.dtype == want_out.dtype and out.shape == want_out.shape
    torch.testing.assert_close(out.float(), want_out.float(), atol=1e-2, rtol=1e-2)  # bf16 output rounding


@pytest.mark.parametrize("bias,activation", [(True, "silu"), (False, None)])
def test_conv_decode_step_is_transformers_conv_update(bias, activation):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    gen = torch.Generator().manual_seed(0)
    B, C, K = 3, 10, 4
    weight = torch.randn(C, K, generator=gen)
    b = torch.randn(C, generator=gen) if bias else None
    state = torch.randn(B, C, K, generator=gen)
    mine = state.clone()
    for _ in range(3):  # three tokens: the state shifts each time
        x = torch.randn(B, C, 1, generator=gen)
        want = modeling_qwen3_5.causal_conv1d_update(x, state, weight, b, activation)
        with generation.fused_decode(_Qwen35()):
            got = generation.conv_decode_step(x, mine, weight, b, activation)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(mine, state, atol=0, rtol=0)


@pytest.mark.parametrize(
    "mask_kind,dtype",  # float32: our two products and softmax; bfloat16: SDPA on the packed query
    [("bool", torch.float32), ("additive", torch.float32), (None, torch.float32), ("bool", torch.bfloat16)],
)
def test_grouped_decode_attention_is_transformers_sdpa(mask_kind, dtype):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    gen = torch.Generator().manual_seed(0)
    B, heads, kv_heads, L, D = 3, 8, 2, 11, 16
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = heads // kv_heads, True
    q = torch.randn(B, heads, 1, D, generator=gen).to(dtype)
    k, v = (torch.randn(B, kv_heads, L, D, generator=gen).to(dtype) for _ in range(2))
    mask = torch.rand(B, 1, 1, L, generator=gen) > 0.3 if mask_kind else None
    if mask_kind:
        mask[..., -1] = True  # the token itself is always visible
    if mask_kind == "additive":  # 0 where visible, the dtype's minimum elsewhere (transformers' float masks)
        mask = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(torch.float32).min)
    want, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=D**-0.5)
    with generation.fused_decode(_Qwen35()):
        got, _ = generation.grouped_decode_attention(module, q, k, v, mask, scaling=D**-0.5)
    assert got.shape == want.shape == (B, 1, heads, D) and got.dtype == dtype
    tol = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(got, want, **tol)
    # a wrong head order (query head h read from kv head h % kv_heads) would not pass
    wrong, _ = sdpa_attention_forward(module, q, k[:, [1, 0]], v[:, [1, 0]], mask, scaling=D**-0.5)
    assert not torch.allclose(got, wrong, atol=1e-3)


def test_fused_decode_is_scoped_to_the_call(embedded):
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    from transformers.models.qwen3_5 import modeling_qwen3_5

    model = embedded[0]
    names = ("torch_recurrent_gated_delta_rule", "causal_conv1d_update")
    reference = [getattr(modeling_qwen3_5, n) for n in names] + [ALL_ATTENTION_FUNCTIONS["sdpa"]]
    with pytest.raises(RuntimeError), generation.fused_decode(model):
        assert modeling_qwen3_5.torch_recurrent_gated_delta_rule is generation.gated_delta_decode_step
        assert modeling_qwen3_5.causal_conv1d_update is generation.conv_decode_step
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is generation.grouped_decode_attention
        raise RuntimeError
    assert [getattr(modeling_qwen3_5, n) for n in names] + [ALL_ATTENTION_FUNCTIONS["sdpa"]] == reference
    assert "sdpa" not in ALL_ATTENTION_FUNCTIONS._local_mapping
    state = torch.zeros(1, 2, 4, 4)  # prefill (several tokens) and state-less calls go to the reference
    with generation.fused_decode(model):
        out, _ = generation.gated_delta_decode_step(
            *(torch.randn(1, 3, 2, 4) for _ in range(3)), g=-torch.rand(1, 3, 2), beta=torch.rand(1, 3, 2),
            initial_state=state, output_final_state=True,
        )  # fmt: skip
    assert out.shape == (1, 3, 2, 4) and not state.any()


def test_fused_decode_gives_a_llama_the_grouped_attention_and_the_same_tokens():
    """SmolLM2 (Llama) has no gated-delta layers; its decode step still gets our grouped-query attention, and
    a greedy static-cache generate under it gives transformers' tokens and scores."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    ids, mask = generation.pad_left([[5, 6, 7, 8], [9, 10]], 4, 0, "cpu")
    gen = GenerationConfig(do_sample=False, max_new_tokens=6, cache_implementation="static", eos_token_id=None,
                           pad_token_id=0, output_scores=True, return_dict_in_generate=True)  # fmt: skip
    fallback = []  # query lengths that went to transformers' SDPA through ours
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]

    def counted(module, query, *args, **kwargs):
        fallback.append(query.shape[2])
        return sdpa(module, query, *args, **kwargs)

    with torch.no_grad():
        want = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        ALL_ATTENTION_FUNCTIONS["sdpa"] = counted  # what fused_decode keeps as the reference
        try:
            with generation.fused_decode(model):
                assert ALL_ATTENTION_FUNCTIONS["sdpa"] is generation.grouped_decode_attention
                got = model.generate(input_ids=ids, attention_mask=mask, generation_config=gen)
        finally:
            del ALL_ATTENTION_FUNCTIONS["sdpa"]
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is sdpa
    assert fallback == [4, 4]  # the prefill of each layer; all ten decode calls took our products
    assert torch.equal(got.sequences, want.sequences)
    torch.testing.assert_close(torch.stack(got.scores), torch.stack(want.scores), atol=1e-5, rtol=1e-5)


def test_use_cpu_keeps_trls_path_where_cuda_is_present(monkeypatch, tmp_path):
    """A CPU recipe (the embedded default: use_cpu) run on a GPU machine keeps its model on the CPU, so
    rollouts and evaluation must not take the CUDA-only compiled path."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    kw = {k: v for k, v in STEP_ARGS.items() if k != "use_cpu"}
    cpu = CapGRPOConfig(**kw, use_cpu=True, output_dir=str(tmp_path), groups_per_step=2)
    backends = decide_backends(cpu, world=1, cuda=True)
    assert not backends.compiled_rollouts and backends.eval_generation == "eager"
    cpu.use_cpu = False  # the same recipe on the GPU
    backends = decide_backends(cpu, world=1, cuda=True)
    assert (
        backends.compiled_rollouts
        and EvalSpec.from_config(cpu, backends.eval_generation).generation == "compiled"
    )


def test_deferred_stop_check_keeps_transformers_rule_and_is_scoped():
    from transformers.generation.utils import DeferredStopCheck

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert not DeferredStopCheck.is_supported(cuda, None, False, False)  # transformers: mps only
    with pytest.raises(RuntimeError), generation.deferred_stop_check():
        assert DeferredStopCheck.is_supported(cuda, None, False, False)
        assert not DeferredStopCheck.is_supported(cuda, None, False, True)  # assistant decoding: never
        assert not DeferredStopCheck.is_supported(cpu, None, False, False)
        raise RuntimeError
    assert not DeferredStopCheck.is_supported(cuda, None, False, False)


class _HostEvent:  # CPU kernels finish before the call returns: recording and waiting are no-ops
    def __init__(self, *args, **kwargs):
        pass

    def record(self, *args):
        pass

    def synchronize(self):
        pass


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("stop", ["some rows at the cap", "every row after one token"])
def test_deferred_stop_check_samples_the_same_tokens(stop, device, embedded, monkeypatch):
    """The step-late check (on for compiled calls on CUDA) returns what the per-step check returns, also
    when every row ends early and one extra step has to be undone. On a CPU events are no-ops."""
    from transformers.generation.utils import DeferredStopCheck

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("the compiled decode step runs on CUDA only")
    model, tok, prompts = embedded
    model = model.to(device)
    eos = tok.eos_token_id if stop == "some rows at the cap" else list(range(len(tok)))
    sampling = GenerationConfig(
        do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=NEW, pad_token_id=tok.pad_token_id,
        eos_token_id=eos, disable_compile=True,
    )  # fmt: skip
    shapes = generation.FixedShapes(rows=len(prompts), prompt_multiple=16, max_new_tokens=NEW)
    config = generation.compiled_config(sampling, shapes, max(map(len, prompts)))
    undone = []
    finish = DeferredStopCheck.finish
    monkeypatch.setattr(DeferredStopCheck, "finish", lambda self: undone.append(finish(self)) or undone[-1])
    if device == "cpu":
        monkeypatch.setattr(torch, "Event", _HostEvent)
    runs = {}
    for devices in ((), (device,), ()):  # the last call replays the graphs the first one captured
        monkeypatch.setattr(generation, "DEFERRED_STOP_DEVICES", devices)
        torch.manual_seed(0)
        runs.setdefault(devices, []).append(
            generation.generate_call(model, prompts, config, shapes, tok.pad_token_id)
        )
    model.cpu()
    assert runs[(device,)][0] == runs[()][0] == runs[()][1]
    if stop == "some rows at the cap":
        assert undone == [0] and all(len(t) == NEW for t in runs[()][0])  # ran to the cap: nothing to undo
    else:
        assert undone == [1] and all(len(t) == 1 for t in runs[()][0])


def test_kept_static_cache_is_built_once_and_reset_between_calls(embedded, monkeypatch):
    """Compiled calls of one shape share one static cache (CUDA graphs read it at fixed addresses), reset
    in place: a call after another gives the tokens a fresh cache gives."""
    model, tok, prompts = embedded
    pad = tok.pad_token_id
    shapes = generation.FixedShapes(rows=3, prompt_multiple=16, max_new_tokens=NEW)
    config = generation.compiled_config(greedy(pad_token_id=pad), shapes, max(map(len, prompts)))
    generation._kept_caches.pop(model, None)  # other tests' calls
    built = []
    build = type(model)._prepare_static_cache
    monkeypatch.setattr(
        type(model), "_prepare_static_cache", lambda *a, **k: built.append(build(*a, **k)) or built[-1]
    )
    monkeypatch.setattr(generation, "KEEP_STATIC_CACHE", False)
    fresh = [generation.generate_call(model, p, config, shapes, pad) for p in (prompts[:3], prompts[3:6])]
    assert len(built) == 2 and built[0] is not built[1]  # transformers: a new cache per call
    monkeypatch.setattr(generation, "KEEP_STATIC_CACHE", True)
    kept = [generation.generate_call(model, p, config, shapes, pad) for p in (prompts[:3], prompts[3:6])]
    assert len(built) == 3 and "_prepare_static_cache" not in model.__dict__
    assert kept == fresh
    wide = model._previous_max_cache_length + shapes.prompt_multiple  # longer than any cache so far
    longer = generation.compiled_config(greedy(pad_token_id=pad), shapes, wide)
    generation.generate_call(model, [prompts[0][:1] * wide], longer, shapes, pad)  # replaces the kept cache
    key = generation.cache_key(model, "static", shapes.rows)
    assert len(built) == 4 and generation._kept_caches[model][key][1] is built[-1]
    generation._kept_caches.pop(model)


def kept_then_fresh(model, prompts, pad, monkeypatch) -> tuple[list, list]:
    """One call through the kept caches, then the same call with transformers' new cache, same seed."""
    shapes = generation.FixedShapes(rows=3, prompt_multiple=16, max_new_tokens=NEW)
    config = generation.compiled_config(greedy(pad_token_id=pad), shapes, max(map(len, prompts)))
    out = []
    for keep in (True, False):
        monkeypatch.setattr(generation, "KEEP_STATIC_CACHE", keep)
        out.append(generation.generate_call(model, prompts[:3], config, shapes, pad))
    return out[0], out[1]


def test_kept_static_cache_is_kept_per_dtype(monkeypatch):
    """A cache kept from a float32 call is not handed to a bfloat16 one (its layers hold float32 tensors:
    the bfloat16 keys would not fit them), and each dtype's call gives a fresh cache's tokens."""
    tok, model = tiny_random_model()
    model = model.float().eval()
    prompts = [tok(f"problem {i} " * (1 + i), add_special_tokens=False)["input_ids"] for i in range(3)]
    for dtype in (torch.float32, torch.bfloat16, torch.float32):
        model.to(dtype)
        kept, fresh = kept_then_fresh(model, prompts, tok.pad_token_id, monkeypatch)
        assert kept == fresh
    assert {key[-1] for key in generation._kept_caches[model]} == {torch.float32, torch.bfloat16}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device beside the CPU")
def test_kept_static_cache_is_kept_per_device(embedded, monkeypatch):
    """One process generating on the CPU, then CUDA, then the CPU again gets each device's own kept cache."""
    model, tok, prompts = embedded
    generation._kept_caches.pop(model, None)
    try:
        for device in ("cpu", "cuda", "cpu"):
            model.to(device)
            kept, fresh = kept_then_fresh(model, prompts, tok.pad_token_id, monkeypatch)
            assert kept == fresh, device
        assert {key[2] for key in generation._kept_caches[model]} == {"cpu", "cuda:0"}
    finally:
        model.cpu()
        generation._kept_caches.pop(model, None)


@pytest.mark.parametrize("stops", [1, 3, 169])
def test_eos_test_without_sync_is_transformers_test(stops):
    from transformers.generation.stopping_criteria import EosTokenCriteria

    g = torch.Generator().manual_seed(stops)
    vocab = 4 * stops + 40  # some rows stop, not all
    ids = torch.randint(0, vocab, (256, 7), generator=g)
    criteria = EosTokenCriteria(list(range(vocab - stops, vocab)) if stops > 1 else vocab - 1)
    for n in (1, 3):
        want = EosTokenCriteria.__call__(criteria, ids, None, new_token_length=n)
        with generation.deferred_stop_check():
            assert EosTokenCriteria.__call__ is generation.eos_stopped
            got = criteria(ids, None, new_token_length=n)
        assert torch.equal(got, want) and got.dtype == torch.bool and want.any() and not want.all()
    assert EosTokenCriteria.__call__ is not generation.eos_stopped


@pytest.mark.parametrize("before", ["ieee", "tf32"])
def test_tf32_matmuls_works_beside_trainings_tf32_switch(before):
    # `tf32: true` (TrainingArguments) sets torch's per-backend precision; the legacy global getter then raises,
    # which stopped the H200's first rollout of a tf32 run (docs/performance/h200-2026-12-04c)
    matmul = torch.backends.cuda.matmul
    saved, matmul.fp32_precision = matmul.fp32_precision, before
    try:
        with generation.tf32_matmuls():
            assert matmul.fp32_precision == "tf32"
        assert matmul.fp32_precision == before
    finally:
        matmul.fp32_precision = saved
