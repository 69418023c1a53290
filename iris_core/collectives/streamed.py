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

Signatures: every program counts the group's streamed calls (`calls`, kept equal in every line as
Group.end_call does; the count is tile 0's delivery count, every call having a tile 0). The sender
of tile 0 writes its call's signature into my `sigs` slot of the count's parity before it raises
the tile's flag; the receiver of tile 0 compares it with its own (the same reuse argument as for
the buffers). A difference fails both calls (RankMismatchError).

A receiver that gives up sets `failed` on every member, and a program that finds it set at the
start of a call fails at once (a later call, or a peer that never came: no peer's heap is
touched again). Only the senders of a call in which a member saw calls differ deliver first:
a member may still wait for their tile 0, to read a signature, and would otherwise time out.

Region layout (iris_core.collectives.workspace, at STREAM_AT): a line with the `failed` word,
two buffers of STREAM_BYTES, then int32 tile flags [T][G], `sent` [T] and `got` [T], then
int64 `sigs` [2][WORLD] at the next multiple of 8 bytes, then int32 `calls` [MAX_PROGRAMS].
"""

import triton
import triton.language as tl

from iris_core.collectives import workspace
from iris_core.collectives.tiles import output_tile, push_tile
from iris_core.device import flags, global_timer
from iris_core.device.faults import MISMATCH, PEER_FAILED, TIMEOUT, fail
from iris_core.device.flags import LINE
from iris_core.device.tracing import EVENT_TRANSFER, EVENT_WAIT

BYTES_PER_COUNTER: tl.constexpr = tl.constexpr(workspace.STREAM_BYTES_PER_COUNTER)  # the host's layout's


@triton.jit
def _counted(g, calls, call):
    """Stores `call` as my program's count of streamed calls, and as the count of the programs this
    launch lacks (pid + programs, pid + 2 programs, ...): every line stays equal whatever the grids."""
    lines = g.pid + g.programs * tl.arange(0, g.MAX_PROGRAMS)
    tl.store(calls + lines, tl.full([g.MAX_PROGRAMS], 0, tl.int32) + call, mask=lines < g.MAX_PROGRAMS)


@triton.jit
def _give_up(g, failed, calls, call, CODE, member, theirs):
    """Fails streamed call number `call` because of `member`. Every later call of this group fails
    at once: `failed` on every member, my group flags POISON, and my program's call count moves
    on (a later call on this rank is then known to be a later one)."""
    for j in tl.static_range(g.G):
        g.ctx.store(failed, flags.failed_word(g.me, CODE, call), to_rank=g.rank(j))
    _counted(g, calls, call)
    g.fail(CODE, g.rank(member), flags.stamp(call), theirs)


@triton.jit
def _failed_before(g, gave_up, calls, call, tile_flags, sigs):
    """Fails this call, found `failed` (`gave_up`) set. When a member saw calls differ in this
    very call, with RankMismatchError naming a member whose call differs from mine (one does: two
    calls differ, so one differs from mine), read once its tile 0 flag reached this call (its
    signature slot is this call's then; the wait is bounded, as every wait); else with
    PeerFailedError naming the member that gave up. My count of calls moves on, as in _give_up."""
    _counted(g, calls, call)
    member, code, at = flags.parse_failed_word(gave_up)
    if (code == MISMATCH) & (at == call):
        start = global_timer()
        culprit = tl.full((), -1, tl.int32)
        theirs = tl.full((), 0, tl.int64)
        for i in tl.static_range(g.G):
            if (i != g.me) & (culprit < 0):
                arrived = ~flags.timed_out(g.flags.wait(tile_flags + i, call, start))
                sig = tl.load(sigs + (call % 2) * g.ctx.world_size + i, volatile=True)
                hit = arrived & (sig != g.sig)
                culprit = tl.where(hit, g.rank(i), culprit)
                theirs = tl.where(hit, sig, theirs)
        if culprit >= 0:
            fail(g.ctx, MISMATCH, g.flags.WHAT, culprit, at, g.workspace(), g.sig, theirs)
    fail(g.ctx, PEER_FAILED, g.flags.WHAT, g.rank(member), at, g.workspace(), g.sig)


@triton.jit
def run(g, c, STREAM_BYTES: tl.constexpr, STREAM_AT: tl.constexpr, SENDERS: tl.constexpr):
    ctx = g.ctx
    region = g.ws_base + STREAM_AT
    T: tl.constexpr = STREAM_BYTES // BYTES_PER_COUNTER
    failed = tl.cast(region, tl.pointer_type(tl.int64))
    sdata = region + LINE
    tile_flags = tl.cast(sdata + 2 * STREAM_BYTES, tl.pointer_type(tl.int32))
    sent = tile_flags + T
    got = sent + T
    sigs = tl.cast(sdata + 2 * STREAM_BYTES + (3 * 4 * T + 7) // 8 * 8, tl.pointer_type(tl.int64))
    calls = tl.cast(sigs + 2 * ctx.world_size, tl.pointer_type(tl.int32))
    call = tl.load(calls + g.pid) + 1  # streamed calls of this group, this one included: tile 0's delivery count
    gave_up = tl.load(failed, volatile=True)  # 0, or who gave up, why, and in which call (_give_up)
    _, why, at = flags.parse_failed_word(gave_up)
    # a member saw calls differ in this very call: my senders deliver all the same, then fail (every
    # member is alive, and one may still wait for my tile 0 to read my signature: a sender that
    # failed at once left it waiting out its timeout)
    deliver_first = (gave_up != 0) & (why == MISMATCH) & (at == call) & (g.pid < SENDERS)
    if (gave_up != 0) & ~deliver_first:
        _failed_before(g, gave_up, calls, call, tile_flags, sigs)
    width = c.width(0)
    tiles = tl.cdiv(width, c.BLOCK)
    transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, 0, 0)  # each program's share
    if g.pid < SENDERS:
        for t in range(g.pid, tiles, SENDERS):
            k = tl.load(sent + t) + 1
            ws = tl.cast(sdata + (k % 2).to(tl.uint64) * STREAM_BYTES, c.x_ptr.dtype)
            push_tile(g, c, ws, 0, width, t)
            if t == 0:
                for i in tl.static_range(g.G):
                    if i != g.me:
                        ctx.store(sigs + (call % 2) * ctx.world_size + g.me, g.sig, to_rank=g.rank(i))
            tl.debug_barrier()  # every thread's stores precede the release
            for i in tl.static_range(g.G):
                if i != g.me:
                    g.flags.set(tile_flags + t * g.G + g.me, k, g.rank(i))
            tl.store(sent + t, k)
        if deliver_first:
            _failed_before(g, gave_up, calls, call, tile_flags, sigs)
    else:
        start = global_timer()
        for t in range(g.pid - SENDERS, tiles, g.programs - SENDERS):
            k = tl.load(got + t) + 1
            wait = ctx.tracing.record_event_start(EVENT_WAIT, ctx.rank, None, t, 0)  # pid_m: the tile
            bad = tl.full((), -1, tl.int32)  # the first member that timed out or (tile 0) made another call
            code = tl.full((), TIMEOUT, tl.int32)
            theirs = tl.full((), 0, tl.int64)
            for i in tl.static_range(g.G):
                if (i != g.me) & (bad < 0):
                    if flags.timed_out(g.flags.wait(tile_flags + t * g.G + i, k, start)):
                        bad = i
                    elif t == 0:
                        sig = tl.load(sigs + (call % 2) * ctx.world_size + i, volatile=True)
                        bad = tl.where(sig != g.sig, i, bad)
                        code = tl.where(sig != g.sig, MISMATCH, code)
                        theirs = tl.where(sig != g.sig, sig, theirs)
            if bad >= 0:  # one give-up site per tile loop, whatever the group's size
                _give_up(g, failed, calls, call, code, bad, theirs)
            tl.debug_barrier()  # every thread's reads follow the acquires
            ctx.tracing.record_event_end(wait)
            ws = tl.cast(sdata + (k % 2).to(tl.uint64) * STREAM_BYTES, c.x_ptr.dtype)
            output_tile(g, c, ws, 0, width, t, True)
            tl.debug_barrier()  # every thread has read the count before it changes
            tl.store(got + t, k)
    ctx.tracing.record_event_end(transfer)
    _counted(g, calls, call)
