"""Triton kernels of the iris_jax tests.

They live in their own module (triton and the device API only) so that a simulated rank's
worker process can import them cheaply when a kernel is sent to it. The GPU tests use them too.
"""

import triton
import triton.language as tl

from iris_core.device import Context


@triton.jit
def heap_offset_of(context_ptr, buf_ptr, out_ptr, W: tl.constexpr):
    """out[0] = buf_ptr - heap_bases[rank] (int64); out[1] = rank."""
    ctx = Context.initialize(context_ptr, W)
    base = tl.load(ctx.heap_bases + ctx.rank)
    offset = buf_ptr.to(tl.uint64, bitcast=True) - base
    tl.store(out_ptr, offset.to(tl.int64))
    tl.store(out_ptr + 1, ctx.rank.to(tl.int64))


@triton.jit
def ring_store(context_ptr, buf_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr):
    """Stores x into the next rank's buf; out = x * 2 + rank."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    ctx.store(buf_ptr + offs, x, to_rank=(ctx.rank + 1) % W, mask=m, hint=HINT)
    tl.store(out_ptr + offs, x * 2 + ctx.rank, mask=m)


@triton.jit
def ring_load(context_ptr, buf_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """out = the next rank's buf."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, ctx.load(buf_ptr + offs, from_rank=(ctx.rank + 1) % W, mask=m, other=0), mask=m)


@triton.jit
def read_local(context_ptr, buf_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """out = my own buf (a copy made by a kernel, not by XLA)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(buf_ptr + offs, mask=m, volatile=True), mask=m)


@triton.jit
def atomics_all(context_ptr, counters_ptr, out_ptr, W: tl.constexpr, ITERS: tl.constexpr):
    """counters (int32, 6 per rank), all updated from every rank:

    [0] += rank + 1 on every peer           [1] = max(., 10 * rank) on every peer
    [2] += 1, ITERS times, on rank 0 only   [3] = CAS(0 -> rank + 1) on rank 0 (one winner)
    [4] = xchg(rank + 1) on the next rank   [5] = min(., -rank) on every peer
    out = [old value of the CAS, old value of the xchg]
    """
    ctx = Context.initialize(context_ptr, W)
    for peer in range(W):
        ctx.atomic_add(counters_ptr + 0, ctx.rank + 1, to_rank=peer)
        ctx.atomic_max(counters_ptr + 1, ctx.rank * 10, to_rank=peer)
        ctx.atomic_min(counters_ptr + 5, -ctx.rank, to_rank=peer)
    for _ in range(ITERS):
        ctx.atomic_add(counters_ptr + 2, 1, to_rank=0, sem="relaxed")
    cas_old = ctx.atomic_cas(counters_ptr + 3, 0, ctx.rank + 1, to_rank=0)
    xchg_old = ctx.atomic_xchg(counters_ptr + 4, ctx.rank + 1, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr, cas_old)
    tl.store(out_ptr + 1, xchg_old)


@triton.jit
def add_rank_bump_peer(context_ptr, x_ptr, counter_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """out = x + rank + 1; atomically adds 1 to the next rank's counter."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    m = offs < n
    ctx.atomic_add(counter_ptr, 1, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + ctx.rank + 1, mask=m)


@triton.jit
def store_to_next(context_ptr, buf_ptr, out_ptr, W: tl.constexpr):
    """Only effect that matters: buf[0] on the next rank = 42 + rank. out is a dummy."""
    ctx = Context.initialize(context_ptr, W)
    ctx.store(buf_ptr, ctx.rank + 42, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr, 0)


@triton.jit
def store_at_shift(context_ptr, buf_ptr, shift_ptr, out_ptr, W: tl.constexpr):
    """Stores rank + 1 at buf + shift (shift in bytes, loaded: the run does not depend on it) on the
    next rank."""
    ctx = Context.initialize(context_ptr, W)
    shift = tl.load(shift_ptr)
    target = (buf_ptr.to(tl.pointer_type(tl.int8)) + shift).to(tl.pointer_type(tl.float32))
    ctx.store(target, (ctx.rank + 1).to(tl.float32), to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr, shift)


@triton.jit
def write_peer_through(context_ptr, sym_ptr, heap_ptr, out_ptr, W: tl.constexpr):
    """Writes 42 into the next rank's heap_ptr[0]; sym_ptr is the argument declared symmetric."""
    ctx = Context.initialize(context_ptr, W)
    ctx.store(heap_ptr, 42, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr, tl.load(sym_ptr))


@triton.jit
def add_vectors(x_ptr, y_ptr, n, out_ptr, BLOCK: tl.constexpr):
    """Plain jax_triton kernel (no context): out = x + y."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)


@triton.jit
def write_rank(context_ptr, out_ptr, W: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    tl.store(out_ptr, ctx.rank)
