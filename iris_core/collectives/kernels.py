"""One persistent kernel for every whole-array collective: stage, signal, wait, gather.

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
one after another (the simulator). Columns are processed in chunks that fit the workspace.
"""

import triton
import triton.language as tl

from iris_core.device import Context, global_timer
from iris_core.device.nvidia import peer_timeout

ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL, PPERMUTE, BROADCAST = range(6)
SUM, MAX, MIN = range(3)
ONE_SHOT, TWO_SHOT = range(2)
LINE: tl.constexpr = tl.constexpr(128)


@triton.jit
def _combine(acc, value, OP: tl.constexpr):
    if OP == 0:
        return acc + value
    elif OP == 1:
        return tl.maximum(acc, value)
    else:
        return tl.minimum(acc, value)


@triton.jit
def _flag(ws_base, PHASE: tl.constexpr, pid, member, MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr):
    """Pointer (in my heap) to the flag of `member` for program `pid` in `PHASE`."""
    line = MAX_PROGRAMS + (PHASE * MAX_PROGRAMS + pid) * WORLD + member
    return tl.cast(ws_base + line * LINE, tl.pointer_type(tl.int64))


@triton.jit
def _signal(ctx, group_ptr, ws_base, PHASE: tl.constexpr, pid, me, epoch, G: tl.constexpr,
            MAX_PROGRAMS: tl.constexpr, WORLD: tl.constexpr):
    tl.debug_barrier()  # every thread's staged stores precede the release
    flag = _flag(ws_base, PHASE, pid, ctx.rank, MAX_PROGRAMS, WORLD)  # my global rank's flag
    for i in tl.static_range(G):
        ctx.atomic_xchg(flag, epoch, to_rank=tl.load(group_ptr + 1 + i), sem="release", scope="sys")


@triton.jit
def _wait(group_ptr, ws_base, PHASE: tl.constexpr, pid, epoch, G: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
          WORLD: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    start = global_timer()
    for i in tl.static_range(G):
        flag = _flag(ws_base, PHASE, pid, tl.load(group_ptr + 1 + i), MAX_PROGRAMS, WORLD)
        seen = tl.load(flag, volatile=True)
        while seen < epoch:
            if global_timer() - start > TIMEOUT_NS:
                peer_timeout(WHAT, tl.load(group_ptr + 1 + i))
            seen = tl.load(flag, volatile=True)
        tl.atomic_add(flag, 0, sem="acquire", scope="sys")
    tl.debug_barrier()


@triton.jit
def collective_kernel(context_ptr, group_ptr, x_ptr, m, out_ptr,
                      KIND: tl.constexpr, OP: tl.constexpr, VARIANT: tl.constexpr, G: tl.constexpr,
                      WORLD: tl.constexpr, XB: tl.constexpr, OB: tl.constexpr, SOURCES: tl.constexpr,
                      ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, WS_OFFSET: tl.constexpr,
                      DATA: tl.constexpr, DATA2: tl.constexpr, DATA_BYTES: tl.constexpr,
                      MAX_PROGRAMS: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """See the module docstring. `m` is the column count; SOURCES[i] is member i's source
    (PPERMUTE/BROADCAST; -1: none, output zeros)."""
    ctx = Context.initialize(context_ptr, WORLD)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    me = tl.load(group_ptr)
    ws_base = tl.load(ctx.heap_bases + ctx.rank) + WS_OFFSET
    # The epoch lives in a register for the whole call: re-reading it through the (incoherent)
    # L1 in a later chunk could give threads of one program different epochs.
    epoch_ptr = tl.cast(ws_base + pid * LINE, tl.pointer_type(tl.int64))
    epoch = tl.load(epoch_ptr, volatile=True)
    source = tl.full((), -1, tl.int32)
    for i in tl.static_range(G):
        source = tl.where(me == i, SOURCES[i], source)
    block_in = 0
    if XB > 1:
        block_in = me
    lanes = tl.arange(0, BLOCK)
    for c0 in range(0, m, CHUNK):
        width = tl.minimum(m - c0, CHUNK)
        tiles = tl.cdiv(width, BLOCK)
        epoch += 1
        parity = (epoch % 2).to(tl.uint64)
        ws = tl.cast(ws_base + DATA + parity * DATA_BYTES, x_ptr.dtype)
        ws2 = tl.cast(ws_base + DATA2 + parity * DATA_BYTES, x_ptr.dtype)
        # 1. stage my columns of every input block into my workspace
        for t in range(pid, tiles, programs):
            cols = t * BLOCK + lanes
            mask = cols < width
            for b in tl.static_range(XB):
                value = tl.load(x_ptr + (b * m + c0 + cols).to(tl.int64), mask=mask)
                tl.store(ws + b * CHUNK + cols, value, mask=mask)
        _signal(ctx, group_ptr, ws_base, 0, pid, me, epoch, G, MAX_PROGRAMS, WORLD)
        _wait(group_ptr, ws_base, 0, pid, epoch, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
        # 2. read the peers' workspaces
        for t in range(pid, tiles, programs):
            cols = t * BLOCK + lanes
            mask = cols < width
            src = ws + block_in * CHUNK + cols
            dst = out_ptr + (c0 + cols).to(tl.int64)
            if KIND == 0 or KIND == 2:  # ALL_REDUCE, REDUCE_SCATTER
                if VARIANT == 0 or KIND == 2:
                    acc = ctx.load(src, from_rank=tl.load(group_ptr + 1), mask=mask, cache_modifier=".cg").to(ACC)
                    for i in tl.static_range(1, G):
                        value = ctx.load(src, from_rank=tl.load(group_ptr + 1 + i), mask=mask, cache_modifier=".cg")
                        acc = _combine(acc, value.to(ACC), OP)
                    tl.store(dst, acc.to(out_ptr.dtype.element_ty), mask=mask)
                elif t % G == me:  # two-shot, phase 1: reduce the tiles I own
                    acc = ctx.load(src, from_rank=tl.load(group_ptr + 1), mask=mask, cache_modifier=".cg").to(ACC)
                    for i in tl.static_range(1, G):
                        value = ctx.load(src, from_rank=tl.load(group_ptr + 1 + i), mask=mask, cache_modifier=".cg")
                        acc = _combine(acc, value.to(ACC), OP)
                    result = acc.to(out_ptr.dtype.element_ty)
                    tl.store(ws2 + cols, result, mask=mask)
                    tl.store(dst, result, mask=mask)
            elif KIND == 1 or KIND == 3:  # ALL_GATHER, ALL_TO_ALL
                for i in tl.static_range(G):
                    value = ctx.load(src, from_rank=tl.load(group_ptr + 1 + i), mask=mask, cache_modifier=".cg")
                    tl.store(dst + i * m, value, mask=mask)
            else:  # PPERMUTE, BROADCAST
                if source >= 0:
                    value = ctx.load(src, from_rank=tl.load(group_ptr + 1 + source), mask=mask, cache_modifier=".cg")
                else:
                    value = tl.zeros([BLOCK], out_ptr.dtype.element_ty)
                tl.store(dst, value, mask=mask)
        if KIND == 0 and VARIANT == 1:
            # two-shot, phase 2: fetch every other tile from the rank that reduced it
            _signal(ctx, group_ptr, ws_base, 1, pid, me, epoch, G, MAX_PROGRAMS, WORLD)
            _wait(group_ptr, ws_base, 1, pid, epoch, G, MAX_PROGRAMS, WORLD, TIMEOUT_NS, WHAT)
            for t in range(pid, tiles, programs):
                owner = t % G
                if owner != me:
                    cols = t * BLOCK + lanes
                    mask = cols < width
                    value = ctx.load(ws2 + cols, from_rank=tl.load(group_ptr + 1 + owner), mask=mask, cache_modifier=".cg")
                    tl.store(out_ptr + (c0 + cols).to(tl.int64), value, mask=mask)
    tl.debug_barrier()  # every thread is done with the epoch before it is published locally
    tl.store(epoch_ptr, epoch)
