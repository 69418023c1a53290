"""Tile-level collectives: building blocks for kernels that fuse communication with compute.

Each function takes the kernel's `ctx` and a `Tile` (position + data) and moves that tile
between ranks through views of symmetric-heap tensors. `locks` is an int32 array on the
heap with one entry per tile (tile id = pid_m * tiles_n + pid_n); entries double as
ready flags: a producer sets its entry to 1 after writing its tile, consumers wait for it.
Flags are single-use: reset them (e.g. zero the array) before the next round.
Completion on *other* ranks needs a barrier (or flags) before their data is read.

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

_FLAG: tl.constexpr = tl.constexpr(faults.named("tile collective (flag)"))  # what their fault records name
_LOCK: tl.constexpr = tl.constexpr(faults.named("tile collective (lock)"))
_TIMEOUT_NS = flag_protocol.timeout_ns(flag_protocol.DEFAULT_TIMEOUT_S)  # a plain int: a parameter's default


@triton.jit
def tile_id(tile, view):
    """Linear id of `tile` in `view` (row-major over tiles)."""
    return tile.pid_m * tl.cdiv(view.N, tile.block_n) + tile.pid_n


@triton.jit
def _flags(ctx, WHAT: tl.constexpr = _FLAG, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    return flags.Flags(ctx, TIMEOUT_NS, 0, WHAT)


@triton.jit
def _wait_flag(ctx, flag_ptr, rank, value, TIMEOUT_NS: tl.constexpr):
    """Waits until `rank`'s flag reaches `value`, then a CTA barrier: every thread's later
    reads see what the flag's writer wrote before raising it."""
    _flags(ctx, _FLAG, TIMEOUT_NS).wait_or_fail(flag_ptr, value, rank, rank=rank)


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
def _publish(ctx, tile, src_view, locks):
    """Stores my tile into my `src_view` and raises its ready flag."""
    ptrs, mask = src_view.tile_ptr(tile)
    tl.store(ptrs, tile.data, mask=mask)
    tl.debug_barrier()
    _flags(ctx).set(locks + tile_id(tile, src_view), 1)
    return ptrs, mask


@triton.jit
def _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, TIMEOUT_NS: tl.constexpr):
    lock = locks + tile_id(tile, src_view)
    if tile.data.dtype.is_floating():
        acc = tl.zeros_like(tile.data.to(tl.float32))  # fp16/bf16 accumulate in fp32
    else:
        acc = tl.zeros_like(tile.data)
    for r in range(ctx.world_size):
        _wait_flag(ctx, lock, r, 1, TIMEOUT_NS)
        acc += ctx.load(ptrs, from_rank=r, mask=mask)
    return acc.to(tile.data.dtype)


@triton.jit
def all_reduce_one_shot(ctx, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """Publishes my tile, waits for every rank's, sums them into my `dst_view`."""
    ptrs, mask = _publish(ctx, tile, src_view, locks)
    result = _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, TIMEOUT_NS)
    dst, dst_mask = dst_view.tile_ptr(tile)
    tl.store(dst, result, mask=dst_mask)


@triton.jit
def all_reduce_two_shot(ctx, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """Publishes my tile; the tile's owner (tile id % W) reduces it and stores the sum into
    `dst_view` on every rank."""
    ptrs, mask = _publish(ctx, tile, src_view, locks)
    if tile_id(tile, src_view) % ctx.world_size == ctx.rank:
        result = _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, TIMEOUT_NS)
        dst, dst_mask = dst_view.tile_ptr(tile)
        for r in range(ctx.world_size):
            ctx.store(dst, result, to_rank=r, mask=dst_mask)


@triton.jit
def reduce_scatter(ctx, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TIMEOUT_NS):
    """Publishes my tile; rank r keeps the sum of the r-th contiguous block of tiles in its
    `dst_view` (same tile positions)."""
    ptrs, mask = _publish(ctx, tile, src_view, locks)
    tiles = tl.cdiv(src_view.M, tile.block_m) * tl.cdiv(src_view.N, tile.block_n)
    per_rank = tl.cdiv(tiles, ctx.world_size)
    if tile_id(tile, src_view) // per_rank == ctx.rank:
        result = _reduce_from_all(ctx, tile, src_view, locks, ptrs, mask, TIMEOUT_NS)
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
