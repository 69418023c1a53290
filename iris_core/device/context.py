"""`Context`: the device-side handle a kernel builds from its context array.

    @triton.jit
    def kernel(context_ptr, x_ptr, n, WORLD_SIZE: tl.constexpr, BLOCK: tl.constexpr):
        ctx = Context.initialize(context_ptr, WORLD_SIZE)
        peer = (ctx.rank + 1) % ctx.world_size
        offs = tl.arange(0, BLOCK)
        ctx.store(x_ptr + offs, ctx.rank + offs, to_rank=peer, mask=offs < n)

`rank` is a run-time value read from the context, so one compiled kernel serves every
device of a single-process SPMD program; `world_size` is a compile-time constant.
Every RMA method wraps the free function of the same name in `rma`; built with
`tracing=True` it also records one event per call in `ctx.tracing` (see `tracing`),
built without, it compiles to exactly the free function.
"""

import triton
import triton.language as tl

from iris_core import flag_protocol
from iris_core.compat import aggregate, interpreting
from iris_core.device import rma
from iris_core.device import tile_collectives as tiles  # Context's tile-level collectives
from iris_core.device.rma import ACQ_REL, NO_MODIFIER, SYSTEM
from iris_core.device.tracing import (
    EVENT_ATOMIC_ADD,
    EVENT_ATOMIC_AND,
    EVENT_ATOMIC_CAS,
    EVENT_ATOMIC_MAX,
    EVENT_ATOMIC_MIN,
    EVENT_ATOMIC_OR,
    EVENT_ATOMIC_SUB,
    EVENT_ATOMIC_XCHG,
    EVENT_ATOMIC_XOR,
    EVENT_COPY,
    EVENT_GET,
    EVENT_LOAD,
    EVENT_PUT,
    EVENT_STORE,
    DeviceTracing,
)
from iris_core.heap import context_layout

_TILE_TIMEOUT_NS = flag_protocol.timeout_ns(flag_protocol.DEFAULT_TIMEOUT_S)  # the tile collectives' default

HEADER_WORDS = tl.constexpr(context_layout.HEADER_WORDS)  # [rank, world_size, heap_size] before the bases
OWN_BASE_WORD = tl.constexpr(context_layout.own_base_offset(0))  # the rank's own base, at this + world_size


if interpreting():

    def _check_world_size(words, world_size):
        """Simulator: a context decoded for another world size than the runtime's reads the heap bases
        and the guard's bound from the wrong words (a crash); refused, naming both sizes."""
        from iris_core.sim import checks, replay  # lazy: the simulator's modules load only when a kernel runs under it

        replay.host_step(checks.check_world_size, tl.load(words + 1), world_size)

else:

    @triton.jit
    def _check_world_size(words, world_size: tl.constexpr):
        pass  # (GPUs: the kernel is compiled for the runtime's world size; a wrong one faults there too)


@aggregate
class Context:
    """The device-side handle of a kernel: its rank, the world size, every rank's heap.

    Build it with `Context.initialize(context_ptr, WORLD_SIZE)` from the context array
    that `iris_jax.triton_call` passes first. Every remote-memory method translates a
    pointer into my heap to another rank's heap, then runs an ordinary Triton op
    (`iris_core.device.rma`).

    Attributes:
      rank: this device's rank, a run-time value (one compiled kernel serves every device).
      world_size: the number of ranks, a compile-time constant.
      heap_bases: pointer to the W 64-bit heap bases (as mapped on this device).
      tracing: the device side of event tracing (`DeviceTracing`; inert unless built with
        `tracing=True`).
      bound: the heap guard's bound, the bytes mapped on every rank (read once, at initialize;
        0 with the guard compiled out).
    """

    rank: tl.tensor
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing
    bound: tl.tensor

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing, bound):
        self.rank = rank
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tracing
        self.bound = bound

    @staticmethod
    @triton.jit
    def initialize(context_ptr, world_size: tl.constexpr, tracing: tl.constexpr = False):
        """Decodes the context array that `iris_jax.triton_call` passes to the kernel.

        Args:
          context_ptr: the kernel's first argument (int32-packed 64-bit words).
          world_size: the number of ranks (a constexpr: the runtime's world size).
          tracing: record events (a constexpr; pass `iris_jax.tracing.is_enabled()`); off,
            the kernel compiles as without tracing.

        Returns:
          The `Context`.
        """
        words = context_ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
        _check_world_size(words, world_size)
        rank = tl.load(words).to(tl.int32)
        heap_bases = words + HEADER_WORDS
        # the guard's bound, once per kernel: read at every op, a load that depends on the heap base and
        # that a loop storing into the heap cannot keep in a register (benchmarks/RESULTS.md has its cost);
        # the own base sits at a fixed word, so its load issues with the rank's, not after it
        if rma.GUARD:
            bound = rma.bound_of(tl.load(words + OWN_BASE_WORD + world_size))
        else:
            bound = tl.cast(0, tl.int64)
        return Context(rank, world_size, heap_bases,
                       DeviceTracing(tracing, words + HEADER_WORDS + world_size, rank, heap_bases), bound)

    @triton.jit
    def translate(self, ptr, from_rank, to_rank, hint: tl.constexpr = None, mask=None):
        """`ptr` (valid in `from_rank`'s heap) as an address in `to_rank`'s heap.

        Args:
          ptr: pointer (or block of pointers) into `from_rank`'s heap.
          from_rank: the rank whose heap `ptr` points into (usually my own rank).
          to_rank: the rank whose heap the result points into.
          hint: an int, or one int per dimension: the result is contiguous and aligned in runs of
            that many elements, so accesses through it stay vectorized (None: no claim).
          mask: lanes to check with the heap guard (None: all).

        Returns:
          The translated pointer(s). With the heap guard on, lanes outside `from_rank`'s heap (or
          all lanes, for a rank out of range) are reported and point to `to_rank`'s sink line.
        """
        return rma.translate(ptr, from_rank, to_rank, self.heap_bases, hint, mask, bound=self.bound)

    # RMA ops: with tracing=True each records one event (rank = the peer, address = my pointer)
    @triton.jit
    def load(self, ptr, from_rank, mask=None, other=None, cache_modifier: tl.constexpr = NO_MODIFIER,
             volatile: tl.constexpr = False, hint: tl.constexpr = None):
        """Reads `from_rank`'s heap at the offset of my `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          from_rank: the rank to read from (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          other: the value of masked-off lanes.
          cache_modifier: Triton's load cache modifier ("": the default; ".cg" reads L2 only).
          volatile: read memory every time (a value another rank changes).
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The values, shaped like `ptr`.
        """
        event = self.tracing.record_event_start(EVENT_LOAD, from_rank, ptr, mask=mask)
        value = rma.load(ptr, from_rank, self.rank, self.heap_bases, mask, other, cache_modifier, volatile, hint,
                         bound=self.bound)
        self.tracing.record_event_end(event)
        return value

    @triton.jit
    def store(self, ptr, value, to_rank, mask=None, cache_modifier: tl.constexpr = NO_MODIFIER, hint: tl.constexpr = None):
        """Writes `value` into `to_rank`'s heap at the offset of my `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          value: what to store, shaped like `ptr` (or a scalar).
          to_rank: the rank to write to (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          cache_modifier: Triton's store cache modifier ("": the default).
          hint: alignment of runs of `ptr` (see `translate`).
        """
        event = self.tracing.record_event_start(EVENT_STORE, to_rank, ptr, mask=mask)
        rma.store(ptr, value, to_rank, self.rank, self.heap_bases, mask, cache_modifier, hint, bound=self.bound)
        self.tracing.record_event_end(event)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = NO_MODIFIER,
            store_cache_modifier: tl.constexpr = NO_MODIFIER, hint: tl.constexpr = None):
        """Copies `from_rank`'s data at `from_ptr` into my memory at `to_ptr`.

        Args:
          from_ptr: pointer(s) into a heap array, read on `from_rank`'s heap.
          to_ptr: pointer(s) into my own memory (heap or not), written locally.
          from_rank: the rank to read from.
          mask: lanes that take part (None: all).
          other: the value masked-off lanes read (they are not stored).
          load_cache_modifier: Triton's cache modifier of the remote load.
          store_cache_modifier: Triton's cache modifier of the local store.
          hint: alignment of runs of `from_ptr` (see `translate`).
        """
        event = self.tracing.record_event_start(EVENT_GET, from_rank, from_ptr, mask=mask)
        rma.get(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
                store_cache_modifier, hint, bound=self.bound)
        self.tracing.record_event_end(event)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = NO_MODIFIER,
            store_cache_modifier: tl.constexpr = NO_MODIFIER, hint: tl.constexpr = None):
        """Copies my data at `from_ptr` into `to_rank`'s heap at the offset of `to_ptr`.

        Args:
          from_ptr: pointer(s) into my own memory (heap or not), read locally.
          to_ptr: pointer(s) into a heap array, written on `to_rank`'s heap.
          to_rank: the rank to write to.
          mask: lanes that take part (None: all).
          other: the value masked-off lanes read (they are not stored).
          load_cache_modifier: Triton's cache modifier of the local load.
          store_cache_modifier: Triton's cache modifier of the remote store.
          hint: alignment of runs of `to_ptr` (see `translate`).
        """
        event = self.tracing.record_event_start(EVENT_PUT, to_rank, to_ptr, mask=mask)
        rma.put(from_ptr, to_ptr, to_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
                store_cache_modifier, hint, bound=self.bound)
        self.tracing.record_event_end(event)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
             hint: tl.constexpr = None):
        """Copies `from_rank`'s data at `src_ptr` into `to_rank`'s heap at `dst_ptr`.

        Both pointers are offsets in my heap; the caller should be one of the two ranks.

        Args:
          src_ptr: pointer(s) into a heap array, read on `from_rank`'s heap.
          dst_ptr: pointer(s) into a heap array, written on `to_rank`'s heap.
          from_rank: the rank to read from.
          to_rank: the rank to write to.
          mask: lanes that take part (None: all).
          other: the value masked-off lanes read (they are not stored).
          load_cache_modifier: Triton's cache modifier of the load.
          store_cache_modifier: Triton's cache modifier of the store.
          hint: alignment of runs of the pointers (see `translate`).
        """
        event = self.tracing.record_event_start(EVENT_COPY, to_rank, dst_ptr, mask=mask)
        rma.copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other,
                 load_cache_modifier, store_cache_modifier, hint, bound=self.bound)
        self.tracing.record_event_end(event)

    @triton.jit
    def atomic_add(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically adds `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_ADD, to_rank, ptr, mask=mask)
        old = rma.atomic_add(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_sub(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically subtracts `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_SUB, to_rank, ptr, mask=mask)
        old = rma.atomic_sub(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_xchg(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically exchanges with `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_XCHG, to_rank, ptr, mask=mask)
        old = rma.atomic_xchg(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_xor(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically xors with `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_XOR, to_rank, ptr, mask=mask)
        old = rma.atomic_xor(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_and(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically ands with `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_AND, to_rank, ptr, mask=mask)
        old = rma.atomic_and(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_or(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically ors with `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_OR, to_rank, ptr, mask=mask)
        old = rma.atomic_or(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_min(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically takes the minimum with `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_MIN, to_rank, ptr, mask=mask)
        old = rma.atomic_min(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_max(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically takes the maximum with `val` at `to_rank`'s copy of `ptr`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
          to_rank: the rank whose heap is updated (may be my own).
          mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_MAX, to_rank, ptr, mask=mask)
        old = rma.atomic_max(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_cas(self, ptr, cmp, val, to_rank, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        """Atomically compares `to_rank`'s copy of `ptr` with `cmp` and, where equal, stores `val`.

        Args:
          ptr: pointer (or block of pointers) into a heap array of my heap.
          cmp: the expected value.
          val: the value stored where the current value equals `cmp`.
          to_rank: the rank whose heap is updated (may be my own).
          sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
          scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
          hint: alignment of runs of `ptr` (see `translate`).

        Returns:
          The value before the operation. It takes no mask: with the heap guard on, a refused
          lane goes to the target's sink line.
        """
        event = self.tracing.record_event_start(EVENT_ATOMIC_CAS, to_rank, ptr)
        old = rma.atomic_cas(ptr, cmp, val, to_rank, self.rank, self.heap_bases, sem, scope, hint, bound=self.bound)
        self.tracing.record_event_end(event)
        return old

    # -- tile-level collectives (see tile_collectives) ------------------------------
    @triton.jit
    def all_reduce_atomic(self, tile, dst_view):
        """Adds my tile into `dst_view` on every rank with atomics.

        Args:
          tile: my `Tile` (position and data).
          dst_view: `TensorView` of a heap tensor that starts zeroed on every rank.
        """
        tiles.all_reduce_atomic(self, tile, dst_view)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TILE_TIMEOUT_NS):
        """On every rank: takes the tile's lock, adds my tile into `dst_view`, releases.

        Args:
          tile: my `Tile`.
          dst_view: `TensorView` of a heap tensor that starts zeroed on every rank.
          locks: int32 heap array, one lock per tile.
          TIMEOUT_NS: how long to wait for a peer, in ns (a constexpr; default 60 s); then the
            kernel records a fault naming the peer (the simulator raises PeerTimeoutError).
        """
        tiles.all_reduce_spinlock(self, tile, dst_view, locks, TIMEOUT_NS)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TILE_TIMEOUT_NS):
        """Publishes my tile, waits for every rank's, and sums them into my `dst_view`.

        Args:
          tile: my `Tile`.
          src_view: `TensorView` of a heap tensor where each rank publishes its tile.
          dst_view: `TensorView` of my output.
          locks: int32 heap array, one single-use ready flag per tile (zeroed before the round).
          TIMEOUT_NS: how long to wait for a peer, in ns (a constexpr; default 60 s); then the
            kernel records a fault naming the peer (the simulator raises PeerTimeoutError). A
            peer whose call differs (collective, dtype, tile blocks, view shape) fails both with
            RankMismatchError; a peer that gave up on the tile, with PeerFailedError.
        """
        tiles.all_reduce_one_shot(self, tile, src_view, dst_view, locks, TIMEOUT_NS)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TILE_TIMEOUT_NS):
        """Publishes my tile; its owner (tile id % W) reduces it and stores the sum on every rank.

        Args:
          tile: my `Tile`.
          src_view: `TensorView` of a heap tensor where each rank publishes its tile.
          dst_view: `TensorView` of a heap tensor that receives the sums on every rank.
          locks: int32 heap array, one single-use ready flag per tile (zeroed before the round).
          TIMEOUT_NS: how long to wait for a peer, in ns (a constexpr; default 60 s); then the
            kernel records a fault naming the peer (the simulator raises PeerTimeoutError). A
            peer whose call differs (collective, dtype, tile blocks, view shape) fails both with
            RankMismatchError; a peer that gave up on the tile, with PeerFailedError.
        """
        tiles.all_reduce_two_shot(self, tile, src_view, dst_view, locks, TIMEOUT_NS)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks, TIMEOUT_NS: tl.constexpr = _TILE_TIMEOUT_NS):
        """Publishes my tile; rank r keeps the sum of the r-th contiguous block of tiles.

        Args:
          tile: my `Tile`.
          src_view: `TensorView` of a heap tensor where each rank publishes its tile.
          dst_view: `TensorView` of my output (same tile positions).
          locks: int32 heap array, one single-use ready flag per tile (zeroed before the round).
          TIMEOUT_NS: how long to wait for a peer, in ns (a constexpr; default 60 s); then the
            kernel records a fault naming the peer (the simulator raises PeerTimeoutError). A
            peer whose call differs (collective, dtype, tile blocks, view shape) fails both with
            RankMismatchError; a peer that gave up on the tile, with PeerFailedError.
        """
        tiles.reduce_scatter(self, tile, src_view, dst_view, locks, TIMEOUT_NS)

    @triton.jit
    def all_gather(self, tile, dst_view, DIM: tl.constexpr):
        """Stores my tile into my slot of `dst_view` on every rank.

        Args:
          tile: my `Tile`.
          dst_view: `TensorView` of a heap tensor; slot `rank` is the rank-th block of rows
            (DIM=0) or columns (DIM=1), each `M // W` (or `N // W`) wide.
          DIM: 0 or 1, the dimension the slots split.
        """
        tiles.all_gather(self, tile, dst_view, DIM)

    @triton.jit
    def gather(self, tile, src_view, source_rank, hint: tl.constexpr = None):
        """Loads `tile`'s data from `source_rank`'s `src_view`.

        Args:
          tile: the `TileView` (or `Tile`) position to read.
          src_view: `TensorView` of a heap tensor.
          source_rank: the rank to read from.
          hint: alignment of runs of the tile's pointers (see `translate`).

        Returns:
          The tile's data; masked elements (outside the tensor) are 0.
        """
        return tiles.gather(self, tile, src_view, source_rank, hint)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_PER_RANK: tl.constexpr):
        """Sends column block j (`N_PER_RANK` wide) of my `src_view` to rank j's column block `rank`.

        Args:
          tile: my `Tile` position (it must not straddle two blocks: block_n divides N_PER_RANK).
          src_view: `TensorView` of my input.
          dst_view: `TensorView` of a heap tensor, written on every rank.
          N_PER_RANK: columns per rank's block.
        """
        tiles.all_to_all(self, tile, src_view, dst_view, N_PER_RANK)


DeviceContext = Context

