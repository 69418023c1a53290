"""Kernels only the GPU tests use (the others come from tests/jax/kernels.py)."""

import triton
import triton.language as tl

from iris_core.device import Context


@triton.jit
def hammer(context_ptr, counter_ptr, out_ptr, ITERS: tl.constexpr, W: tl.constexpr):
    """Every program of every rank adds 1 to rank 0's counter ITERS times."""
    ctx = Context.initialize(context_ptr, W)
    for _ in range(ITERS):
        ctx.atomic_add(counter_ptr, 1, to_rank=0, sem="relaxed")
    tl.store(out_ptr + tl.program_id(0), ctx.rank)


@triton.jit
def ping_pong(context_ptr, flag_ptr, data_ptr, out_ptr, ROUNDS: tl.constexpr, W: tl.constexpr):
    """Rank 0 and 1 pass a counter back and forth ROUNDS times through flags."""
    ctx = Context.initialize(context_ptr, W)
    peer = 1 - ctx.rank
    value = 0
    for r in range(ROUNDS):
        if (r % 2) == ctx.rank:  # my turn to send
            ctx.store(data_ptr + r, value + 1, to_rank=peer)
            tl.debug_barrier()  # the storing thread's write precedes the (other) thread's release
            ctx.atomic_xchg(flag_ptr + r, 1, to_rank=peer, sem="release")
        else:
            while tl.atomic_add(flag_ptr + r, 0, sem="acquire", scope="sys") == 0:
                pass
            tl.debug_barrier()  # no thread reads the data before the acquire
            value = tl.load(data_ptr + r, volatile=True)
    tl.store(out_ptr, value)
