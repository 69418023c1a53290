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

from iris_core.compat import aggregate
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

HEADER_WORDS = tl.constexpr(context_layout.HEADER_WORDS)  # [rank, world_size, heap_size] before the bases


@aggregate
class Context:
    rank: tl.tensor
    world_size: tl.constexpr
    heap_bases: tl.tensor
    tracing: DeviceTracing

    @triton.constexpr_function
    def __init__(self, rank, world_size, heap_bases, tracing):
        self.rank = rank
        self.world_size = tl.constexpr(world_size)
        self.heap_bases = heap_bases
        self.tracing = tracing

    @staticmethod
    @triton.jit
    def initialize(context_ptr, world_size: tl.constexpr, tracing: tl.constexpr = False):
        """Decodes the context array (int32-packed 64-bit words) passed to the kernel."""
        words = context_ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
        rank = tl.load(words).to(tl.int32)
        heap_bases = words + HEADER_WORDS
        return Context(rank, world_size, heap_bases,
                       DeviceTracing(tracing, words + HEADER_WORDS + world_size, rank, heap_bases))

    @triton.jit
    def translate(self, ptr, from_rank, to_rank, hint: tl.constexpr = None, mask=None):
        return rma.translate(ptr, from_rank, to_rank, self.heap_bases, hint, mask)

    # RMA ops: with tracing=True each records one event (rank = the peer, address = my pointer)
    @triton.jit
    def load(self, ptr, from_rank, mask=None, other=None, cache_modifier: tl.constexpr = NO_MODIFIER,
             volatile: tl.constexpr = False, hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_LOAD, from_rank, ptr, mask=mask)
        value = rma.load(ptr, from_rank, self.rank, self.heap_bases, mask, other, cache_modifier, volatile, hint)
        self.tracing.record_event_end(event)
        return value

    @triton.jit
    def store(self, ptr, value, to_rank, mask=None, cache_modifier: tl.constexpr = NO_MODIFIER, hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_STORE, to_rank, ptr, mask=mask)
        rma.store(ptr, value, to_rank, self.rank, self.heap_bases, mask, cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def get(self, from_ptr, to_ptr, from_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = NO_MODIFIER,
            store_cache_modifier: tl.constexpr = NO_MODIFIER, hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_GET, from_rank, from_ptr, mask=mask)
        rma.get(from_ptr, to_ptr, from_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
                store_cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def put(self, from_ptr, to_ptr, to_rank, mask=None, other=None, load_cache_modifier: tl.constexpr = NO_MODIFIER,
            store_cache_modifier: tl.constexpr = NO_MODIFIER, hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_PUT, to_rank, to_ptr, mask=mask)
        rma.put(from_ptr, to_ptr, to_rank, self.rank, self.heap_bases, mask, other, load_cache_modifier,
                store_cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def copy(self, src_ptr, dst_ptr, from_rank, to_rank, mask=None, other=None,
             load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
             hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_COPY, to_rank, dst_ptr, mask=mask)
        rma.copy(src_ptr, dst_ptr, from_rank, to_rank, self.rank, self.heap_bases, mask, other,
                 load_cache_modifier, store_cache_modifier, hint)
        self.tracing.record_event_end(event)

    @triton.jit
    def atomic_add(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_ADD, to_rank, ptr, mask=mask)
        old = rma.atomic_add(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_sub(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_SUB, to_rank, ptr, mask=mask)
        old = rma.atomic_sub(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_xchg(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_XCHG, to_rank, ptr, mask=mask)
        old = rma.atomic_xchg(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_xor(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_XOR, to_rank, ptr, mask=mask)
        old = rma.atomic_xor(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_and(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_AND, to_rank, ptr, mask=mask)
        old = rma.atomic_and(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_or(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_OR, to_rank, ptr, mask=mask)
        old = rma.atomic_or(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_min(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_MIN, to_rank, ptr, mask=mask)
        old = rma.atomic_min(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_max(self, ptr, val, to_rank, mask=None, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_MAX, to_rank, ptr, mask=mask)
        old = rma.atomic_max(ptr, val, to_rank, self.rank, self.heap_bases, mask, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    @triton.jit
    def atomic_cas(self, ptr, cmp, val, to_rank, sem: tl.constexpr = ACQ_REL, scope: tl.constexpr = SYSTEM,
                   hint: tl.constexpr = None):
        event = self.tracing.record_event_start(EVENT_ATOMIC_CAS, to_rank, ptr)
        old = rma.atomic_cas(ptr, cmp, val, to_rank, self.rank, self.heap_bases, sem, scope, hint)
        self.tracing.record_event_end(event)
        return old

    # -- tile-level collectives (see tile_collectives) ------------------------------
    @triton.jit
    def all_reduce_atomic(self, tile, dst_view):
        tiles.all_reduce_atomic(self, tile, dst_view)

    @triton.jit
    def all_reduce_spinlock(self, tile, dst_view, locks):
        tiles.all_reduce_spinlock(self, tile, dst_view, locks)

    @triton.jit
    def all_reduce_one_shot(self, tile, src_view, dst_view, locks):
        tiles.all_reduce_one_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_reduce_two_shot(self, tile, src_view, dst_view, locks):
        tiles.all_reduce_two_shot(self, tile, src_view, dst_view, locks)

    @triton.jit
    def reduce_scatter(self, tile, src_view, dst_view, locks):
        tiles.reduce_scatter(self, tile, src_view, dst_view, locks)

    @triton.jit
    def all_gather(self, tile, dst_view, DIM: tl.constexpr):
        tiles.all_gather(self, tile, dst_view, DIM)

    @triton.jit
    def gather(self, tile, src_view, source_rank, hint: tl.constexpr = None):
        return tiles.gather(self, tile, src_view, source_rank, hint)

    @triton.jit
    def all_to_all(self, tile, src_view, dst_view, N_PER_RANK: tl.constexpr):
        tiles.all_to_all(self, tile, src_view, dst_view, N_PER_RANK)


DeviceContext = Context

