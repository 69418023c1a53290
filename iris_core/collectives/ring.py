"""Ring all-reduce of one staged chunk: G - 1 reduce-scatter steps, then G - 1 all-gather
steps, each member talking only to its neighbours (the bandwidth-optimal schedule when the
links between neighbours are what limits)."""

import triton
import triton.language as tl

from iris_core.collectives.tiles import combine
from iris_core.device import global_timer


@triton.jit
def all_reduce(g, c, ws, ws2, c0, width, tiles, stamp):
    """My input is staged in `ws`, my flag at `stamp`; `ws2` holds partial sums in the
    accumulator's type (c.ACC), so each element is rounded to the output's type once. Tiles
    are split into G segments (tile t in segment t % G). Reduce-scatter, steps k = 1..G-1:
    add my input to the predecessor's partial of segment me - k (its staged input for k = 1)
    into my `ws2`. I then hold segment me + 1 in full. All-gather, steps j = 1..G-1: copy the
    predecessor's full segment me - j + 1 into my `ws2` and output; before overwriting that
    slot, wait until the successor has read it (its step j)."""
    G: tl.constexpr = g.G
    out_type: tl.constexpr = c.out_ptr.dtype.element_ty
    lanes = tl.arange(0, c.BLOCK)
    pred = (g.me + G - 1) % G
    succ = (g.me + 1) % G
    for k in tl.static_range(1, G):
        g.wait_member(pred, stamp + k - 1, global_timer())
        tl.debug_barrier()
        segment = (g.me + G - k) % G
        for t in range(g.pid, tiles, g.programs):
            if t % G == segment:
                cols = t * c.BLOCK + lanes
                mask = cols < width
                if k == 1:
                    partial = g.ctx.load(ws + cols, from_rank=g.rank(pred), mask=mask)
                else:
                    partial = g.ctx.load(ws2 + cols, from_rank=g.rank(pred), mask=mask)
                mine = tl.load(ws + cols, mask=mask)
                tl.store(ws2 + cols, combine(partial.to(c.ACC), mine.to(c.ACC), c.OP), mask=mask)
        g.signal(stamp + k)
    for t in range(g.pid, tiles, g.programs):  # my fully reduced segment
        if t % G == succ:
            cols = t * c.BLOCK + lanes
            mask = cols < width
            tl.store(c.out_ptr + (c0 + cols).to(tl.int64), tl.load(ws2 + cols, mask=mask).to(out_type), mask=mask)
    for j in tl.static_range(1, G):
        start = global_timer()
        g.wait_member(pred, stamp + G - 2 + j, start)
        g.wait_member(succ, stamp + j, start)
        tl.debug_barrier()
        segment = (g.me + G - j + 1) % G
        for t in range(g.pid, tiles, g.programs):
            if t % G == segment:
                cols = t * c.BLOCK + lanes
                mask = cols < width
                value = g.ctx.load(ws2 + cols, from_rank=g.rank(pred), mask=mask)
                tl.store(ws2 + cols, value, mask=mask)
                tl.store(c.out_ptr + (c0 + cols).to(tl.int64), value.to(out_type), mask=mask)
        g.signal(stamp + G - 1 + j)
