"""One decode token of the gated delta rule (Qwen3.5's linear attention) in a single pass over the state.

Per batch row b and value head h, with the state S [dk, dv] (fp32), q already l2-normed and scaled by
dk**-0.5, k l2-normed, and the decay d = exp(g):

    delta = beta * (v - d * S^T k)
    S'    = d * S + k (x) delta
    out   = S'^T q

Each program owns one (b, h) and a block of BV value columns: it loads its [dk, BV] tile of S once, computes
S^T k, delta, S' and S'^T q in registers, and stores S' over S and its BV outputs. Bytes per call: the state
read once and written once, 2 * 4 * B * H * dk * dv (537 MB each way per layer at B=256, H=32, dk=dv=128:
~0.22 ms at 4.8 TB/s), plus q, k, v, out, decay, beta (<1% of that). That is the floor for this update.

The state is updated in place: it is the KV cache's own tensor, and CUDA graphs replay reads and writes at the
addresses captured, so its storage must never change.
"""

import torch
import triton
import triton.language as tl

# BV=32: a tile row is one 128-byte segment per load, B*H*dv/32 programs (32k at the benchmark's 256 x 32
# heads) fill every SM, and 32 state floats per thread at 4 warps leave registers for many resident programs.
BLOCK_V = 32
NUM_WARPS = 4


@triton.jit
def _decode_kernel(q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, state_ptr, out_ptr, DK: tl.constexpr,
                   DV: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    bh = tl.program_id(0).to(tl.int64)  # B*H*dk*dv passes 2**31 at batch ~4k
    rk = tl.arange(0, BK)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    mk, mv = rk < DK, rv < DV
    q = tl.load(q_ptr + bh * DK + rk, mask=mk, other=0.0)
    k = tl.load(k_ptr + bh * DK + rk, mask=mk, other=0.0)
    v = tl.load(v_ptr + bh * DV + rv, mask=mv, other=0.0)
    d = tl.load(decay_ptr + bh)
    beta = tl.load(beta_ptr + bh)
    tile = state_ptr + bh * DK * DV + rk[:, None] * DV + rv[None, :]
    mask = mk[:, None] & mv[None, :]
    s = tl.load(tile, mask=mask, other=0.0)
    delta = beta * (v - d * tl.sum(s * k[:, None], axis=0))
    s = d * s + k[:, None] * delta[None, :]
    tl.store(tile, s, mask=mask)
    tl.store(out_ptr + bh * DV + rv, tl.sum(s * q[:, None], axis=0), mask=mv)


_INTERPRETED = not isinstance(_decode_kernel, triton.runtime.JITFunction)


# triton_op (torch >= 2.6) rather than a plain call: inductor traces into it, keeping the kernel inside the
# compiled graph (no graph break under CUDA graphs), and mutates_args tells the compiler `state` is written.
@torch.library.triton_op("capgrpo::gated_delta_decode_update", mutates_args={"state"})
def decode_update(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    decay: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """One decode token: updates `state` [B, H, dk, dv] in place and returns out [B, H, dv].

    q, k [B, H, dk] (q l2-normed and scaled by dk**-0.5, k l2-normed), v [B, H, dv], decay = exp(g) and beta
    [B, H]: all float32, contiguous, on the state's device. block_v and num_warps default to the module's
    BLOCK_V and NUM_WARPS, read at the call (under torch.compile: when the graph is traced)."""
    block_v = BLOCK_V if block_v is None else block_v
    num_warps = NUM_WARPS if num_warps is None else num_warps
    B, H, dk, dv = state.shape
    expected = {"q": (q, (B, H, dk)), "k": (k, (B, H, dk)), "v": (v, (B, H, dv)), "decay": (decay, (B, H)),
                "beta": (beta, (B, H)), "state": (state, (B, H, dk, dv))}  # fmt: skip
    for name, (x, shape) in expected.items():
        if (
            tuple(x.shape) != shape
            or x.dtype != torch.float32
            or not x.is_contiguous()
            or x.device != state.device
        ):
            raise ValueError(
                f"decode_update: {name} must be a contiguous float32 tensor of shape {shape} on {state.device}, "
                f"got {x.dtype} {tuple(x.shape)} on {x.device}, contiguous={x.is_contiguous()}"
            )
    if block_v < 1 or block_v & (block_v - 1):
        raise ValueError(f"decode_update: block_v must be a power of two, got {block_v}")
    block_v = min(block_v, triton.next_power_of_2(dv))  # a narrow dv needs no masked-off columns
    out = torch.empty_like(v)
    grid = (B * H, triton.cdiv(dv, block_v))
    # under TRITON_INTERPRET=1 (CPU tests) the kernel is an InterpretedFunction, which older torch's
    # wrap_triton refuses; it runs eagerly only
    kernel = _decode_kernel if _INTERPRETED else torch.library.wrap_triton(_decode_kernel)
    kernel[grid](
        q, k, v, decay, beta, state, out, DK=dk, DV=dv, BK=triton.next_power_of_2(dk), BV=block_v,
        num_warps=num_warps,
    )  # fmt: skip
    return out


def main() -> None:
    """`python -m engine.gated_delta_kernel [B H dk dv]` on a GPU: time each (block_v, num_warps) against
    the memory floor (the state read and written once), to choose BLOCK_V and NUM_WARPS."""
    import functools
    import sys

    from triton.testing import do_bench

    B, H, dk, dv = (int(x) for x in sys.argv[1:5]) if len(sys.argv) == 5 else (256, 32, 128, 128)
    q, k = (torch.nn.functional.normalize(torch.randn(B, H, dk, device="cuda"), dim=-1) for _ in range(2))
    v = torch.randn(B, H, dv, device="cuda")
    decay, beta = torch.rand(B, H, device="cuda"), torch.rand(B, H, device="cuda")
    # updated by every timed call; the delta rule (beta, decay in [0, 1], unit k) keeps it bounded
    state = torch.randn(B, H, dk, dv, device="cuda")
    moved = 2 * state.nbytes
    print(f"B={B} H={H} dk={dk} dv={dv}: state {state.nbytes / 1e6:.0f} MB read and written once, "
          f"{moved / 4.8e9:.3f} ms at 4.8 TB/s")  # fmt: skip
    for block_v in (16, 32, 64, 128):
        for num_warps in (1, 2, 4, 8):
            ms = do_bench(functools.partial(decode_update, q, k, v, decay, beta, state, block_v, num_warps))
            print(f"block_v={block_v:4d} num_warps={num_warps}: {ms:.3f} ms, {moved / ms / 1e6:.0f} GB/s")


if __name__ == "__main__":
    main()
