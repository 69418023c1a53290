"""The heap guard and the simulator's checked mode: accesses outside the heap (or outside a
live allocation) are named errors, and nothing is accessed.

Each kernel runs on one simulated rank (or all) of a heap whose every rank is poisoned
first; after the failure every heap must still hold the poison, and the error must name
the kernel, the op, the ranks and the offset.
"""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.device import Context, rma
from iris_core.errors import NotOnHeapError, SimulatedRankError
from iris_core.heap import status
from iris_core.sim import get_world, launch

BLOCK = 64
POISON = -1234
OPS = ["load", "store", "get", "put", "copy", "atomic_add", "atomic_sub", "atomic_xchg", "atomic_xor",
       "atomic_and", "atomic_or", "atomic_min", "atomic_max", "atomic_cas", "translate"]


@triton.jit
def one_op(context_ptr, x_ptr, out_ptr, n, shift, peer, W: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr):
    """One remote op of `OP` on x_ptr + shift (elements), lanes < n, with rank `peer`;
    local results go to out_ptr."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    ptrs = x_ptr + shift + offs
    if OP == "load":
        tl.store(out_ptr + offs, ctx.load(ptrs, peer, mask=mask, other=0), mask=mask)
    elif OP == "store":
        ctx.store(ptrs, offs + 1, peer, mask=mask)
    elif OP == "get":
        ctx.get(ptrs, out_ptr + offs, peer, mask=mask)
    elif OP == "put":
        ctx.put(out_ptr + offs, ptrs, peer, mask=mask)
    elif OP == "copy":
        ctx.copy(ptrs, out_ptr + offs, peer, ctx.rank, mask=mask)
    elif OP == "atomic_add":
        ctx.atomic_add(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_sub":
        ctx.atomic_sub(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_xchg":
        ctx.atomic_xchg(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_xor":
        ctx.atomic_xor(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_and":
        ctx.atomic_and(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_or":
        ctx.atomic_or(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_min":
        ctx.atomic_min(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_max":
        ctx.atomic_max(ptrs, 1, peer, mask=mask)
    elif OP == "atomic_cas":
        ctx.atomic_cas(x_ptr + shift, POISON, 7, peer)
    else:  # translate: a refused pointer points at the peer's sink line, inside its heap
        tl.store(ctx.translate(ptrs, ctx.rank, peer, mask=mask), offs + 1, mask=mask)


def run_op(state, session, x_off, out_off, n, shift, peer, op):
    heap = state.heap(session)
    rank, w = state.rank, state.world_size
    x = heap.host_view(rank, x_off, (BLOCK,), np.int32)
    out = heap.host_view(rank, out_off, (BLOCK,), np.int32)
    launch(one_op, (1,), heap.context(rank), x, out, n, shift, peer, W=w, OP=op, BLOCK=BLOCK)
    return out.copy()


def poisoned_heap(sim_heap, world_size):
    heap = sim_heap(world_size)
    x_off, out_off = heap.allocate(BLOCK * 4), heap.allocate(BLOCK * 4)
    for r in range(world_size):
        heap.host_view(r, 0, (heap.heap_size // 4,), np.int32)[64:] = POISON  # all but the status line
    return heap, x_off, out_off


def assert_untouched(heap):
    for r in range(heap.world_size):
        words = heap.host_view(r, 0, (heap.heap_size // 4,), np.int32)
        assert (words[64:] == POISON).all(), f"rank {r}'s heap changed"


@pytest.mark.parametrize("world_size, peer", [(4, 7), (4, -1), (2, 2), (3, 1 << 20)])
def test_rank_outside_the_world_is_named(sim_heap, world_size, peer):
    heap, x_off, out_off = poisoned_heap(sim_heap, world_size)
    with pytest.raises(NotOnHeapError) as info:
        get_world(world_size).call(0, run_op, heap.session, x_off, out_off, BLOCK, 0, peer, "store")
    message = str(info.value)
    assert isinstance(info.value, SimulatedRankError)
    assert f"kernel one_op on rank 0: store with rank {peer}, which is outside [0, world_size)" in message, message
    assert_untouched(heap)


@pytest.mark.parametrize("op", OPS)
def test_pointer_past_the_heap_is_named_for_every_op(sim_heap, op):
    """64 MiB past the heap's end (the simulator's worker died with SIGSEGV here before)."""
    world_size = 3
    heap, x_off, out_off = poisoned_heap(sim_heap, world_size)
    shift = (64 << 20) // 4
    with pytest.raises(NotOnHeapError) as info:
        get_world(world_size).call(1, run_op, heap.session, x_off, out_off, BLOCK, shift, 2, op)
    message = str(info.value)
    offset = x_off + (64 << 20)
    assert f"kernel one_op on rank 1: {op} to rank 2 through a pointer at byte offset {offset}" in message, message
    assert "past the heap's end" in message
    assert_untouched(heap)


def run_off_heap(state, session, out_off):
    """A pointer into this worker's own memory (not a heap) given to a remote store."""
    heap = state.heap(session)
    rank = state.rank
    private = np.full(BLOCK, POISON, np.int32)
    out = heap.host_view(rank, out_off, (BLOCK,), np.int32)
    try:
        launch(one_op, (1,), heap.context(rank), private, out, BLOCK, 0, (rank + 1) % state.world_size, W=2,
               OP="store", BLOCK=BLOCK)
    finally:
        assert (private == POISON).all()
    return None


def test_pointer_off_every_heap_is_named(sim_heap):
    heap, _, out_off = poisoned_heap(sim_heap, 2)
    with pytest.raises(NotOnHeapError, match=r"one_op on rank 0: store to rank 1 through a pointer at byte offset -?\d+"):
        get_world(2).call(0, run_off_heap, heap.session, out_off)
    assert_untouched(heap)


def run_at_heap_end(state, session, peer):
    """Lanes past the heap's end that the mask turns off are not accessed and not errors."""
    heap = state.heap(session)
    rank = state.rank
    last = heap.heap_size - 16 * 4  # the last 16 int32 of the heap; lanes 16..63 run past it
    x = heap.host_view(rank, last, (16,), np.int32)
    out = np.full(BLOCK, POISON, np.int32)
    launch(one_op, (1,), heap.context(rank), x, out, 16, 0, peer, W=state.world_size, OP="load", BLOCK=BLOCK)
    return out


@pytest.mark.parametrize("world_size", [2, 4])
def test_masked_lanes_past_the_heap_are_not_errors(sim_heap, world_size):
    heap = sim_heap(world_size)
    heap.allocate(heap.heap_size - 256 - 256)  # the rest of the heap...
    tail = heap.allocate(256)  # ...and its last 256 bytes
    assert tail + 256 == heap.heap_size
    for r in range(world_size):
        heap.host_view(r, heap.heap_size - 64, (16,), np.int32)[:] = np.arange(16) + 100 * r
    outs = get_world(world_size).run(run_at_heap_end, heap.session, 1)
    for out in outs:
        np.testing.assert_array_equal(out[:16], np.arange(16) + 100)
        assert (out[16:] == POISON).all()


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_guarded_ops_in_bounds_match_numpy(sim_heap, world_size):
    """The guard changes nothing for accesses inside the heap: each rank loads its next
    neighbour's array and atomically adds into its previous one's."""
    heap, x_off, out_off = poisoned_heap(sim_heap, world_size)
    for r in range(world_size):
        heap.host_view(r, x_off, (BLOCK,), np.int32)[:] = np.arange(BLOCK) * (r + 1)
    loads = get_world(world_size).run(_load_next, heap.session, x_off, out_off)
    for r, out in enumerate(loads):
        nxt = (r + 1) % world_size
        np.testing.assert_array_equal(out[:37], np.arange(37) * (nxt + 1))
        assert (out[37:] == POISON).all()


def _load_next(state, session, x_off, out_off):
    return run_op(state, session, x_off, out_off, 37, 0, (state.rank + 1) % state.world_size, "load")


# -- what GPUs record instead of raising ---------------------------------------------
@triton.jit
def record_kernel(context_ptr, x_ptr, shift, peer, W: tl.constexpr, OP: tl.constexpr, BLOCK: tl.constexpr):
    """The GPU's report of a refused access (rma._record) of the lanes at x_ptr + shift."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    from_base = tl.load(ctx.heap_bases + ctx.rank)
    offset = tl.cast(x_ptr + shift + offs, tl.uint64) - from_base
    rank = tl.full((), 0, tl.int32) + peer
    rma._record(offs == 5, offset, rank, (rank >= 0) & (rank < W), from_base, OP)


def run_record(state, session, x_off, shift, peer, op):
    heap = state.heap(session)
    x = heap.host_view(state.rank, x_off, (BLOCK,), np.int32)
    launch(record_kernel, (1,), heap.context(state.rank), x, shift, peer, W=state.world_size, OP=op, BLOCK=BLOCK)


@pytest.mark.parametrize("op, shift, peer", [("store", (64 << 20) // 4, 1), ("atomic_cas", -(1 << 20), 1),
                                             ("get", 0, 9), ("load", 0, -3)])
def test_gpu_status_word_names_op_rank_and_offset(sim_heap, op, shift, peer):
    world_size = 2
    heap, x_off, _ = poisoned_heap(sim_heap, world_size)
    get_world(world_size).call(1, run_record, heap.session, x_off, shift, peer, status.OP_CODES[op])
    (rank, word), = heap.take_errors()
    assert rank == 1 and heap.take_errors() == []  # taken: cleared
    info = status.decode(word)
    offset = x_off + 4 * (shift + 5)
    assert info == {"op": op, "rank": peer, "offset": offset, "rank_error": not 0 <= peer < world_size}
    message = str(status.error_from_word(word, rank, heap.heap_size))
    if info["rank_error"]:
        assert f"on rank 1: {op} with rank {peer}, which is outside" in message
    else:
        assert f"on rank 1: {op} to rank {peer} through a pointer at byte offset {offset}" in message


def test_status_word_round_trip():
    for op in status.OPS:
        for rank, offset, rank_error in [(0, 0, False), (5, -(1 << 39), False), (-1, (1 << 39) - 1, True),
                                         ((1 << 14) - 1, 123, False)]:
            word = status.encode(op, rank, offset, rank_error)
            assert 0 < word < 1 << 63
            assert status.decode(word) == {"op": op, "rank": rank, "offset": offset, "rank_error": rank_error}
    assert status.decode(0) is None


# -- checked mode --------------------------------------------------------------------
def checked_in_worker(state):
    from iris_core.sim import checks

    return checks.CHECKED


def test_the_suite_runs_the_simulator_in_checked_mode():
    assert get_world(2).call(0, checked_in_worker)


@pytest.mark.parametrize("world_size", [2, 4])
def test_checked_mode_names_an_access_past_its_allocation(sim_heap, world_size):
    """37 valid elements of a 64-element tile stored unmasked into a 40-element array: the
    lanes past the array (inside the heap, in the next allocation) are refused."""
    heap = sim_heap(world_size)
    x_off = heap.allocate(40 * 4)
    after = heap.allocate(BLOCK * 4)  # the next allocation, which the overrun would corrupt
    for r in range(world_size):
        heap.host_view(r, 0, (heap.heap_size // 4,), np.int32)[64:] = POISON
    with pytest.raises(NotOnHeapError) as info:
        get_world(world_size).call(world_size - 1, run_op, heap.session, x_off, after, BLOCK, 0, 0, "store")
    message = str(info.value)
    assert (f"checked mode: kernel one_op on rank {world_size - 1}: store to rank 0 at heap offset {x_off + 160} "
            "(4-byte element) is not inside a live allocation") in message, message
    assert_untouched(heap)
    # the same store, masked to the array, goes through
    get_world(world_size).call(world_size - 1, run_op, heap.session, x_off, after, 40, 0, 0, "store")
    np.testing.assert_array_equal(heap.host_view(0, x_off, (40,), np.int32), np.arange(40) + 1)


def test_checked_mode_names_an_access_to_freed_memory(sim_heap):
    heap = sim_heap(2)
    x_off, out_off = heap.allocate(BLOCK * 4), heap.allocate(BLOCK * 4)
    heap.free(x_off)
    with pytest.raises(NotOnHeapError, match=f"checked mode: kernel one_op on rank 0: load to rank 1 at heap offset "
                                             f"{x_off} .* not inside a live allocation"):
        get_world(2).call(0, run_op, heap.session, x_off, out_off, BLOCK, 0, 1, "load")
