"""Two-shot all-reduce of one staged chunk: each member reduces the tiles it owns, then
gathers every other tile from its owner. Moves 2 (G - 1) / G of the data per member over
the link instead of one-shot's G - 1, for the price of a second flag round."""

import triton
import triton.language as tl

from iris_core.collectives.tiles import combined, get, vec


@triton.jit
def all_reduce(g, c, ws, ws2, c0, width, tiles, stamp):
    """Every member staged its chunk into `ws` and signalled `stamp`. Tile t belongs to member
    t % G: I combine mine from every member into my output and my `ws2`, signal stamp + 1, and
    read each other tile from its owner's `ws2`."""
    lanes = tl.arange(0, c.BLOCK)
    g.wait(stamp)
    for t in range(g.pid, tiles, g.programs):
        if t % g.G == g.me:
            cols = t * c.BLOCK + lanes
            mask = cols < width
            result = combined(g, c, ws, c0, cols, mask, False)
            tl.store(c.output(0, c0, cols), result, mask=mask)
            tl.store(vec(ws2, cols, c.VEC), result, mask=mask)
    g.signal(stamp + 1)
    g.wait(stamp + 1)
    for t in range(g.pid, tiles, g.programs):
        owner = t % g.G
        if owner != g.me:
            cols = t * c.BLOCK + lanes
            mask = cols < width
            tl.store(c.output(0, c0, cols), get(g.ctx, ws2 + cols, g.rank(owner), mask, c.VEC), mask=mask)
