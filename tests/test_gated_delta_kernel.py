"""The Triton decode kernel (engine/gated_delta_kernel.py) against the gated-delta-rule formula and
transformers' `torch_recurrent_gated_delta_rule`: on the CPU through Triton's interpreter, on CUDA compiled."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

pytest.importorskip("triton", reason="triton is not installed (the dev extra installs it)")

REPO = Path(__file__).resolve().parent.parent
SHAPES = [(3, 4, 16, 16), (3, 4, 32, 64), (3, 4, 24, 40)]  # B, H, dk, dv: 24 and 40 need masks

# TRITON_INTERPRET must be set before the kernel is decorated, so the interpreted run gets its own process.
INTERPRETED = """
import sys
import torch
from safetensors.torch import load_file, save_file
from engine.gated_delta_kernel import decode_update

x, result = load_file(sys.argv[1]), {}
for name in sorted({key.split(".")[0] for key in x}):
    state = x[f"{name}.state"].clone()
    address = state.untyped_storage().data_ptr()
    args = [x[f"{name}.{arg}"] for arg in ("q", "k", "v", "decay", "beta")]
    result[f"{name}.out"] = decode_update(*args, state)
    result[f"{name}.state"] = state
    result[f"{name}.same_storage"] = torch.tensor(state.untyped_storage().data_ptr() == address)
    # the same token through generation's decode step with the kernel wired in (bf16 in and out, as in a model)
    from engine import generation

    generation._kernel = decode_update
    q, k, v, g, beta = (x[f"{name}.raw_{a}"] for a in ("q", "k", "v", "g", "beta"))
    step_state = x[f"{name}.state"].clone()
    out, same = generation.gated_delta_decode_step(
        q, k, v, g=g, beta=beta, initial_state=step_state, output_final_state=True, use_qk_l2norm_in_kernel=True
    )
    result[f"{name}.step_out"], result[f"{name}.step_state"] = out, step_state
    result[f"{name}.step_same"] = torch.tensor(same is step_state)
save_file(result, sys.argv[2])
"""


def raw_inputs(B, H, dk, dv, seed=0, device="cpu"):
    """One token as Qwen3.5's layer hands it to the recurrent function: q, k [B, 1, H, dk], v [B, 1, H, dv],
    g (log decay, < 0) and beta [B, 1, H], and a state [B, H, dk, dv]."""
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, 1, H, dk, generator=gen) for _ in range(2))
    v = torch.randn(B, 1, H, dv, generator=gen)
    g, beta = -torch.rand(B, 1, H, generator=gen), torch.rand(B, 1, H, generator=gen)
    state = torch.randn(B, H, dk, dv, generator=gen)
    return [t.to(device) for t in (q, k, v, g, beta, state)]


def kernel_inputs(q, k, v, g, beta):
    """What decode_update takes: q, k l2-normed (q also scaled by dk**-0.5), decay = exp(g), head-major."""
    q, k = (x[:, 0] * torch.rsqrt((x[:, 0] * x[:, 0]).sum(-1, keepdim=True) + 1e-6) for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    return [x.contiguous() for x in (q, k, v[:, 0], g[:, 0].exp(), beta[:, 0])]


def formula(q, k, v, decay, beta, state):
    """delta = beta (v - d S^T k), S' = d S + k (x) delta, out = S'^T q; sums written out (no TF32 matmul)."""
    d = decay[..., None]
    delta = beta[..., None] * (v - d * (state * k[..., None]).sum(-2))
    new = d[..., None] * state + k[..., :, None] * delta[..., None, :]
    return (new * q[..., None]).sum(-2), new


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    """Raw inputs per shape, and the kernel's out and state from one interpreted run over all shapes."""
    tmp = tmp_path_factory.mktemp("kernel")
    raw, flat = {}, {}
    for B, H, dk, dv in SHAPES:
        name = f"s{B}x{H}x{dk}x{dv}"
        raw[name] = raw_inputs(B, H, dk, dv)
        prepared = kernel_inputs(*raw[name][:5])
        for arg, t in zip(("q", "k", "v", "decay", "beta", "state"), [*prepared, raw[name][5]]):
            flat[f"{name}.{arg}"] = t
        for arg, t in zip(("q", "k", "v", "g", "beta"), raw[name][:5]):
            flat[f"{name}.raw_{arg}"] = t.to(torch.bfloat16) if arg in ("q", "k", "v") else t.clone()
    save_file(flat, tmp / "in.safetensors")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", INTERPRETED, str(tmp / "in.safetensors"), str(tmp / "out.safetensors")],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    return raw, load_file(tmp / "out.safetensors")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_interpreted_kernel_is_the_formula(interpreted, shape):
    raw, got = interpreted
    name = "s" + "x".join(map(str, shape))
    want_out, want_state = formula(*kernel_inputs(*raw[name][:5]), raw[name][5])
    torch.testing.assert_close(got[f"{name}.out"], want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[f"{name}.state"], want_state, atol=1e-5, rtol=1e-5)
    assert got[f"{name}.same_storage"].item(), "the state must be updated in its own storage"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_interpreted_kernel_is_transformers_recurrent_function(interpreted, shape):
    from transformers.models.qwen3_5 import modeling_qwen3_5

    raw, got = interpreted
    name = "s" + "x".join(map(str, shape))
    q, k, v, g, beta, state = raw[name]
    want_out, want_state = modeling_qwen3_5.torch_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=state.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    torch.testing.assert_close(got[f"{name}.out"], want_out[:, 0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[f"{name}.state"], want_state, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_decode_step_with_the_kernel_is_transformers_recurrent_function(interpreted, shape):
    """The wiring: generation.gated_delta_decode_step hands the kernel its inputs in the kernel's layout."""
    from transformers.models.qwen3_5 import modeling_qwen3_5

    raw, got = interpreted
    name = "s" + "x".join(map(str, shape))
    q, k, v, g, beta, state = raw[name]
    q, k, v = (x.to(torch.bfloat16) for x in (q, k, v))
    want_out, want_state = modeling_qwen3_5.torch_recurrent_gated_delta_rule(
        q, k, v, g=g, beta=beta, initial_state=state.clone(), output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    assert got[f"{name}.step_same"].item(), "the step must return the cache's own state tensor"
    torch.testing.assert_close(got[f"{name}.step_state"], want_state, atol=1e-5, rtol=1e-5)
    assert got[f"{name}.step_out"].dtype == want_out.dtype == torch.bfloat16
    torch.testing.assert_close(got[f"{name}.step_out"].float(), want_out.float(), atol=1e-2, rtol=1e-2)


def test_refusals_name_the_argument():
    from engine.gated_delta_kernel import decode_update

    q, k, v, decay, beta = kernel_inputs(*raw_inputs(2, 2, 8, 8)[:5])
    state = torch.zeros(2, 2, 8, 8)
    with pytest.raises(ValueError, match="state must be a contiguous float32"):
        decode_update(q, k, v, decay, beta, state.transpose(-1, -2))
    with pytest.raises(ValueError, match="v must be a contiguous float32"):
        decode_update(q, k, v.double(), decay, beta, state)
    with pytest.raises(ValueError, match="block_v must be a power of two"):
        decode_update(q, k, v, decay, beta, state, block_v=24)
    assert not state.any()


def test_compiled_call_keeps_the_kernel_in_the_graph():
    """Traced only (no CUDA here): dynamo and AOT autograd keep the kernel as one node of a single graph,
    with the state among what it writes (AOT copies it back into the input)."""
    import triton
    from torch._dynamo.backends.common import aot_autograd

    if triton.knobs.runtime.interpret:
        pytest.skip(
            "TRITON_INTERPRET is set: the kernel is an interpreted function, which dynamo cannot trace"
        )
    from engine.gated_delta_kernel import decode_update

    graphs = []

    class Traced(Exception):
        pass

    def capture(gm, example_inputs):
        graphs.append(gm.code)

        def run(*args):
            raise Traced  # launching needs a GPU

        return run

    def step(q, k, v, decay, beta, state):
        return decode_update(q, k, v, decay, beta, state) * 2

    args = [*kernel_inputs(*raw_inputs(3, 4, 24, 40)[:5]), torch.zeros(3, 4, 24, 40)]
    torch._dynamo.reset()
    with pytest.raises(Traced):
        torch.compile(step, backend=aot_autograd(fw_compiler=capture), fullgraph=True)(*args)
    torch._dynamo.reset()
    assert len(graphs) == 1
    assert "triton_kernel_wrapper_functional" in graphs[0] and "'state_ptr': arg5_1" in graphs[0], graphs[0]


def cached_step(q, k, v, g, beta, state):
    """What the model's decode step does around the kernel; the cache then copies the returned state into
    its own tensor (transformers' `update_recurrent_state`), here the same tensor."""
    from engine.gated_delta_kernel import decode_update

    out = decode_update(*kernel_inputs(q, k, v, g, beta), state)
    state.copy_(state)
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shape", [(4, 8, 128, 128), (3, 4, 24, 40)], ids=lambda s: "x".join(map(str, s)))
def test_cuda_kernel_eager_and_compiled_with_cuda_graphs(shape):
    from torch._dynamo.utils import counters

    from engine.gated_delta_kernel import decode_update

    state = raw_inputs(*shape, device="cuda")[5]
    want_state = state.clone()
    eager_out = decode_update(*kernel_inputs(*raw_inputs(*shape, seed=1, device="cuda")[:5]), state)
    want_out, want_state = formula(*kernel_inputs(*raw_inputs(*shape, seed=1, device="cuda")[:5]), want_state)
    torch.testing.assert_close(eager_out, want_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)

    torch._dynamo.reset()
    counters.clear()
    torch._dynamo.mark_static_address(state)  # as transformers' static cache marks its tensors
    compiled = torch.compile(cached_step, mode="reduce-overhead", dynamic=False, fullgraph=True)
    address = state.data_ptr()
    for seed in (2, 3, 4, 5):  # warm-up, recording, then replays of the CUDA graph
        token = raw_inputs(*shape, seed=seed, device="cuda")[:5]
        want_out, want_state = formula(*kernel_inputs(*token), want_state)
        out = compiled(*token, state).clone()  # CUDA-graph outputs are overwritten by the next replay
        torch.testing.assert_close(out, want_out, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)
        assert state.data_ptr() == address
    assert not counters["inductor"]["cudagraph_skips"], dict(counters["inductor"])
    torch._dynamo.reset()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_compiled_update_writes_the_state_without_a_copy():
    """Inductor must run the kernel on the cache's tensor itself: a clone of the state (537 MB per layer at
    batch 256) would double the bytes moved. A copy shows in the call's peak memory."""
    shape = (64, 8, 128, 128)  # 33.5 MB of state
    state = raw_inputs(*shape, device="cuda")[5]
    torch._dynamo.reset()
    torch._dynamo.mark_static_address(state)
    compiled = torch.compile(cached_step, dynamic=False, fullgraph=True)
    compiled(*raw_inputs(*shape, seed=1, device="cuda")[:5], state)  # compiles
    token, want_state = raw_inputs(*shape, seed=2, device="cuda")[:5], state.clone()
    want_out, want_state = formula(*kernel_inputs(*token), want_state)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = compiled(*token, state)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before
    torch._dynamo.reset()
    torch.testing.assert_close(out, want_out, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(state, want_state, atol=1e-4, rtol=1e-4)
    assert extra < state.nbytes // 2, (
        f"the call allocated {extra} bytes at its peak; the state is {state.nbytes}"
    )
