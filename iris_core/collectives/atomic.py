"""Atomic and spinlock all-reduce of one chunk: every member adds its input into every
member's zeroed workspace, by remote atomic adds (ATOMIC) or by read-add-write under a
per-tile lock (SPINLOCK, for what has no atomic add), then reads its own."""

import triton
import triton.language as tl

from iris_core.device import global_timer


@triton.jit
def all_reduce(g, c, ws, locks, c0, width, tiles, stamp, LOCKED: tl.constexpr):
    """`ws`: my accumulator, in the accumulator's type (c.ACC: each element is rounded to the
    output's type once); `locks`: a lock per tile (LOCKED)."""
    lanes = tl.arange(0, c.BLOCK)
    for t in range(g.pid, tiles, g.programs):  # 1. zero my accumulator (and my locks)
        cols = t * c.BLOCK + lanes
        tl.store(ws + cols, tl.zeros([c.BLOCK], ws.dtype.element_ty), mask=cols < width)
        if LOCKED:
            tl.store(locks + t, 0)
    g.signal(stamp)
    g.wait(stamp)
    for t in range(g.pid, tiles, g.programs):  # 2. add my input into every member's accumulator
        cols = t * c.BLOCK + lanes
        mask = cols < width
        value = tl.load(c.x_ptr + (c0 + cols).to(tl.int64), mask=mask)
        for i in tl.static_range(g.G):
            if LOCKED:
                if g.flags.lock(locks + t, g.rank(i), global_timer()) != 0:
                    g.give_up(g.rank(i), stamp)
                current = g.ctx.load(ws + cols, from_rank=g.rank(i), mask=mask, cache_modifier=".cg")
                total = (current.to(c.ACC) + value.to(c.ACC)).to(ws.dtype.element_ty)
                g.ctx.store(ws + cols, total, to_rank=g.rank(i), mask=mask)
                tl.debug_barrier()
                g.flags.unlock(locks + t, g.rank(i))
            else:
                g.ctx.atomic_add(ws + cols, value, to_rank=g.rank(i), mask=mask, sem="relaxed", scope="sys")
    g.signal(stamp + 1)
    g.wait(stamp + 1)
    for t in range(g.pid, tiles, g.programs):  # 3. my accumulator holds the sum
        cols = t * c.BLOCK + lanes
        mask = cols < width
        tl.store(c.out_ptr + (c0 + cols).to(tl.int64),
                 tl.load(ws + cols, mask=mask, cache_modifier=".cg").to(c.out_ptr.dtype.element_ty), mask=mask)
