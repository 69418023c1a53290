"""Kernels only the GPU tests use (the others come from tests/jax/kernels.py)."""

import triton
import triton.language as tl

from iris_core.device import Context
from tests.core.test_atomics import atomics_kernel, mixed_hammer_kernel
from tests.core.tile_kernels import tile_collective


@triton.jit
def hammer(context_ptr, counter_ptr, out_ptr, ITERS: tl.constexpr, W: tl.constexpr):
    """Every program of every rank adds 1 to rank 0's counter ITERS times."""
    ctx = Context.initialize(context_ptr, W)
    for _ in range(ITERS):
        ctx.atomic_add(counter_ptr, 1, to_rank=0, sem="relaxed")
    tl.store(out_ptr + tl.program_id(0), ctx.rank)


@triton.jit
def ping_pong(context_ptr, flag_ptr, data_ptr, out_ptr, ROUNDS: tl.constexpr, W: tl.constexpr):
    """Ranks 2k and 2k + 1 pass a counter back and forth ROUNDS times through flags (W even)."""
    ctx = Context.initialize(context_ptr, W)
    peer = ctx.rank ^ 1
    value = 0
    for r in range(ROUNDS):
        if (r % 2) == (ctx.rank % 2):  # my turn to send
            ctx.store(data_ptr + r, value + 1, to_rank=peer)
            tl.debug_barrier()  # the storing thread's write precedes the (other) thread's release
            ctx.atomic_xchg(flag_ptr + r, 1, to_rank=peer, sem="release")
        else:
            while tl.atomic_add(flag_ptr + r, 0, sem="acquire", scope="sys") == 0:
                pass
            tl.debug_barrier()  # no thread reads the data before the acquire
            value = tl.load(data_ptr + r, volatile=True)
    tl.store(out_ptr, value)


# -- jax-triton entry points (inputs, then outputs) for kernels of the simulator tests --------
@triton.jit
def every_atomic(context_ptr, target_ptr, old_ptr, val_ptr, cmp_ptr, n, out_ptr, W: tl.constexpr,
                 BLOCK: tl.constexpr, NUM_OPS: tl.constexpr, INT_OPS: tl.constexpr, SEM: tl.constexpr,
                 SCOPE: tl.constexpr, HINT: tl.constexpr, DEFAULTS: tl.constexpr):
    """tests/core/test_atomics.atomics_kernel (every atomic, twice, on both neighbours' heaps)."""
    atomics_kernel(context_ptr, target_ptr, old_ptr, val_ptr, cmp_ptr, n, W, BLOCK, NUM_OPS, INT_OPS, SEM, SCOPE,
                   HINT, DEFAULTS)
    tl.store(out_ptr, 0)


@triton.jit
def mixed_hammer(context_ptr, counters_ptr, out_ptr, W: tl.constexpr, ITERS: tl.constexpr, LANES: tl.constexpr):
    """tests/core/test_atomics.mixed_hammer_kernel (six atomics on rank 0's counters)."""
    mixed_hammer_kernel(context_ptr, counters_ptr, W, ITERS, LANES)
    tl.store(out_ptr, 0)


@triton.jit
def tile_collective_call(context_ptr, x_ptr, src_ptr, dst_ptr, locks_ptr, M, N, out_ptr, OP: tl.constexpr,
                         W: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, NPR: tl.constexpr):
    """tests/core/tile_kernels.tile_collective (a tile-level Context collective) on M x N."""
    tile_collective(context_ptr, x_ptr, src_ptr, dst_ptr, locks_ptr, M, N, 1, OP, W, BM, BN, NPR)
    tl.store(out_ptr, 0)


@triton.jit
def read_after(context_ptr, buf_ptr, after_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out = my own buf; `after` only orders this kernel after the one that produced it."""
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(buf_ptr + offs, mask=m, volatile=True), mask=m)
