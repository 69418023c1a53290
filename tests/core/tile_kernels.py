"""Kernels for test_tile_collectives (a light module: simulated ranks import it)."""

import triton
import triton.language as tl

from iris_core.device import Context, TensorView, Tile

ATOMIC, SPINLOCK, ONE_SHOT, TWO_SHOT, REDUCE_SCATTER, ALL_GATHER_ROWS, ALL_GATHER_COLS, GATHER, ALL_TO_ALL = range(9)


@triton.jit
def tile_collective(context_ptr, x_ptr, src_ptr, dst_ptr, locks_ptr, M, N, stride_n,
                    OP: tl.constexpr, W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, NPR: tl.constexpr,
                    TIMEOUT_NS: tl.constexpr = 60_000_000_000):
    """x is my M x N input; dst is M x N (or the gathered shape for ALL_GATHER_*)."""
    ctx = Context.initialize(context_ptr, W)
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    x = TensorView(x_ptr, M, N, N, stride_n)
    ptrs, mask = x.tile_ptr(Tile(pm, pn, BM, BN, tl.zeros((BM, BN), tl.float32)))
    tile = Tile(pm, pn, BM, BN, tl.load(ptrs, mask=mask, other=0))
    src = TensorView(src_ptr, M, N, N, stride_n)
    if OP == 0:
        ctx.all_reduce_atomic(tile, TensorView(dst_ptr, M, N, N, stride_n))
    elif OP == 1:
        ctx.all_reduce_spinlock(tile, TensorView(dst_ptr, M, N, N, stride_n), locks_ptr)
    elif OP == 2:
        ctx.all_reduce_one_shot(tile, src, TensorView(dst_ptr, M, N, N, stride_n), locks_ptr, TIMEOUT_NS)
    elif OP == 3:
        ctx.all_reduce_two_shot(tile, src, TensorView(dst_ptr, M, N, N, stride_n), locks_ptr)
    elif OP == 4:
        ctx.reduce_scatter(tile, src, TensorView(dst_ptr, M, N, N, stride_n), locks_ptr)
    elif OP == 5:
        ctx.all_gather(tile, TensorView(dst_ptr, W * M, N, N, stride_n), 0)
    elif OP == 6:
        ctx.all_gather(tile, TensorView(dst_ptr, M, W * N, W * N, stride_n), 1)
    elif OP == 7:
        # every rank fetches the tile of rank (rank + 1) % W from its x and stores it locally
        data = ctx.gather(tile, x, (ctx.rank + 1) % W)
        out_ptrs, out_mask = TensorView(dst_ptr, M, N, N, stride_n).tile_ptr(tile)
        tl.store(out_ptrs, data, mask=out_mask)
    else:
        ctx.all_to_all(tile, x, TensorView(dst_ptr, M, N, N, stride_n), NPR)
