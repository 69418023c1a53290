"""One persistent kernel for every whole-array collective: stage, signal, wait, gather.

The kernel's second argument is the group row [my index, member ranks..., workspace offset]
(iris_jax.call.group_table); the workspace layout is iris_core.collectives.workspace.

Each rank stages its input into its workspace buffer, signals every peer of its group,
waits for their signals, then reads what it needs from the peers' workspaces (pulls):

    kind            input blocks  output blocks  reads from member i
    ALL_REDUCE      1             1              all of it, combined (one-shot or two-shot)
    ALL_GATHER      1             G              all of it, into output block i
    REDUCE_SCATTER  G             1              its block `me`, combined
    ALL_TO_ALL      G             G              its block `me`, into output block i
    PPERMUTE        1             1              all of it, from the source member only
    BROADCAST       1             1              all of it, from the root only

Inputs are viewed as [XB, m] and outputs as [OB, m]. Program k owns the column tiles
j = k, k + P, ... of every block, both when staging and when reading, and waits only for
program k of its peers: correct with every program resident (GPU) and with programs run
one after another (the simulator). Columns are processed in chunks that fit the workspace;
the pipelined kinds (all but two-shot, ring, atomic and spinlock all-reduce) send chunk c + 1
in the same tile loop that receives chunk c (_pipelined).

Push mode (PUSH, large arrays, the pipelined kinds): instead of staging into its own buffer
for members to pull, each rank stores what member i needs straight into its slot in member
i's buffer ([G - 1][CHUNK] per buffer: one slot per sender, none for i itself, _slot),
signals, and every rank reads its own buffer locally.

Streamed push (STREAM, one-chunk calls of the kinds in which every member sends to every
other: all-reduce one-shot, all-gather, reduce-scatter, all-to-all): half the programs push
tiles and flag each one on its receiver, the other half wait for those tile flags and make
the output tile by tile (_streamed), so the local work overlaps the transfer without
chunk-wide rounds.

Zero-copy (ZERO_COPY, large arrays; not ring/atomic/spinlock): a rank whose input lies on
its heap skips staging and publishes the input's heap offset to every member (word 1 of its
flag line there, -1 otherwise), once per call; members read that input in place. Since a
peer may then read my input until its last chunk, the call ends with one more round ("done")
before any rank returns. Every rank decides for itself; mixed groups work.

Peers' workspaces are read with plain loads: every read follows an acquire of the peer's
flag and a CTA barrier (iris_core.device.flags), which order it after the peer's writes, so
the much slower `.cg` loads (L2 only) are not needed (benchmarks/RESULTS.md, "session 2").
"""

import triton
import triton.language as tl

from iris_core.device import Context, flags, global_timer
from iris_core.device.flags import LINE
from iris_core.device.nvidia import peer_failed, peer_timeout
from iris_core.device.tracing import EVENT_TRANSFER, EVENT_WAIT

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, PPERMUTE, BROADCAST = range(6)
SUM, MAX, MIN = range(3)
ONE_SHOT, TWO_SHOT, ATOMIC, SPINLOCK, RING = range(5)
STEPS: tl.constexpr = tl.constexpr(64)  # flag rounds per chunk (ring: 2G - 1, so G <= 32)
DONE: tl.constexpr = tl.constexpr(63)  # the last round of the last chunk: zero-copy readers are done


@triton.jit
def _combine(acc, value, OP: tl.constexpr):
    if OP == 0:
        return acc + value
    elif OP == 1:
        return tl.maximum(acc, value)
    else:
        return tl.minimum(acc, value)


@triton.jit
def _vec(base, offsets, VEC: tl.constexpr):
    """base + offsets (a tile), declared as runs of VEC elements that start on 16-byte
    boundaries, so accesses become 16-byte vectors. True for every tile here when VEC > 1:
    bases are 16-byte aligned and the column count is a multiple of VEC (see
    iris_jax.collectives._launch). (The hint must sit where the pointers are computed: Triton
    drops it on a function's argument.)"""
    ptrs = base + offsets
    if VEC > 1:
        ptrs = tl.max_contiguous(tl.multiple_of(ptrs, 16), VEC)
    return ptrs


@triton.jit
def _get(ctx, ptrs, rank, mask, VEC: tl.constexpr):
    """ctx.load of a tile from `rank`, vectorized as _vec (the translated address keeps the
    alignment: heaps are page aligned)."""
    if VEC > 1:
        return ctx.load(ptrs, from_rank=rank, mask=mask, hint=16)
    return ctx.load(ptrs, from_rank=rank, mask=mask)


@triton.jit
def _flag(ws_base, pid, member, MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr):
    """Pointer (in my heap) to the flag `member` raises for program `pid`."""
    line = MAX_PROGRAMS + pid * WORLD + member
    return tl.cast(ws_base + line * LINE, tl.pointer_type(tl.int64))


@triton.jit
def _publish(ctx, group_ptr, ws_base, pid, me, input_offset, G: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
             WORLD: tl.constexpr):
    """Zero-copy: writes my input's heap offset (-1: staged) next to my flag on every member;
    the next _signal releases it. Stable for the whole call (rewritten after the DONE round)."""
    word = _flag(ws_base, pid, me, MAX_PROGRAMS, WORLD) + 1
    for i in tl.static_range(G):
        ctx.store(word, input_offset, to_rank=tl.load(group_ptr + 1 + i))


@triton.jit
def _source(ctx, ws, heap_base, x_ptr, ws_base, pid, member, block_in, m, c0, cols, ZERO_COPY: tl.constexpr,
            CHUNK: tl.constexpr, MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr):
    """My-heap pointers to `cols` of input block `block_in` as `member` offers them: its staged
    workspace, or (zero-copy) its input in place; ctx.load translates them to the member."""
    staged = ws + block_in * CHUNK + cols
    if ZERO_COPY:
        offset = tl.load(_flag(ws_base, pid, member, MAX_PROGRAMS, WORLD) + 1)
        in_place = tl.cast(tl.cast(heap_base + offset, tl.pointer_type(tl.int8)), x_ptr.dtype)
        in_place = in_place + (block_in * m + c0 + cols).to(tl.int64)
        return tl.where(offset >= 0, in_place, staged)
    return staged


@triton.jit
def _signal(ctx, group_ptr, ws_base, pid, me, stamp, G: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
            WORLD: tl.constexpr):
    """Raises my flag to `stamp` on every member (flags.signal: my earlier writes first)."""
    tl.debug_barrier()  # every thread's stores precede the release
    flag = _flag(ws_base, pid, me, MAX_PROGRAMS, WORLD)
    for i in tl.static_range(G):
        flags.signal(ctx, flag, stamp, tl.load(group_ptr + 1 + i))


@triton.jit
def _give_up(ctx, group_ptr, ws_base, pid, me, rank, G: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
             WORLD: tl.constexpr, WHAT: tl.constexpr):
    """Times out waiting on `rank`. My flag on every member becomes POISON first: this call's
    epoch is lost on my side, so a member's later wait on me must fail, not pass on a stale
    flag. No CTA barrier here: threads may reach this branch at different times."""
    flag = _flag(ws_base, pid, me, MAX_PROGRAMS, WORLD)
    for i in tl.static_range(G):
        flags.poison(ctx, flag, tl.load(group_ptr + 1 + i))
    peer_timeout(WHAT, rank)


@triton.jit
def _wait_member(ctx, group_ptr, ws_base, pid, me, member, stamp, start, G: tl.constexpr,
                 MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """Waits until `member`'s flag reached `stamp` (flags.wait); gives up after the timeout,
    fails at once when the member gave up on an earlier call (its flag is POISON)."""
    seen = flags.wait(_flag(ws_base, pid, member, MAX_PROGRAMS, WORLD), stamp, start, TIMEOUT_NS)
    if flags.timed_out(seen):
        _give_up(ctx, group_ptr, ws_base, pid, me, tl.load(group_ptr + 1 + member), G, MAX_PROGRAMS, WORLD, WHAT)
    if flags.poisoned(seen):
        peer_failed(WHAT, tl.load(group_ptr + 1 + member))


@triton.jit
def _wait(ctx, group_ptr, ws_base, pid, me, stamp, G: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
          WORLD: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """Waits until every member's flag reached `stamp` (traced as a `wait` span)."""
    event = ctx.tracing.record_event_start(EVENT_WAIT, ctx.rank, None)
    start = global_timer()
    for i in tl.static_range(G):
        _wait_member(ctx, group_ptr, ws_base, pid, me, i, stamp, start, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
    tl.debug_barrier()
    ctx.tracing.record_event_end(event)


@triton.jit
def _rank(group_ptr, member):
    """Global rank of group member `member` (group row: [me, ranks..., offset lo, hi])."""
    return tl.load(group_ptr + 1 + member)


@triton.jit
def _workspace_offset(group_ptr, G: tl.constexpr):
    """Heap offset of this group's workspace (see iris_jax.workspace)."""
    low = tl.load(group_ptr + 1 + G).to(tl.uint32).to(tl.uint64)
    high = tl.load(group_ptr + 2 + G).to(tl.uint32).to(tl.uint64)
    return low | (high << 32)


@triton.jit
def _all_reduce_push(ctx, group_ptr, x_ptr, out_ptr, ws, locks, ws_base, c0, m, width, tiles, pid, programs, me,
                     stamp, LOCKED: tl.constexpr, G: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
                     MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                     WHAT: tl.constexpr):
    """Atomic / spinlock all-reduce of one chunk: every rank adds its input into every rank's
    zeroed workspace (atomically, or read-add-write under a per-tile lock), then reads its own."""
    lanes = tl.arange(0, BLOCK)
    for t in range(pid, tiles, programs):  # 1. zero my accumulator (and my locks)
        cols = t * BLOCK + lanes
        tl.store(ws + cols, tl.zeros([BLOCK], ws.dtype.element_ty), mask=cols < width)
        if LOCKED:
            tl.store(locks + t, 0)
    _signal(ctx, group_ptr, ws_base, pid, me, stamp, G, MAX_PROGRAMS, WORLD)
    _wait(ctx, group_ptr, ws_base, pid, me, stamp, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
    for t in range(pid, tiles, programs):  # 2. add my input into every rank's accumulator
        cols = t * BLOCK + lanes
        mask = cols < width
        value = tl.load(x_ptr + (c0 + cols).to(tl.int64), mask=mask)
        for i in tl.static_range(G):
            if LOCKED:
                if flags.lock(ctx, locks + t, _rank(group_ptr, i), global_timer(), TIMEOUT_NS) != 0:
                    _give_up(ctx, group_ptr, ws_base, pid, me, _rank(group_ptr, i), G, MAX_PROGRAMS, WORLD, WHAT)
                current = ctx.load(ws + cols, from_rank=_rank(group_ptr, i), mask=mask, cache_modifier=".cg")
                total = (current.to(ACC) + value.to(ACC)).to(ws.dtype.element_ty)
                ctx.store(ws + cols, total, to_rank=_rank(group_ptr, i), mask=mask)
                tl.debug_barrier()
                flags.unlock(ctx, locks + t, _rank(group_ptr, i))
            else:
                ctx.atomic_add(ws + cols, value, to_rank=_rank(group_ptr, i), mask=mask, sem="relaxed", scope="sys")
    _signal(ctx, group_ptr, ws_base, pid, me, stamp + 1, G, MAX_PROGRAMS, WORLD)
    _wait(ctx, group_ptr, ws_base, pid, me, stamp + 1, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
    for t in range(pid, tiles, programs):  # 3. my accumulator holds the sum
        cols = t * BLOCK + lanes
        mask = cols < width
        tl.store(out_ptr + (c0 + cols).to(tl.int64), tl.load(ws + cols, mask=mask, cache_modifier=".cg"), mask=mask)


@triton.jit
def _all_reduce_ring(ctx, group_ptr, out_ptr, ws, ws2, ws_base, c0, width, tiles, pid, programs, me, stamp,
                     OP: tl.constexpr, G: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr,
                     MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                     WHAT: tl.constexpr):
    """Ring all-reduce of one staged chunk (my input is in `ws`, flag at `stamp`).

    Tiles are split into G segments (tile t in segment t % G). Reduce-scatter, steps
    k = 1..G-1: add my input to the predecessor's partial of segment me - k (its staged input
    for k = 1) into my `ws2`. I then hold segment me + 1 in full. All-gather, steps
    j = 1..G-1: copy the predecessor's full segment me - j + 1 into my `ws2` and output; before
    overwriting that slot, wait until the successor has read it (its step j).
    """
    lanes = tl.arange(0, BLOCK)
    pred = (me + G - 1) % G
    succ = (me + 1) % G
    for k in tl.static_range(1, G):
        start = global_timer()
        _wait_member(ctx, group_ptr, ws_base, pid, me, pred, stamp + k - 1, start, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS,
                     WHAT)
        tl.debug_barrier()
        segment = (me + G - k) % G
        for t in range(pid, tiles, programs):
            if t % G == segment:
                cols = t * BLOCK + lanes
                mask = cols < width
                if k == 1:
                    partial = ctx.load(ws + cols, from_rank=_rank(group_ptr, pred), mask=mask)
                else:
                    partial = ctx.load(ws2 + cols, from_rank=_rank(group_ptr, pred), mask=mask)
                mine = tl.load(ws + cols, mask=mask)
                tl.store(ws2 + cols, _combine(partial.to(ACC), mine.to(ACC), OP).to(ws.dtype.element_ty), mask=mask)
        _signal(ctx, group_ptr, ws_base, pid, me, stamp + k, G, MAX_PROGRAMS, WORLD)
    for t in range(pid, tiles, programs):  # my fully reduced segment
        if t % G == succ:
            cols = t * BLOCK + lanes
            mask = cols < width
            tl.store(out_ptr + (c0 + cols).to(tl.int64), tl.load(ws2 + cols, mask=mask), mask=mask)
    for j in tl.static_range(1, G):
        start = global_timer()
        _wait_member(ctx, group_ptr, ws_base, pid, me, pred, stamp + G - 2 + j, start, G, MAX_PROGRAMS, WORLD,
                     TIMEOUT_NS, WHAT)
        _wait_member(ctx, group_ptr, ws_base, pid, me, succ, stamp + j, start, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS,
                     WHAT)
        tl.debug_barrier()
        segment = (me + G - j + 1) % G
        for t in range(pid, tiles, programs):
            if t % G == segment:
                cols = t * BLOCK + lanes
                mask = cols < width
                value = ctx.load(ws2 + cols, from_rank=_rank(group_ptr, pred), mask=mask)
                tl.store(ws2 + cols, value, mask=mask)
                tl.store(out_ptr + (c0 + cols).to(tl.int64), value, mask=mask)
        _signal(ctx, group_ptr, ws_base, pid, me, stamp + G - 1 + j, G, MAX_PROGRAMS, WORLD)


@triton.jit
def _stage_tile(x_ptr, ws, m, c0, width, t, XB: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                VEC: tl.constexpr):
    """Copies tile t of my columns [c0, c0 + width) of every input block into my workspace."""
    cols = t * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    for b in tl.static_range(XB):
        value = tl.load(_vec(x_ptr, (b * m + c0 + cols).to(tl.int64), VEC), mask=mask)
        tl.store(_vec(ws, b * CHUNK + cols, VEC), value, mask=mask)


@triton.jit
def _stage(x_ptr, ws, m, c0, width, tiles, pid, programs, XB: tl.constexpr, CHUNK: tl.constexpr,
           BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Copies my columns [c0, c0 + width) of every input block into my workspace."""
    for t in range(pid, tiles, programs):
        _stage_tile(x_ptr, ws, m, c0, width, t, XB, CHUNK, BLOCK, VEC)


@triton.jit
def _pull(ctx, group_ptr, x_ptr, out_ptr, ws, ws2, heap_base, ws_base, m, c0, width, tiles, pid, programs, me,
          block_in, source, KIND: tl.constexpr, OP: tl.constexpr, VARIANT: tl.constexpr, G: tl.constexpr,
          ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, ZERO_COPY: tl.constexpr,
          MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr, VEC: tl.constexpr):
    """Reads what this rank needs from the members' inputs (table in the module doc)."""
    for t in range(pid, tiles, programs):
        _pull_tile(ctx, group_ptr, x_ptr, out_ptr, ws, ws2, heap_base, ws_base, m, c0, width, t, pid, me, block_in,
                   source, KIND, OP, VARIANT, G, ACC, BLOCK, CHUNK, ZERO_COPY, MAX_PROGRAMS, WORLD, VEC)


@triton.jit
def _pull_tile(ctx, group_ptr, x_ptr, out_ptr, ws, ws2, heap_base, ws_base, m, c0, width, t, pid, me, block_in,
               source, KIND: tl.constexpr, OP: tl.constexpr, VARIANT: tl.constexpr, G: tl.constexpr,
               ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, ZERO_COPY: tl.constexpr,
               MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr, VEC: tl.constexpr):
    """_pull's work on tile t."""
    lanes = tl.arange(0, BLOCK)
    cols = t * BLOCK + lanes
    mask = cols < width
    if KIND == 0 or KIND == 2:  # ALL_REDUCE (one-shot; two-shot: owned tiles), REDUCE_SCATTER
        mine = t % G == me
        if VARIANT != 1 or KIND == 2:
            mine = t >= 0
        if mine:
            src = _source(ctx, ws, heap_base, x_ptr, ws_base, pid, 0, block_in, m, c0, cols, ZERO_COPY, CHUNK,
                          MAX_PROGRAMS, WORLD)
            acc = _get(ctx, src, _rank(group_ptr, 0), mask, VEC).to(ACC)
            for i in tl.static_range(1, G):
                src = _source(ctx, ws, heap_base, x_ptr, ws_base, pid, i, block_in, m, c0, cols, ZERO_COPY,
                              CHUNK, MAX_PROGRAMS, WORLD)
                value = _get(ctx, src, _rank(group_ptr, i), mask, VEC)
                acc = _combine(acc, value.to(ACC), OP)
            result = acc.to(out_ptr.dtype.element_ty)
            tl.store(_vec(out_ptr, (c0 + cols).to(tl.int64), VEC), result, mask=mask)
            if VARIANT == 1:
                tl.store(_vec(ws2, cols, VEC), result, mask=mask)  # two-shot: the owners' results
    elif KIND == 1 or KIND == 3:  # ALL_GATHER, ALL_TO_ALL
        for i in tl.static_range(G):
            src = _source(ctx, ws, heap_base, x_ptr, ws_base, pid, i, block_in, m, c0, cols, ZERO_COPY, CHUNK,
                          MAX_PROGRAMS, WORLD)
            value = _get(ctx, src, _rank(group_ptr, i), mask, VEC)
            tl.store(_vec(out_ptr, (i * m + c0 + cols).to(tl.int64), VEC), value, mask=mask)
    else:  # PPERMUTE, BROADCAST
        if source >= 0:
            src = _source(ctx, ws, heap_base, x_ptr, ws_base, pid, source, block_in, m, c0, cols, ZERO_COPY,
                          CHUNK, MAX_PROGRAMS, WORLD)
            value = _get(ctx, src, _rank(group_ptr, source), mask, VEC)
        else:
            value = tl.zeros([BLOCK], out_ptr.dtype.element_ty)
        tl.store(_vec(out_ptr, (c0 + cols).to(tl.int64), VEC), value, mask=mask)


@triton.jit
def _slot(sender, receiver):
    """The slot of `sender`'s data in `receiver`'s push buffer: the members in order, the
    receiver left out (it reads its own input)."""
    return sender - (sender > receiver).to(tl.int32)


@triton.jit
def _push_tile(ctx, group_ptr, x_ptr, ws, m, c0, width, t, me, KIND: tl.constexpr, G: tl.constexpr,
               XB: tl.constexpr, SOURCES: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr,
               VEC: tl.constexpr):
    """Push mode, sending: stores tile t of what each peer needs from my input (block i for
    member i when XB > 1, else my whole input; PPERMUTE/BROADCAST: only to members whose
    source I am) into my slot of that peer's buffer `ws`."""
    cols = t * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    if XB == 1:
        value = tl.load(_vec(x_ptr, (c0 + cols).to(tl.int64), VEC), mask=mask)
    for i in tl.static_range(G):
        wanted = i != me
        if KIND == 4 or KIND == 5:  # PPERMUTE, BROADCAST
            wanted = wanted & (SOURCES[i] == me)
        if wanted:
            if XB > 1:
                value = tl.load(_vec(x_ptr, (i * m + c0 + cols).to(tl.int64), VEC), mask=mask)
            dst = _vec(ws, _slot(me, i) * CHUNK + cols, VEC)
            if VEC > 1:
                ctx.store(dst, value, to_rank=_rank(group_ptr, i), mask=mask, hint=16)
            else:
                ctx.store(dst, value, to_rank=_rank(group_ptr, i), mask=mask)


@triton.jit
def _received(x_ptr, ws, m, c0, cols, mask, me, member, block_in, CHUNK: tl.constexpr, VEC: tl.constexpr):
    """Push mode, receiving: `cols` of what `member` sent me (its slot of my buffer), or of
    my own input block `block_in` when that member is me."""
    if member == me:
        return tl.load(_vec(x_ptr, (block_in * m + c0 + cols).to(tl.int64), VEC), mask=mask)
    else:
        return tl.load(_vec(ws, _slot(member, me) * CHUNK + cols, VEC), mask=mask)


@triton.jit
def _take_tile(x_ptr, out_ptr, ws, m, c0, width, t, me, block_in, source, KIND: tl.constexpr, OP: tl.constexpr,
               G: tl.constexpr, ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr):
    """Push mode, _pull_tile's twin: tile t of the output from my own buffer (local reads)."""
    cols = t * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    if KIND == 0 or KIND == 2:  # ALL_REDUCE (one-shot), REDUCE_SCATTER: members in order
        acc = _received(x_ptr, ws, m, c0, cols, mask, me, 0, block_in, CHUNK, VEC).to(ACC)
        for i in tl.static_range(1, G):
            acc = _combine(acc, _received(x_ptr, ws, m, c0, cols, mask, me, i, block_in, CHUNK, VEC).to(ACC), OP)
        tl.store(_vec(out_ptr, (c0 + cols).to(tl.int64), VEC), acc.to(out_ptr.dtype.element_ty), mask=mask)
    elif KIND == 1 or KIND == 3:  # ALL_GATHER, ALL_TO_ALL
        for i in tl.static_range(G):
            value = _received(x_ptr, ws, m, c0, cols, mask, me, i, block_in, CHUNK, VEC)
            tl.store(_vec(out_ptr, (i * m + c0 + cols).to(tl.int64), VEC), value, mask=mask)
    else:  # PPERMUTE, BROADCAST (one input block)
        value = tl.zeros([BLOCK], out_ptr.dtype.element_ty)
        if source == me:
            value = tl.load(_vec(x_ptr, (c0 + cols).to(tl.int64), VEC), mask=mask)
        elif source >= 0:
            value = tl.load(_vec(ws, _slot(source, me) * CHUNK + cols, VEC), mask=mask)
        tl.store(_vec(out_ptr, (c0 + cols).to(tl.int64), VEC), value, mask=mask)


@triton.jit
def _two_shot_gather(ctx, group_ptr, out_ptr, ws2, c0, width, tiles, pid, programs, me, G: tl.constexpr,
                     BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Two-shot, second half: every tile I do not own comes from its owner's `ws2`."""
    lanes = tl.arange(0, BLOCK)
    for t in range(pid, tiles, programs):
        owner = t % G
        if owner != me:
            cols = t * BLOCK + lanes
            mask = cols < width
            value = _get(ctx, ws2 + cols, _rank(group_ptr, owner), mask, VEC)
            tl.store(_vec(out_ptr, (c0 + cols).to(tl.int64), VEC), value, mask=mask)


@triton.jit
def _width(m, c0, CHUNK: tl.constexpr, VEC: tl.constexpr):
    """Columns of the chunk at c0 (a multiple of VEC, said so that masks hold for whole vectors)."""
    return tl.minimum(m - c0, CHUNK) // VEC * VEC


@triton.jit
def _buffer(ws_base, epoch, OFFSET: tl.constexpr, DATA_BYTES: tl.constexpr, ptr_type: tl.constexpr):
    """The data (OFFSET = DATA) or data2 buffer of `epoch`'s parity."""
    return tl.cast(ws_base + OFFSET + (epoch % 2).to(tl.uint64) * DATA_BYTES, ptr_type)


@triton.jit
def _pipelined(ctx, group_ptr, x_ptr, out_ptr, heap_base, ws_base, m, pid, programs, me, epoch, in_place, block_in,
               source, KIND: tl.constexpr, OP: tl.constexpr, G: tl.constexpr, XB: tl.constexpr, SOURCES: tl.constexpr,
               ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, DATA: tl.constexpr,
               DATA_BYTES: tl.constexpr, MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr,
               TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr, ZERO_COPY: tl.constexpr, VEC: tl.constexpr,
               PUSH: tl.constexpr):
    """One-shot all-reduce and every other kind, chunk c at epoch + 1 + c, with chunk c + 1
    sent in the same tile loop that receives chunk c, so the two overlap.

    Pull mode: chunk c + 1 is staged into my buffer (a local copy) and members read it over
    the link. Push mode (PUSH): chunk c + 1 goes straight into my slot of each receiver's
    buffer (remote stores), and chunk c is read from my own buffer (local reads): no staging
    copy, and with traffic both ways the link moves stores faster than loads (RESULTS.md, "session 5").

    Chunk c + 1 is announced (its stamp) only after chunk c was received: a member's flag for
    chunk c + 1 therefore also says that it is done with chunk c - 1, whose buffer (same
    parity) chunk c + 2 is written into (mine in pull mode, the member's in push mode).
    Returns the last chunk's epoch."""
    chunks = tl.cdiv(m, CHUNK)
    transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, 0, 0)  # chunk 0's span: from staging
    first = _width(m, 0, CHUNK, VEC)
    if PUSH:
        for t in range(pid, tl.cdiv(first, BLOCK), programs):
            _push_tile(ctx, group_ptr, x_ptr, _buffer(ws_base, epoch + 1, DATA, DATA_BYTES, x_ptr.dtype), m, 0, first,
                       t, me, KIND, G, XB, SOURCES, BLOCK, CHUNK, VEC)
    elif not in_place:
        _stage(x_ptr, _buffer(ws_base, epoch + 1, DATA, DATA_BYTES, x_ptr.dtype), m, 0, first,
               tl.cdiv(first, BLOCK), pid, programs, XB, CHUNK, BLOCK, VEC)
    _signal(ctx, group_ptr, ws_base, pid, me, (epoch + 1) * STEPS, G, MAX_PROGRAMS, WORLD)
    for c in range(0, chunks):
        e = epoch + 1 + c
        c0 = c * CHUNK
        width = _width(m, c0, CHUNK, VEC)
        tiles = tl.cdiv(width, BLOCK)
        more = c + 1 < chunks
        next_width = tl.where(more, _width(m, tl.minimum(c0 + CHUNK, m), CHUNK, VEC), 0)
        next_tiles = tl.where(in_place, 0, tl.cdiv(next_width, BLOCK))
        ws = _buffer(ws_base, e, DATA, DATA_BYTES, x_ptr.dtype)
        ws_next = _buffer(ws_base, e + 1, DATA, DATA_BYTES, x_ptr.dtype)
        if c > 0:  # chunk c's span: its wait, its reads (alongside sending c + 1), the next signal
            transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, c, 0)
        _wait(ctx, group_ptr, ws_base, pid, me, e * STEPS, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
        for t in range(pid, tl.maximum(tiles, next_tiles), programs):
            if t < next_tiles:
                if PUSH:
                    _push_tile(ctx, group_ptr, x_ptr, ws_next, m, c0 + CHUNK, next_width, t, me, KIND, G, XB, SOURCES,
                               BLOCK, CHUNK, VEC)
                else:
                    _stage_tile(x_ptr, ws_next, m, c0 + CHUNK, next_width, t, XB, CHUNK, BLOCK, VEC)
            if t < tiles:
                if PUSH:
                    _take_tile(x_ptr, out_ptr, ws, m, c0, width, t, me, block_in, source, KIND, OP, G, ACC, BLOCK,
                               CHUNK, VEC)
                else:
                    _pull_tile(ctx, group_ptr, x_ptr, out_ptr, ws, ws, heap_base, ws_base, m, c0, width, t, pid, me,
                               block_in, source, KIND, OP, 0, G, ACC, BLOCK, CHUNK, ZERO_COPY, MAX_PROGRAMS, WORLD,
                               VEC)
        if more:
            _signal(ctx, group_ptr, ws_base, pid, me, (e + 1) * STEPS, G, MAX_PROGRAMS, WORLD)
        ctx.tracing.record_event_end(transfer)
    return epoch + chunks


@triton.jit
def _streamed(ctx, group_ptr, x_ptr, out_ptr, ws_base, m, pid, programs, me, block_in, source, KIND: tl.constexpr,
              OP: tl.constexpr, G: tl.constexpr, XB: tl.constexpr, SOURCES: tl.constexpr, ACC: tl.constexpr,
              BLOCK: tl.constexpr, CHUNK: tl.constexpr, STREAM_BYTES: tl.constexpr, STREAM_AT: tl.constexpr,
              SENDERS: tl.constexpr, MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr, TIMEOUT_NS: tl.constexpr,
              WHAT: tl.constexpr, VEC: tl.constexpr):
    """Streamed push of a one-chunk call (m <= CHUNK) of a kind in which every member sends
    to every other (all-reduce one-shot, all-gather, reduce-scatter, all-to-all).

    Programs 0..SENDERS-1 send: each stores its tiles into my slot of every
    receiver's streamed buffer and raises the tile's flag there. They never wait. The others
    receive: each waits for its tiles' flags from every member and makes its output
    tiles from its own buffer (local reads) while the senders are still sending. Nothing
    waits for a whole chunk: the local work overlaps the transfer tile by tile, and no round
    leaves the link idle.

    Senders and receivers are different programs, whose epochs (per program) need not agree,
    so tiles carry their own count: the k-th delivery of tile t (k = 1 + my `sent`/`got`
    count of t, equal on every rank: SPMD) goes into buffer k % 2 and sets flag [t][me] to k.
    Reuse: a rank writes delivery k of tile t into a member's buffer k % 2 only after its
    call of delivery k - 1 ended, in which it waited for the member's delivery k - 1, sent
    after the member's call of delivery k - 2 (which consumed it) had ended (stream order).
    The region is the streamed calls' own, so other modes' calls cannot collide with it.
    Traced, each program's share is a `transfer` span; a receiver's wait for a tile a `wait`."""
    region = ws_base + STREAM_AT
    T: tl.constexpr = STREAM_BYTES // 256
    failed = tl.cast(region, tl.pointer_type(tl.int64))
    sdata = region + LINE
    tile_flags = tl.cast(sdata + 2 * STREAM_BYTES, tl.pointer_type(tl.int32))
    sent = tile_flags + T
    got = sent + T
    gave_up = tl.load(failed, volatile=True)  # 1 + the rank that gave up on an earlier call, or 0
    if gave_up != 0:
        peer_failed(WHAT, gave_up.to(tl.int32) - 1)
    width = _width(m, 0, CHUNK, VEC)
    tiles = tl.cdiv(width, BLOCK)
    senders = SENDERS
    transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, 0, 0)  # each program's share
    if pid < senders:
        for t in range(pid, tiles, senders):
            k = tl.load(sent + t) + 1
            ws = tl.cast(sdata + (k % 2).to(tl.uint64) * STREAM_BYTES, x_ptr.dtype)
            _push_tile(ctx, group_ptr, x_ptr, ws, m, 0, width, t, me, KIND, G, XB, SOURCES, BLOCK, CHUNK, VEC)
            tl.debug_barrier()  # every thread's stores precede the release
            for i in tl.static_range(G):
                if i != me:
                    flags.set_flag(ctx, tile_flags + t * G + me, k, _rank(group_ptr, i))
            tl.store(sent + t, k)
    else:
        start = global_timer()
        for t in range(pid - senders, tiles, programs - senders):
            k = tl.load(got + t) + 1
            wait = ctx.tracing.record_event_start(EVENT_WAIT, ctx.rank, None, t, 0)  # pid_m: the tile
            for i in tl.static_range(G):
                if i != me:
                    if flags.timed_out(flags.wait(tile_flags + t * G + i, k, start, TIMEOUT_NS)):
                        for j in tl.static_range(G):  # later calls of this group fail at once
                            ctx.store(failed, (_rank(group_ptr, me) + 1).to(tl.int64), to_rank=_rank(group_ptr, j))
                        _give_up(ctx, group_ptr, ws_base, pid, me, _rank(group_ptr, i), G, MAX_PROGRAMS, WORLD, WHAT)
            tl.debug_barrier()  # every thread's reads follow the acquires
            ctx.tracing.record_event_end(wait)
            ws = tl.cast(sdata + (k % 2).to(tl.uint64) * STREAM_BYTES, x_ptr.dtype)
            _take_tile(x_ptr, out_ptr, ws, m, 0, width, t, me, block_in, source, KIND, OP, G, ACC, BLOCK, CHUNK, VEC)
            tl.debug_barrier()  # every thread has read the count before it changes
            tl.store(got + t, k)
    ctx.tracing.record_event_end(transfer)


@triton.jit
def collective_kernel(context_ptr, group_ptr, x_ptr, m, out_ptr,
                      KIND: tl.constexpr, OP: tl.constexpr, VARIANT: tl.constexpr, G: tl.constexpr,
                      WORLD: tl.constexpr, XB: tl.constexpr, OB: tl.constexpr, SOURCES: tl.constexpr,
                      ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, DATA: tl.constexpr,
                      DATA2: tl.constexpr, DATA_BYTES: tl.constexpr,
                      MAX_PROGRAMS: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr,
                      ZERO_COPY: tl.constexpr = False, HEAP_BYTES: tl.constexpr = 0, VEC: tl.constexpr = 1,
                      TRACING: tl.constexpr = False, PUSH: tl.constexpr = False, STREAM: tl.constexpr = False,
                      STREAM_AT: tl.constexpr = 0, STREAM_BYTES: tl.constexpr = 0, SENDERS: tl.constexpr = 1):
    """See the module docstring. `m` is the column count; SOURCES[i] is member i's source
    (PPERMUTE/BROADCAST; -1: none, output zeros); STREAM: the streamed push of a one-chunk
    call (_streamed; STREAM_AT, STREAM_BYTES: the workspace's streamed region and its buffer
    size, SENDERS: its sending programs); VEC > 1: m is a multiple of VEC, the elements of 16
    bytes (tiles are then accessed in 16-byte vectors). With TRACING, each chunk's exchange is
    a `transfer` span (pid_m: the chunk) holding `wait` spans and the Context's own RMA events."""
    ctx = Context.initialize(context_ptr, WORLD, tracing=TRACING)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    me = tl.load(group_ptr)
    m = m // VEC * VEC  # m is a multiple of VEC: said so the compiler knows (tl.multiple_of does not reach masks)
    heap_base = tl.load(ctx.heap_bases + ctx.rank)
    ws_base = heap_base + _workspace_offset(group_ptr, G)
    in_place = False
    if ZERO_COPY:  # is my whole input on my heap?
        x_at = tl.cast(x_ptr, tl.uint64)
        x_end = x_at + (XB * m).to(tl.uint64) * (x_ptr.dtype.element_ty.primitive_bitwidth // 8)
        in_place = (x_at >= heap_base) & (x_end <= heap_base + HEAP_BYTES)
        _publish(ctx, group_ptr, ws_base, pid, me, tl.where(in_place, (x_at - heap_base).to(tl.int64), -1), G,
                 MAX_PROGRAMS, WORLD)
    epoch_ptr = tl.cast(ws_base + pid * LINE, tl.pointer_type(tl.int64))
    epoch = flags.read_epoch(epoch_ptr)
    source = tl.full((), -1, tl.int32)
    for i in tl.static_range(G):
        source = tl.where(me == i, SOURCES[i], source)
    block_in = me * 0  # a tensor in both cases (an int here broke push-mode ppermute's compile)
    if XB > 1:
        block_in = me
    if STREAM:  # one chunk, streamed tile by tile in its own region (epochs unchanged, see _streamed)
        _streamed(ctx, group_ptr, x_ptr, out_ptr, ws_base, m, pid, programs, me, block_in, source, KIND, OP, G, XB,
                  SOURCES, ACC, BLOCK, CHUNK, STREAM_BYTES, STREAM_AT, SENDERS, MAX_PROGRAMS, WORLD, TIMEOUT_NS,
                  WHAT, VEC)
    elif KIND != 0 or VARIANT == 0:  # every kind that only pulls (incl. one-shot all-reduce)
        epoch = _pipelined(ctx, group_ptr, x_ptr, out_ptr, heap_base, ws_base, m, pid, programs, me, epoch, in_place,
                           block_in, source, KIND, OP, G, XB, SOURCES, ACC, BLOCK, CHUNK, DATA, DATA_BYTES,
                           MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT, ZERO_COPY, VEC, PUSH)
    else:  # two-shot, atomic, spinlock, ring: one chunk after the other
        for c0 in range(0, m, CHUNK):
            width = _width(m, c0, CHUNK, VEC)
            tiles = tl.cdiv(width, BLOCK)
            epoch += 1
            stamp = epoch * STEPS  # flag values: STEPS slots per chunk, one per round trip
            ws = _buffer(ws_base, epoch, DATA, DATA_BYTES, x_ptr.dtype)
            ws2 = _buffer(ws_base, epoch, DATA2, DATA_BYTES, x_ptr.dtype)
            transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, ctx.rank, None, c0 // CHUNK, 0)
            if VARIANT == 2 or VARIANT == 3:  # atomic, spinlock
                locks = _buffer(ws_base, epoch, DATA2, DATA_BYTES, tl.pointer_type(tl.int32))
                _all_reduce_push(ctx, group_ptr, x_ptr, out_ptr, ws, locks, ws_base, c0, m, width, tiles, pid,
                                 programs, me, stamp, VARIANT == 3, G, ACC, BLOCK, MAX_PROGRAMS, WORLD, TIMEOUT_NS,
                                 WHAT)
            else:
                if not in_place:
                    _stage(x_ptr, ws, m, c0, width, tiles, pid, programs, XB, CHUNK, BLOCK, VEC)
                _signal(ctx, group_ptr, ws_base, pid, me, stamp, G, MAX_PROGRAMS, WORLD)
                if VARIANT == 4:
                    _all_reduce_ring(ctx, group_ptr, out_ptr, ws, ws2, ws_base, c0, width, tiles, pid, programs, me,
                                     stamp, OP, G, ACC, BLOCK, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
                else:  # two-shot: reduce the tiles I own, then gather the others' from their owners
                    _wait(ctx, group_ptr, ws_base, pid, me, stamp, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
                    _pull(ctx, group_ptr, x_ptr, out_ptr, ws, ws2, heap_base, ws_base, m, c0, width, tiles, pid,
                          programs, me, block_in, source, KIND, OP, VARIANT, G, ACC, BLOCK, CHUNK, ZERO_COPY,
                          MAX_PROGRAMS, WORLD, VEC)
                    _signal(ctx, group_ptr, ws_base, pid, me, stamp + 1, G, MAX_PROGRAMS, WORLD)
                    _wait(ctx, group_ptr, ws_base, pid, me, stamp + 1, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
                    _two_shot_gather(ctx, group_ptr, out_ptr, ws2, c0, width, tiles, pid, programs, me, G, BLOCK,
                                     VEC)
            ctx.tracing.record_event_end(transfer)
    if ZERO_COPY:  # nobody returns (and lets its input change) while a member may still read it
        _signal(ctx, group_ptr, ws_base, pid, me, epoch * STEPS + DONE, G, MAX_PROGRAMS, WORLD)
        _wait(ctx, group_ptr, ws_base, pid, me, epoch * STEPS + DONE, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
    flags.write_epoch(epoch_ptr, epoch)
