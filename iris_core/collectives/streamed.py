"""Streamed push of a one-chunk call (m <= CHUNK) of a kind in which every member sends to
every other (all-reduce one-shot, all-gather, reduce-scatter, all-to-all).

Programs 0..SENDERS-1 send: each stores its tiles into my slot of every receiver's streamed
buffer and raises the tile's flag there. They never wait. The others receive: each waits for
its tiles' flags from every member and makes its output tiles from its own buffer (local
reads) while the senders are still sending. Nothing waits for a whole chunk: the local work
overlaps the transfer tile by tile, and no round leaves the link idle.

Senders and receivers are different programs, whose epochs (per program) need not agree, so
tiles carry their own count: the k-th delivery of tile t (k = 1 + my `sent`/`got` count of t,
equal on every rank: SPMD) goes into buffer k % 2 and sets flag [t][me] to k. Reuse: a rank
writes delivery k of tile t into a member's buffer k % 2 only after its call of delivery
k - 1 ended, in which it waited for the member's delivery k - 1, sent after the member's call
of delivery k - 2 (which consumed it) had ended (stream order). The region is the streamed
calls' own, so other modes' calls cannot collide with it. Traced, each program's share is a
`transfer` span; a receiver's wait for a tile a `wait`.

Region layout (iris_core.collectives.workspace, at STREAM_AT): a line with the `failed` word,
two buffers of STREAM_BYTES, then int32 tile flags [T][G], `sent` [T] and `got` [T].
"""

import triton
import triton.language as tl

from iris_core.collectives.tiles import output_tile, push_tile
from iris_core.device import flags, global_timer
from iris_core.device.flags import LINE
from iris_core.device.nvidia import peer_failed
from iris_core.device.tracing import EVENT_TRANSFER, EVENT_WAIT


@triton.jit
def run(g, c, STREAM_BYTES: tl.constexpr, STREAM_AT: tl.constexpr, SENDERS: tl.constexpr):
    ctx = g.ctx
    region = g.ws_base + STREAM_AT
    T: tl.constexpr = STREAM_BYTES // 256
    failed = tl.cast(region, tl.pointer_type(tl.int64))
    sdata = region + LINE
    tile_flags = tl.cast(sdata + 2 * STREAM_BYTES, tl.pointer_type(tl.int32))
    sent = tile_flags + T
    got = sent + T
    gave_up = tl.load(failed, volatile=True)  # 1 + the rank that gave up on an earlier call, or 0
    if gave_up != 0:
        peer_failed(g.WHAT, gave_up.to(tl.int32) - 1)
    width = c.width(0)
    tiles = tl.cdiv(width, c.BLOCK)
    transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, 0, 0)  # each program's share
    if g.pid < SENDERS:
        for t in range(g.pid, tiles, SENDERS):
            k = tl.load(sent + t) + 1
            ws = tl.cast(sdata + (k % 2).to(tl.uint64) * STREAM_BYTES, c.x_ptr.dtype)
            push_tile(g, c, ws, 0, width, t)
            tl.debug_barrier()  # every thread's stores precede the release
            for i in tl.static_range(g.G):
                if i != g.me:
                    flags.set_flag(ctx, tile_flags + t * g.G + g.me, k, g.rank(i))
            tl.store(sent + t, k)
    else:
        start = global_timer()
        for t in range(g.pid - SENDERS, tiles, g.programs - SENDERS):
            k = tl.load(got + t) + 1
            wait = ctx.tracing.record_event_start(EVENT_WAIT, ctx.rank, None, t, 0)  # pid_m: the tile
            for i in tl.static_range(g.G):
                if i != g.me:
                    if flags.timed_out(flags.wait(tile_flags + t * g.G + i, k, start, g.TIMEOUT_NS)):
                        for j in tl.static_range(g.G):  # later calls of this group fail at once
                            ctx.store(failed, (g.rank(g.me) + 1).to(tl.int64), to_rank=g.rank(j))
                        g.give_up(g.rank(i))
            tl.debug_barrier()  # every thread's reads follow the acquires
            ctx.tracing.record_event_end(wait)
            ws = tl.cast(sdata + (k % 2).to(tl.uint64) * STREAM_BYTES, c.x_ptr.dtype)
            output_tile(g, c, ws, 0, width, t, True)
            tl.debug_barrier()  # every thread has read the count before it changes
            tl.store(got + t, k)
    ctx.tracing.record_event_end(transfer)
