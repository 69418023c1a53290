"""Kernels of tests/jax/test_tracing.py (a light module: simulated ranks import it)."""

import triton
import triton.language as tl

from iris_core.device import Context
from iris_core.device.tracing import EVENT_TRANSFER


@triton.jit
def read_next(context_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr, TRACING: tl.constexpr):
    """out = the next rank's x, inside a `transfer` span (the load records its own event)."""
    ctx = Context.initialize(context_ptr, W, tracing=TRACING)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    peer = (ctx.rank + 1) % W
    span = ctx.tracing.record_event_start(EVENT_TRANSFER, peer, x_ptr + offs, 5, 6, mask=mask)
    tl.store(out_ptr + offs, ctx.load(x_ptr + offs, from_rank=peer, mask=mask), mask=mask)
    ctx.tracing.record_event_end(span)
