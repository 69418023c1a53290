"""What one program does to one tile of a chunk: stage it, push it, or make its output.

`Call` holds the operands and their layout: the input viewed as [XB, m] blocks, the output as
[OB, m], the kind (iris_core.collectives.kinds), how to combine (OP, in ACC), the tiling
(BLOCK-element tiles of CHUNK-element chunks, VEC-element vectors) and the paths (ZERO_COPY).

A member's contribution to a tile is read one of two ways, and every kind is written once
on top of it (`output_tile`): pulled (the member staged it in its workspace, or publishes its
input in place, and I read it over the link) or pushed (the member stored it into its slot
of my buffer, and I read it locally; my own comes from my input).
"""

import triton
import triton.language as tl

from iris_core.collectives import kinds
from iris_core.compat import aggregate


@aggregate
class Call:
    x_ptr: tl.tensor
    out_ptr: tl.tensor
    m: tl.tensor
    heap_base: tl.tensor
    block_in: tl.tensor
    source: tl.tensor
    KIND: tl.constexpr
    OP: tl.constexpr
    XB: tl.constexpr
    SOURCES: tl.constexpr
    ACC: tl.constexpr
    BLOCK: tl.constexpr
    CHUNK: tl.constexpr
    VEC: tl.constexpr
    ZERO_COPY: tl.constexpr

    @triton.constexpr_function
    def __init__(self, x_ptr, out_ptr, m, heap_base, block_in, source, KIND, OP, XB, SOURCES, ACC, BLOCK, CHUNK,
                 VEC, ZERO_COPY):
        """block_in: my input block that members read (me when XB > 1, else 0); source: my
        member's source (SOURCES[me]; PPERMUTE, BROADCAST)."""
        self.x_ptr = x_ptr
        self.out_ptr = out_ptr
        self.m = m
        self.heap_base = heap_base
        self.block_in = block_in
        self.source = source
        self.KIND = tl.constexpr(KIND)
        self.OP = tl.constexpr(OP)
        self.XB = tl.constexpr(XB)
        self.SOURCES = tl.constexpr(SOURCES)
        self.ACC = tl.constexpr(ACC)
        self.BLOCK = tl.constexpr(BLOCK)
        self.CHUNK = tl.constexpr(CHUNK)
        self.VEC = tl.constexpr(VEC)
        self.ZERO_COPY = tl.constexpr(ZERO_COPY)

    @triton.jit
    def input(self, block, c0, cols):
        """Pointers to `cols` of the chunk at c0 of input block `block`."""
        return vec(self.x_ptr, (block * self.m + c0 + cols).to(tl.int64), self.VEC)

    @triton.jit
    def output(self, block, c0, cols):
        """Pointers to `cols` of the chunk at c0 of output block `block`."""
        return vec(self.out_ptr, (block * self.m + c0 + cols).to(tl.int64), self.VEC)

    @triton.jit
    def width(self, c0):
        """Columns of the chunk at c0 (a multiple of VEC, said so that masks hold for whole vectors)."""
        return tl.minimum(self.m - c0, self.CHUNK) // self.VEC * self.VEC


@triton.jit
def combine(acc, value, OP: tl.constexpr):
    if OP == kinds.SUM:
        return acc + value
    elif OP == kinds.MAX:
        return tl.maximum(acc, value)
    else:
        return tl.minimum(acc, value)


@triton.jit
def vec(base, offsets, VEC: tl.constexpr):
    """base + offsets (a tile), declared as runs of VEC elements that start on 16-byte
    boundaries, so accesses become 16-byte vectors. True for every tile here when VEC > 1:
    bases are 16-byte aligned and the column count is a multiple of VEC (see
    iris_jax.collectives.lowering.launch). (The hint must sit where the pointers are computed: Triton
    drops it on a function's argument.)"""
    ptrs = base + offsets
    if VEC > 1:
        ptrs = tl.max_contiguous(tl.multiple_of(ptrs, 16), VEC)
    return ptrs


@triton.jit
def get(ctx, ptrs, rank, mask, VEC: tl.constexpr):
    """ctx.load of a tile from `rank`, vectorized as vec (the translated address keeps the
    alignment: heaps are page aligned)."""
    if VEC > 1:
        return ctx.load(ptrs, from_rank=rank, mask=mask, hint=16)
    return ctx.load(ptrs, from_rank=rank, mask=mask)


@triton.jit
def buffer(ws_base, epoch, OFFSET: tl.constexpr, DATA_BYTES: tl.constexpr, ptr_type: tl.constexpr):
    """The workspace buffer at OFFSET (data or data2) of `epoch`'s parity."""
    return tl.cast(ws_base + OFFSET + (epoch % 2).to(tl.uint64) * DATA_BYTES, ptr_type)


@triton.jit
def slot(sender, receiver):
    """The slot of `sender`'s data in `receiver`'s push buffer: the members in order, the
    receiver left out (it reads its own input)."""
    return sender - (sender > receiver).to(tl.int32)


@triton.jit
def stage_tile(c, ws, c0, width, t):
    """Copies tile t of my columns [c0, c0 + width) of every input block into my workspace."""
    cols = t * c.BLOCK + tl.arange(0, c.BLOCK)
    mask = cols < width
    for b in tl.static_range(c.XB):
        tl.store(vec(ws, b * c.CHUNK + cols, c.VEC), tl.load(c.input(b, c0, cols), mask=mask), mask=mask)


@triton.jit
def stage(g, c, ws, c0, width, tiles):
    """Copies my columns [c0, c0 + width) of every input block into my workspace."""
    for t in range(g.pid, tiles, g.programs):
        stage_tile(c, ws, c0, width, t)


@triton.jit
def push_tile(g, c, ws, c0, width, t):
    """Push mode, sending: stores tile t of what each peer needs from my input (block i for
    member i when XB > 1, else my whole input; PPERMUTE/BROADCAST: only to members whose
    source I am) into my slot of that peer's buffer `ws`."""
    cols = t * c.BLOCK + tl.arange(0, c.BLOCK)
    mask = cols < width
    if c.XB == 1:
        value = tl.load(c.input(0, c0, cols), mask=mask)
    for i in tl.static_range(g.G):
        wanted = i != g.me
        if kinds.from_one_source(c.KIND):
            wanted = wanted & (c.SOURCES[i] == g.me)
        if wanted:
            if c.XB > 1:
                value = tl.load(c.input(i, c0, cols), mask=mask)
            dst = vec(ws, slot(g.me, i) * c.CHUNK + cols, c.VEC)
            if c.VEC > 1:
                g.ctx.store(dst, value, to_rank=g.rank(i), mask=mask, hint=16)
            else:
                g.ctx.store(dst, value, to_rank=g.rank(i), mask=mask)


@triton.jit
def _offered(g, c, ws, member, c0, cols):
    """Pull mode: my-heap pointers to `cols` of input block `block_in` as `member` offers them:
    its staged workspace, or (zero-copy) its input in place; ctx.load translates them."""
    staged = ws + c.block_in * c.CHUNK + cols
    if c.ZERO_COPY:
        offset = tl.load(g.flag(member) + 1)
        in_place = tl.cast(tl.cast(c.heap_base + offset, tl.pointer_type(tl.int8)), c.x_ptr.dtype)
        in_place = in_place + (c.block_in * c.m + c0 + cols).to(tl.int64)
        return tl.where(offset >= 0, in_place, staged)
    return staged


@triton.jit
def _received(g, c, ws, member, c0, cols, mask):
    """Push mode: what `member` pushed into its slot of my buffer `ws`; my own from my input."""
    if member == g.me:
        value = tl.load(c.input(c.block_in, c0, cols), mask=mask)
    else:
        value = tl.load(vec(ws, slot(member, g.me) * c.CHUNK + cols, c.VEC), mask=mask)
    return value


@triton.jit
def contribution(g, c, ws, member, c0, cols, mask, PUSH: tl.constexpr):
    """`member`'s tile `cols` of the chunk at c0: pulled from it, or (PUSH) pushed to me."""
    if PUSH:
        value = _received(g, c, ws, member, c0, cols, mask)
    else:
        value = get(g.ctx, _offered(g, c, ws, member, c0, cols), g.rank(member), mask, c.VEC)
    return value


@triton.jit
def combined(g, c, ws, c0, cols, mask, PUSH: tl.constexpr):
    """Every member's contribution, combined in member order, in the output's dtype."""
    acc = contribution(g, c, ws, 0, c0, cols, mask, PUSH).to(c.ACC)
    for i in tl.static_range(1, g.G):
        acc = combine(acc, contribution(g, c, ws, i, c0, cols, mask, PUSH).to(c.ACC), c.OP)
    return acc.to(c.out_ptr.dtype.element_ty)


@triton.jit
def output_tile(g, c, ws, c0, width, t, PUSH: tl.constexpr):
    """Tile t of my output for the chunk at c0 (the table in iris_core.collectives.kinds)."""
    cols = t * c.BLOCK + tl.arange(0, c.BLOCK)
    mask = cols < width
    if kinds.combines(c.KIND):
        tl.store(c.output(0, c0, cols), combined(g, c, ws, c0, cols, mask, PUSH), mask=mask)
    elif kinds.gathers(c.KIND):
        for i in tl.static_range(g.G):
            tl.store(c.output(i, c0, cols), contribution(g, c, ws, i, c0, cols, mask, PUSH), mask=mask)
    else:
        value = tl.zeros([c.BLOCK], c.out_ptr.dtype.element_ty)
        if c.source >= 0:
            value = contribution(g, c, ws, c.source, c0, cols, mask, PUSH)
        tl.store(c.output(0, c0, cols), value, mask=mask)
