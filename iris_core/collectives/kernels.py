"""One persistent kernel for every whole-array collective: stage, signal, wait, gather.

The kernel's second argument is the group row (iris_core.collectives.group); the workspace
layout is iris_core.collectives.workspace; what each kind reads from each member is the
table in iris_core.collectives.kinds.

Each rank stages its input into its workspace buffer, signals every peer of its group,
waits for their signals, then reads what it needs from the peers' workspaces (pulls).
Inputs are viewed as [XB, m] and outputs as [OB, m]. Program k owns the column tiles
j = k, k + P, ... of every block, both when staging and when reading, and waits only for
program k of its peers: correct with every program resident (GPU) and with programs run
one after another (the simulator). Columns are processed in chunks that fit the workspace.

Where each path lives:
    pipelined.py   every kind but the all-reduce algorithms below: the shared tile loop,
                   chunk c + 1 sent while chunk c is received; pull or push (PUSH: each rank
                   stores what member i needs into its slot of member i's buffer, and every
                   rank reads its own buffer locally)
    streamed.py    one-chunk calls of the kinds in which every member sends to every other
                   (STREAM): half the programs push tiles, the other half make the output tile
                   by tile as the tiles arrive
    two_shot.py, ring.py, atomic.py (atomic and spinlock): all-reduce algorithms, one chunk
                   after the other (the loop below)
    tiles.py       the steps on one tile that they share: stage, push, a member's contribution,
                   combined or copied into the output
    group.py       the members, their flags and the bounded waits

Zero-copy (ZERO_COPY, large arrays; not ring/atomic/spinlock): a rank whose input lies on
its heap skips staging and publishes the input's heap offset to every member (word 1 of its
flag line there, -1 otherwise), once per call; members read that input in place. Since a
peer may then read my input until its last chunk, the call ends with one more round ("done")
before any rank returns. Every rank decides for itself; mixed groups work.

Peers' workspaces are read with plain loads: every read follows an acquire of the peer's
flag and a CTA barrier (iris_core.device.flags), which order it after the peer's writes, so
the much slower `.cg` loads (L2 only) are not needed.

Adding a collective: a row in kinds.py's table, its step in tiles.output_tile (what a member
contributes and where it goes), and its wrapper in iris_jax.collectives.lowering.
"""

import triton
import triton.language as tl

from iris_core.collectives import atomic, kinds, pipelined, ring, streamed, two_shot, workspace
from iris_core.collectives.group import Group
from iris_core.collectives.kinds import (  # noqa: F401 - the host's names for the launch parameters
    ALL_GATHER,
    ALL_REDUCE,
    ALL_TO_ALL,
    ATOMIC,
    BROADCAST,
    MAX,
    MIN,
    ONE_SHOT,
    PPERMUTE,
    REDUCE_SCATTER,
    RING,
    SPINLOCK,
    SUM,
    TWO_SHOT,
)
from iris_core.collectives.tiles import Call, buffer, stage
from iris_core.device import Context, flags
from iris_core.device.faults import signature
from iris_core.device.flags import DONE
from iris_core.device.tracing import EVENT_TRANSFER
from iris_core.launch import kernel_constants


@triton.jit
def _one_chunk_at_a_time(g, c, epoch, in_place, VARIANT: tl.constexpr, DATA: tl.constexpr, DATA2: tl.constexpr,
                         DATA_BYTES: tl.constexpr):
    """The all-reduce algorithms of their own modules, chunk after chunk; returns the last epoch."""
    for c0 in range(0, c.m, c.CHUNK):
        width = c.width(c0)
        tiles = tl.cdiv(width, c.BLOCK)
        epoch += 1
        stamp = flags.stamp(epoch)  # the chunk's rounds: stamp, stamp + 1, ...
        ws = buffer(g.ws_base, epoch, DATA, DATA_BYTES, c.x_ptr.dtype)
        ws2 = buffer(g.ws_base, epoch, DATA2, DATA_BYTES, c.x_ptr.dtype)
        transfer = g.ctx.tracing.record_event_start(EVENT_TRANSFER, g.ctx.rank, None, c0 // c.CHUNK, 0)
        # partial results are kept in the accumulator's type: each element is rounded once, at the end
        if VARIANT == kinds.ATOMIC or VARIANT == kinds.SPINLOCK:
            locks = buffer(g.ws_base, epoch, DATA2, DATA_BYTES, tl.pointer_type(tl.int32))
            atomic.all_reduce(g, c, tl.cast(ws, tl.pointer_type(c.ACC)), locks, c0, width, tiles, stamp,
                              VARIANT == kinds.SPINLOCK)
        else:
            if not in_place:
                stage(g, c, ws, c0, width, tiles)
            g.signal(stamp)
            if VARIANT == kinds.RING:
                ring.all_reduce(g, c, ws, tl.cast(ws2, tl.pointer_type(c.ACC)), c0, width, tiles, stamp)
            else:
                tl.static_assert(VARIANT == kinds.TWO_SHOT, "an all-reduce algorithm without its branch here")
                two_shot.all_reduce(g, c, ws, ws2, c0, width, tiles, stamp)
        g.ctx.tracing.record_event_end(transfer)
    return epoch


@triton.jit
def collective_kernel(context_ptr, group_ptr, x_ptr, m, out_ptr,
                      KIND: tl.constexpr, OP: tl.constexpr, VARIANT: tl.constexpr, G: tl.constexpr,
                      WORLD: tl.constexpr, XB: tl.constexpr, OB: tl.constexpr, SOURCES: tl.constexpr,
                      ACC: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr, REGIONS: tl.constexpr,
                      MAX_PROGRAMS: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr,
                      ZERO_COPY: tl.constexpr = False, HEAP_BYTES: tl.constexpr = 0, VEC: tl.constexpr = 1,
                      TRACING: tl.constexpr = False, PUSH: tl.constexpr = False, STREAM: tl.constexpr = False,
                      SENDERS: tl.constexpr = 1):
    """See the module docstring. `m` is the column count; SOURCES[i] is member i's source
    (PPERMUTE/BROADCAST; -1: none, output zeros); STREAM: the streamed push of a one-chunk
    call (REGIONS.stream, .stream_bytes: the workspace's streamed region and its buffer size,
    SENDERS: its sending programs); VEC > 1: m is a multiple of VEC, the elements of 16
    bytes (tiles are then accessed in 16-byte vectors). With TRACING, each chunk's exchange is
    a `transfer` span (pid_m: the chunk) holding `wait` spans and the Context's own RMA events."""
    DATA: tl.constexpr = REGIONS.data  # the workspace's buffers (iris_core.collectives.workspace.Regions)
    DATA2: tl.constexpr = REGIONS.data2
    DATA_BYTES: tl.constexpr = REGIONS.data_bytes
    STREAM_AT: tl.constexpr = REGIONS.stream
    STREAM_BYTES: tl.constexpr = REGIONS.stream_bytes
    ctx = Context.initialize(context_ptr, WORLD, tracing=TRACING)
    sig = signature(KIND, OP, VARIANT, x_ptr.dtype.element_ty, XB, m)
    g = Group.initialize(ctx, group_ptr, sig, G, MAX_PROGRAMS, TIMEOUT_NS, WHAT)
    m = m // VEC * VEC  # m is a multiple of VEC: said so the compiler knows (tl.multiple_of does not reach masks)
    heap_base = tl.load(ctx.heap_bases + ctx.rank)
    in_place = False
    if ZERO_COPY:  # is my whole input on my heap?
        x_at = tl.cast(x_ptr, tl.uint64)
        x_end = x_at + (XB * m).to(tl.uint64) * (x_ptr.dtype.element_ty.primitive_bitwidth // 8)
        in_place = (x_at >= heap_base) & (x_end <= heap_base + HEAP_BYTES)
        g.publish(tl.where(in_place, (x_at - heap_base).to(tl.int64), -1))
    epoch_ptr = g.epoch_ptr()
    epoch = flags.read_epoch(epoch_ptr)
    source = tl.full((), -1, tl.int32)
    for i in tl.static_range(G):
        source = tl.where(g.me == i, SOURCES[i], source)
    block_in = g.me * 0  # a tensor in both cases (an int here broke push-mode ppermute's compile)
    if XB > 1:
        block_in = g.me
    c = Call(x_ptr, out_ptr, m, heap_base, block_in, source, KIND, OP, XB, SOURCES, ACC, BLOCK, CHUNK, VEC, ZERO_COPY)
    if STREAM:  # one chunk, streamed tile by tile in its own region (epochs unchanged, see streamed.py)
        streamed.run(g, c, STREAM_BYTES, STREAM_AT, SENDERS)
    elif kinds.pipelined(KIND, VARIANT):
        epoch = pipelined.run(g, c, epoch, in_place, DATA, DATA_BYTES, PUSH)
    else:
        epoch = _one_chunk_at_a_time(g, c, epoch, in_place, VARIANT, DATA, DATA2, DATA_BYTES)
    if ZERO_COPY:  # nobody returns (and lets its input change) while a member may still read it
        g.signal(flags.stamp(epoch, DONE))
        g.wait(flags.stamp(epoch, DONE))
    g.end_call(epoch)


def launch_constants(**given) -> dict:
    """collective_kernel's constexprs, every one by name (iris_core.launch.kernel_constants):
    `given`, MAX_PROGRAMS, and the kernel's own default for each other one. The launch
    (iris_jax.collectives.lowering) and the PTX benchmarks and tests build theirs here."""
    return kernel_constants(collective_kernel, **{"MAX_PROGRAMS": workspace.MAX_PROGRAMS, **given})
