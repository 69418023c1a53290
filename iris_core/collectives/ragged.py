"""ragged_all_to_all: slices of rows, of uneven and data-dependent sizes, between every pair.

lax's semantics: of the K = G x S slices a member describes (input offset, size, output
offset), slices i * S ... i * S + S - 1 go to member i: rows [input offset, + size) of the
member's operand land at rows [output offset, + size) of member i's output. Rows that nobody
writes keep the output's values: the kernel's output is its `output` operand, aliased.

How (one persistent kernel, pull mode, the group's flags and bounded waits):

* the sizes travel with the first flag round: before it, each of my programs stores the
  (input offset, size, output offset) of my slices for member i into its line of member i's
  slice table (data2, parity of the call's first epoch; [program][sender][slice][3] int64);
* the operand is staged window by window (ROWS rows that fit the data buffer; buffer parity:
  the window's epoch) and every member signals each window; a receiver then pulls, from each
  sender, the rows of its slices for me that fall in the window, straight into my output;
* program k stages window rows k, k + P, ..., reads only those of its peers (program k waits
  for program k), and reads the slice table its twins wrote. Zero-size slices cost nothing
  but the window's flag round; rows that fall outside the operand or the output are skipped.

Why the tables cannot be overwritten while read: a member writes the next call's table only
after its kernel for this call returned, i.e. after every program of mine signalled this
call's last window. When that signal came before my read (one window), the next call's first
epoch has the other parity; otherwise my read came before my second window's signal.
"""

import triton
import triton.language as tl

from iris_core.collectives import kinds, workspace
from iris_core.collectives.group import Group
from iris_core.collectives.tiles import get, vec
from iris_core.device import Context, flags
from iris_core.device.faults import signature
from iris_core.launch import kernel_constants, next_power_of_two


@triton.jit
def _table(g, ws2, SLICES: tl.constexpr, TABLE: tl.constexpr):
    """Pointers to my program's slice table lines [sender][slice] (TABLE >= G x SLICES, padded)
    in the buffer ws2 (int64), and the mask of real entries."""
    entry = tl.arange(0, TABLE)
    real = entry < g.G * SLICES
    return ws2 + (g.pid * g.G * SLICES + entry).to(tl.int64) * 3, real


@triton.jit
def _publish_slices(g, ws2, in_offsets, sizes, out_offsets, SLICES: tl.constexpr, SLICES_P2: tl.constexpr):
    """Stores my slices for member i into my line of member i's slice table."""
    s = tl.arange(0, SLICES_P2)
    real = s < SLICES
    for i in tl.static_range(g.G):
        mine = i * SLICES + s
        at = ws2 + ((g.pid * g.G + g.me) * SLICES + s).to(tl.int64) * 3
        rank = g.rank(i)
        g.ctx.store(at, tl.load(in_offsets + mine, mask=real).to(tl.int64), to_rank=rank, mask=real)
        g.ctx.store(at + 1, tl.load(sizes + mine, mask=real).to(tl.int64), to_rank=rank, mask=real)
        g.ctx.store(at + 2, tl.load(out_offsets + mine, mask=real).to(tl.int64), to_rank=rank, mask=real)


@triton.jit
def _entry(values, p):
    """Entry p of a small register tensor."""
    return tl.sum(tl.where(tl.arange(0, values.shape[0]) == p, values, 0), axis=0)


@triton.jit
def _copy_row(g, src, dst, sender, R, BLOCK: tl.constexpr, VEC: tl.constexpr):
    """Row `src` of `sender`'s window (pointers in my heap's view) into my output row `dst`."""
    for c0 in range(0, R, BLOCK):
        cols = c0 + tl.arange(0, BLOCK)
        mask = cols < R
        value = get(g.ctx, vec(src, cols, VEC), g.rank(sender), mask, VEC)
        tl.store(vec(dst, cols, VEC), value, mask=mask)


@triton.jit
def ragged_kernel(context_ptr, group_ptr, x_ptr, output_ptr, in_offsets, sizes, out_offsets, N, M, R, ROWS,
                  out_ptr, G: tl.constexpr, WORLD: tl.constexpr, SLICES: tl.constexpr,
                  SLICES_P2: tl.constexpr, TABLE: tl.constexpr, BLOCK: tl.constexpr, DATA: tl.constexpr,
                  DATA2: tl.constexpr, DATA_BYTES: tl.constexpr, MAX_PROGRAMS: tl.constexpr,
                  TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr, VEC: tl.constexpr = 1):
    """See the module docstring. x: the operand as [N, R]; out (aliased to `output_ptr`): the
    output as [M, R]; the offset and size vectors have G x SLICES entries; ROWS: rows per window."""
    ctx = Context.initialize(context_ptr, WORLD)
    sig = signature(kinds.RAGGED_ALL_TO_ALL, 0, 0, x_ptr.dtype.element_ty, SLICES, R)
    g = Group.initialize(ctx, group_ptr, sig, G, MAX_PROGRAMS, TIMEOUT_NS, WHAT)
    R = R // VEC * VEC  # R is a multiple of VEC: said so the compiler knows
    R64 = tl.full((), 0, tl.int64) + R  # row offsets in 64 bits
    epoch_ptr = g.epoch_ptr()
    epoch = flags.read_epoch(epoch_ptr)
    P = g.programs
    ws2 = tl.cast(g.ws_base + DATA2 + ((epoch + 1) % 2).to(tl.uint64) * DATA_BYTES, tl.pointer_type(tl.int64))
    _publish_slices(g, ws2, in_offsets, sizes, out_offsets, SLICES, SLICES_P2)
    table, real = _table(g, ws2, SLICES, TABLE)
    starts = tl.zeros([TABLE], tl.int64)
    counts = tl.zeros([TABLE], tl.int64)
    targets = tl.zeros([TABLE], tl.int64)
    windows = tl.cdiv(N, ROWS)
    for w in range(0, windows):
        e = epoch + 1 + w
        ws = tl.cast(g.ws_base + DATA + (e % 2).to(tl.uint64) * DATA_BYTES, x_ptr.dtype)
        r0 = w * ROWS
        rows = tl.minimum(ROWS, N - r0)
        for r in range(g.pid, rows, P):  # stage my rows of the window
            for c0 in range(0, R, BLOCK):
                cols = c0 + tl.arange(0, BLOCK)
                mask = cols < R
                src = vec(x_ptr, (r0 + r) * R64 + cols, VEC)
                tl.store(vec(ws, r * R64 + cols, VEC), tl.load(src, mask=mask), mask=mask)
        g.signal(flags.stamp(e))
        g.wait(flags.stamp(e))
        if w == 0:  # the members' slices for me, written before their first signal
            starts = tl.load(table, mask=real, other=0)
            counts = tl.load(table + 1, mask=real, other=0)
            targets = tl.load(table + 2, mask=real, other=0)
        for p in range(0, G * SLICES):
            sender = p // SLICES
            start = _entry(starts, p)
            lo = tl.maximum(tl.maximum(start, r0), 0)
            hi = tl.minimum(tl.minimum(start + _entry(counts, p), r0 + rows), N)
            shift = _entry(targets, p) - start  # output row = input row + shift
            lo = tl.maximum(lo, -shift)  # rows that land outside my output are skipped
            hi = tl.minimum(hi, M - shift)
            first = lo + (g.pid - (lo - r0) % P + P) % P  # my program's first row at or after lo
            for row in range(first, hi, P):
                _copy_row(g, ws + (row - r0) * R64, out_ptr + (row + shift) * R64, sender, R, BLOCK, VEC)
    g.end_call(epoch + windows)


def launch_constants(*, G: int, world: int, slices: int, block: int, layout: workspace.WorkspaceLayout,
                     timeout_ns: int, vec: int, what: str = "ragged_all_to_all") -> dict:
    """ragged_kernel's constexprs for a group of G members exchanging `slices` slices each, rows
    moved in tiles of `block` elements and vectors of `vec`, through the collectives' workspace
    `layout`: what the ragged_all_to_all rule launches and benchmarks/kernel_ptx.py compiles."""
    return kernel_constants(ragged_kernel, G=G, WORLD=world, SLICES=slices, SLICES_P2=next_power_of_two(slices),
                            TABLE=next_power_of_two(G * slices), BLOCK=block, DATA=layout.data, DATA2=layout.data2,
                            DATA_BYTES=layout.data_bytes, MAX_PROGRAMS=workspace.MAX_PROGRAMS, TIMEOUT_NS=timeout_ns,
                            WHAT=what, VEC=vec)
