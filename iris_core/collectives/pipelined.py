"""The shared tile loop: one-shot all-reduce and every other kind, chunk after chunk, with
chunk c + 1 sent in the same tile loop that makes chunk c's output, so the two overlap.

Pull mode: chunk c + 1 is staged into my buffer (a local copy) and members read it over the
link. Push mode (PUSH): chunk c + 1 goes straight into my slot of each receiver's buffer
(remote stores), and chunk c is read from my own buffer (local reads): no staging copy, and
with traffic both ways the link moves stores faster than loads.

Chunk c + 1 is announced (its stamp) only after chunk c was received: a member's flag for
chunk c + 1 therefore also says that it is done with chunk c - 1, whose buffer (same
parity) chunk c + 2 is written into (mine in pull mode, the member's in push mode).
"""

import triton
import triton.language as tl

from iris_core.collectives.tiles import buffer, output_tile, push_tile, stage, stage_tile
from iris_core.device import flags
from iris_core.device.tracing import EVENT_TRANSFER


@triton.jit
def run(g, c, epoch, in_place, DATA: tl.constexpr, DATA_BYTES: tl.constexpr, PUSH: tl.constexpr):
    """Chunk c at epoch + 1 + c; returns the last chunk's epoch. in_place: members read my input
    where it is (zero-copy), nothing to stage. Traced, each chunk is a `transfer` span."""
    ctx = g.ctx
    chunks = tl.cdiv(c.m, c.CHUNK)
    transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, 0, 0)  # chunk 0's span: from staging
    first = c.width(0)
    ws_first = buffer(g.ws_base, epoch + 1, DATA, DATA_BYTES, c.x_ptr.dtype)
    if PUSH:
        for t in range(g.pid, tl.cdiv(first, c.BLOCK), g.programs):
            push_tile(g, c, ws_first, 0, first, t)
    elif not in_place:
        stage(g, c, ws_first, 0, first, tl.cdiv(first, c.BLOCK))
    g.signal(flags.stamp(epoch + 1))
    for k in range(0, chunks):
        e = epoch + 1 + k
        c0 = k * c.CHUNK
        width = c.width(c0)
        tiles = tl.cdiv(width, c.BLOCK)
        more = k + 1 < chunks
        next_width = tl.where(more, c.width(tl.minimum(c0 + c.CHUNK, c.m)), 0)
        next_tiles = tl.where(in_place, 0, tl.cdiv(next_width, c.BLOCK))
        ws = buffer(g.ws_base, e, DATA, DATA_BYTES, c.x_ptr.dtype)
        ws_next = buffer(g.ws_base, e + 1, DATA, DATA_BYTES, c.x_ptr.dtype)
        if k > 0:  # chunk k's span: its wait, its reads (alongside sending k + 1), the next signal
            transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, k, 0)
        g.wait(flags.stamp(e))
        for t in range(g.pid, tl.maximum(tiles, next_tiles), g.programs):
            if t < next_tiles:
                if PUSH:
                    push_tile(g, c, ws_next, c0 + c.CHUNK, next_width, t)
                else:
                    stage_tile(c, ws_next, c0 + c.CHUNK, next_width, t)
            if t < tiles:
                output_tile(g, c, ws, c0, width, t, PUSH)
        if more:
            g.signal(flags.stamp(e + 1))
        ctx.tracing.record_event_end(transfer)
    return epoch + chunks
