"""Tile-level collectives: building blocks for kernels that fuse communication with compute.

Each function takes the kernel's `ctx` and a `Tile` (position + data) and moves that tile
between ranks through views of symmetric-heap tensors. `locks` is an int32 array on the
heap with one entry per tile (tile id = pid_m * tiles_n + pid_n); entries double as
ready flags: a producer sets its entry after writing its tile, consumers wait for it.
Flags are single-use: reset them (e.g. zero the array) before the next round.
Completion on *other* ranks needs a barrier (or flags) before their data is read.

A ready flag holds the call's signature (iris_core.faults.TILE_SIGNED: the collective, the
dtype, a hash of the tile's blocks and the view's shape), which a consumer compares with its
own: ranks whose calls differ fail with RankMismatchError naming both, instead of summing
tiles that do not pair. A program that times out, or reads a poisoned flag, poisons its own
flag of the tile (TILE_POISON), so a rank that reads it later fails at once with
PeerFailedError.

Flags and locks follow the flag protocol (iris_core.device.flags.Flags). The functions that wait
take TIMEOUT_NS (a compile-time constant, default flags.DEFAULT_TIMEOUT_NS: 60 s), past which
they give up with a fault record naming the rank (iris_core.device.faults; no print, which
inside a GEMM kernel would make ptxas serialize every wgmma); the simulator raises
PeerTimeoutError.
Peers' data is read with plain loads after the flag's acquire and a CTA barrier: `.cg` loads
of peer memory (L2 only) are much slower (benchmarks/rma.py times both).
"""

import triton
import triton.language as tl

from iris_core import faults, flag_protocol
from iris_core.device import flags
from iris_core.device.faults import MISMATCH, PEER_FAILED, TIMEOUT, fail
from iris_core.device.intrinsics import global_timer

_FLAG: tl.constexpr = tl.constexpr(faults.named("tile collective (flag)"))  # what their fault records name
_LOCK: tl.constexpr = tl.constexpr(faults.named("tile collective (lock)"))
_TIMEOUT_NS = flag_protocol.timeout_ns(flag_protocol.DEFAULT_TIMEOUT_S)  # a plain int: a parameter's default
_POISON: tl.constexpr = tl.constexpr(faults.TILE_POISON)
_SHAPE_MASK: tl.constexpr = tl.constexpr(faults.TILE_SHAPE_MASK)
_ONE_SHOT: tl.constexpr = tl.constexpr(faults.TILE_KINDS.index("all_reduce_one_shot"))  # a signature's collective
_TWO_SHOT: tl.constexpr = tl.constexpr(faults.TILE_KINDS.index("all_reduce_two_shot"))
_REDUCE_SCATTER: tl.constexpr = tl.constexpr(faults.TILE_KINDS.index("reduce_scatter"))


@triton.jit
def tile_id(tile, view):
    """Linear id of `tile` in `view` (row-major over tiles)."""
    return tile.pid_m * tl.cdiv(view.N, tile.block_n) + tile.pid_n


@triton.jit
def _flags(ctx, WHAT: tl.constexpr = _FLAG, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    return flags.Flags(ctx, TIMEOUT_NS, 0, WHAT)


@triton.jit
def _signature(KIND: tl.constexpr, tile, view):
    """This call's ready-flag word (iris_core.faults.tile_signature_head): the collective, the
    dtype, and an FNV-1a hash of the tile's blocks and the view's shape."""
    h = tl.full((), faults.tile_blocks_hash(tile.block_m, tile.block_n), tl.int64)
    h = ((h ^ (tl.full((), 0, tl.int64) + view.M)) * 16777619) & 0xFFFFFFFF  # (M, N: values or constants)
    h = ((h ^ (tl.full((), 0, tl.int64) + view.N)) * 16777619) & 0xFFFFFFFF
    return (faults.tile_signature_head(KIND, tile.data.dtype) | (h & _SHAPE_MASK)).to(tl.int32)


@triton.jit
def _wait_flag(ctx, flag_ptr, rank, sig, my_flag, TIMEOUT_NS: tl.constexpr):
    """Waits until `rank`'s flag is raised, then a CTA barrier: every thread's later reads see
    what the flag's writer wrote before raising it. A flag that is not `sig` fails: a peer whose
    call differs (my flag keeps my signature, so that the peer reads the mismatch too), or that
    gave up, or none within TIMEOUT_NS (these two poison `my_flag`: whoever reads it later
    fails at once)."""
    seen = _flags(ctx, _FLAG, TIMEOUT_NS).wait(flag_ptr, 1, global_timer(), rank=rank)
    if seen != sig:
        if flags.timed_out(seen) or seen == _POISON:
            tl.atomic_xchg(my_flag, _POISON, sem="release", scope="sys")
        if flags.timed_out(seen):
            fail(ctx, TIMEOUT, _FLAG, rank, 1)
        elif seen == _POISON:
            fail(ctx, PEER_FAILED, _FLAG, rank)
        else:
            fail(ctx, MISMATCH, _FLAG, rank, 0, -1, sig, seen)
    tl.debug_barrier()


@triton.jit
def all_reduce_atomic(ctx, tile, dst_view):
    """Atomically adds my tile into `dst_view` on every rank (dst must start zeroed)."""
    ptrs, mask = dst_view.tile_ptr(tile)
    for r in range(ctx.world_size):
        ctx.atomic_add(ptrs, tile.data, to_rank=r, mask=mask, sem="relaxed", scope="sys")


@triton.jit
def all_reduce_spinlock(ctx, tile, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """On every rank: take the tile's lock, dst += my tile, release (dst must start zeroed)."""
    ptrs, mask = dst_view.tile_ptr(tile)
    lock = locks + tile_id(tile, dst_view)
    for r in range(ctx.world_size):
        _flags(ctx, _LOCK, TIMEOUT_NS).lock_or_fail(lock, r)
        current = ctx.load(ptrs, from_rank=r, mask=mask)
        ctx.store(ptrs, current + tile.data, to_rank=r, mask=mask)
        tl.debug_barrier()  # every thread's store precedes the release
        _flags(ctx, _LOCK).unlock(lock, r)


@triton.jit
def _publish(ctx, tile, src_view, locks, sig):
    """Stores my tile into my `src_view` and raises its ready flag to the call's signature."""
    ptrs, mask = src_view.tile_ptr(tile)
    tl.store(ptrs, tile.data, mask=mask)
    tl.debug_barrier()
    _flags(ctx).set(locks + tile_id(tile, src_view), sig)
    return ptrs, mask


@triton.jit
def _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, sig, TIMEOUT_NS: tl.constexpr):
    lock = locks + tile_id(tile, src_view)
    if tile.data.dtype.is_floating() and tile.data.dtype.primitive_bitwidth < 32:
        acc = tl.zeros_like(tile.data.to(tl.float32))  # fp16/bf16/fp8 accumulate in fp32 (fp64 in its own)
    else:
        acc = tl.zeros_like(tile.data)
    for r in range(ctx.world_size):
        _wait_flag(ctx, lock, r, sig, lock, TIMEOUT_NS)
        acc += ctx.load(ptrs, from_rank=r, mask=mask)
    return acc.to(tile.data.dtype)


@triton.jit
def all_reduce_one_shot(ctx, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """Publishes my tile, waits for every rank's, sums them into my `dst_view`."""
    sig = _signature(_ONE_SHOT, tile, src_view)
    ptrs, mask = _publish(ctx, tile, src_view, locks, sig)
    result = _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, sig, TIMEOUT_NS)
    dst, dst_mask = dst_view.tile_ptr(tile)
    tl.store(dst, result, mask=dst_mask)


@triton.jit
def all_reduce_two_shot(ctx, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """Publishes my tile; the tile's owner (tile id % W) reduces it and stores the sum into
    `dst_view` on every rank."""
    sig = _signature(_TWO_SHOT, tile, src_view)
    ptrs, mask = _publish(ctx, tile, src_view, locks, sig)
    if tile_id(tile, src_view) % ctx.world_size == ctx.rank:
        result = _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, sig, TIMEOUT_NS)
        dst, dst_mask = dst_view.tile_ptr(tile)
        for r in range(ctx.world_size):
            ctx.store(dst, result, to_rank=r, mask=dst_mask)


@triton.jit
def reduce_scatter(ctx, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """Publishes my tile; rank r keeps the sum of the r-th contiguous block of tiles in its
    `dst_view` (same tile positions)."""
    sig = _signature(_REDUCE_SCATTER, tile, src_view)
    ptrs, mask = _publish(ctx, tile, src_view, locks, sig)
    tiles = tl.cdiv(src_view.M, tile.block_m) * tl.cdiv(src_view.N, tile.block_n)
    per_rank = tl.cdiv(tiles, ctx.world_size)
    if tile_id(tile, src_view) // per_rank == ctx.rank:
        result = _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, sig, TIMEOUT_NS)
        dst, dst_mask = dst_view.tile_ptr(tile)
        tl.store(dst, result, mask=dst_mask)


@triton.jit
def all_gather(ctx, tile, dst_view, DIM: tl.constexpr):
    """Stores my tile into my slot of `dst_view` on every rank: slot = rank-th block of
    rows (DIM=0) or columns (DIM=1), each dst.M // W (or dst.N // W) wide."""
    rows = tile.pid_m * tile.block_m + tl.arange(0, tile.block_m)
    cols = tile.pid_n * tile.block_n + tl.arange(0, tile.block_n)
    if DIM == 0:
        mask = (rows[:, None] < dst_view.M // ctx.world_size) & (cols[None, :] < dst_view.N)
        ptrs, mask = dst_view.offset_tile_ptr(tile, ctx.rank * (dst_view.M // ctx.world_size), 0, mask)
    else:
        mask = (rows[:, None] < dst_view.M) & (cols[None, :] < dst_view.N // ctx.world_size)
        ptrs, mask = dst_view.offset_tile_ptr(tile, 0, ctx.rank * (dst_view.N // ctx.world_size), mask)
    for r in range(ctx.world_size):
        ctx.store(ptrs, tile.data, to_rank=r, mask=mask)


@triton.jit
def gather(ctx, tile, src_view, source_rank, hint: tl.constexpr = None):
    """Loads `tile`'s data from `source_rank`'s `src_view` (masked elements are 0)."""
    ptrs, mask = src_view.tile_ptr(tile)
    return ctx.load(ptrs, from_rank=source_rank, mask=mask, other=0, hint=hint)


@triton.jit
def all_to_all(ctx, tile, src_view, dst_view, N_PER_RANK: tl.constexpr):
    """Column block j (N_PER_RANK wide) of my `src_view` goes to rank j, into column block
    `rank` of its `dst_view`. The tile must not straddle two blocks (block_n | N_PER_RANK)."""
    first = tile.pid_n * tile.block_n
    target = first // N_PER_RANK
    shift = (ctx.rank - target) * N_PER_RANK
    rows = tile.pid_m * tile.block_m + tl.arange(0, tile.block_m)
    cols = first + tl.arange(0, tile.block_n)
    mask = (rows[:, None] < src_view.M) & (cols[None, :] < src_view.N)
    ptrs, _ = dst_view.offset_tile_ptr(tile, 0, shift, mask)
    ctx.store(ptrs, tile.data, to_rank=target, mask=mask)
