"""Triton kernels of the fault tests (test_faults.py, launched_faults.py): each misbehaves on one
rank only, chosen at run time (`victim`), and copies x to out on the others.

A module of their own (triton and the device API only), so a simulated rank's worker imports
them cheaply.
"""

import os

import triton
import triton.language as tl

from iris_core.device import Context
from iris_core.device.intrinsics import global_timer, nanosleep


@triton.jit
def spin_on_rank(context_ptr, started_ptr, x_ptr, n, victim, spin_ns, out_ptr, W: tl.constexpr,
                 BLOCK: tl.constexpr):
    """out = x, after `spin_ns` nanoseconds on rank `victim` (a rank that is late for what follows),
    which first sets its `started` flag (a heap array the test watches)."""
    ctx = Context.initialize(context_ptr, W)
    if ctx.rank == victim:
        tl.store(started_ptr, 1)
        start = global_timer()
        while global_timer() - start < spin_ns:
            nanosleep(1000000)  # 1 ms: the simulator sleeps instead of spinning a core
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


@triton.jit
def store_past_heap_on_rank(context_ptr, buf_ptr, x_ptr, n, victim, past, out_ptr, W: tl.constexpr,
                            BLOCK: tl.constexpr):
    """Stores x into my own buf (a guarded store), `past` elements further on rank `victim`: past the
    heap's end there, which the heap guard refuses. out = x."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    shift = tl.where(ctx.rank == victim, past, 0).to(tl.int64)
    ctx.store(buf_ptr + shift + offs, x, to_rank=ctx.rank, mask=m)
    tl.store(out_ptr + offs, x, mask=m)


@triton.jit
def assert_not_on_rank(context_ptr, x_ptr, n, victim, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """A device-side assertion that fails on rank `victim` (with triton_call(debug=True)). out = x."""
    ctx = Context.initialize(context_ptr, W)
    tl.device_assert(ctx.rank != victim, "fault test: assertion failed on the victim rank")
    offs = tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m), mask=m)


def worker_pid(state) -> int:
    """The pid of the simulated rank's worker process (SimWorld.run(worker_pid))."""
    return os.getpid()
