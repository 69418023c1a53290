"""The symmetric heap's growth and statistics (iris_core.heap.symmetric), on the simulator's
shared-memory heaps: an upper bound reserved up front, memory mapped as allocations need it."""

import numpy as np
import pytest

from iris_core.errors import HeapExhaustedError
from iris_core.heap.shared_memory import SharedMemoryHeap, new_session

MiB = 1 << 20


def heap(bound=512 * MiB, mapped=64 * MiB, world=2, **options):
    return SharedMemoryHeap(world, bound, range(world), new_session("growth"), mapped_size=mapped, **options)


def test_an_allocation_past_the_mapping_grows_it_and_moves_nothing():
    with heap() as h:
        bases = list(h.heap_bases)
        small = h.allocate(MiB, owner="arrays")
        for rank in range(2):
            h.host_view(rank, small, (4,), np.float32)[:] = [rank, 1, 2, 3]
        assert h.mapped_size == 64 * MiB and h.growths == 0
        big = h.allocate(100 * MiB, zero=True, owner="workspaces")  # does not fit 64 MiB: grows
        assert h.growths == 1 and h.mapped_size == 128 * MiB  # the free end extended, to a multiple of GROWTH_STEP
        assert big + 100 * MiB <= h.mapped_size
        assert h.heap_bases == bases  # the bases never change
        for rank in range(2):  # the earlier block kept its place and its values
            assert h.host_view(rank, small, (4,), np.float32).tolist() == [rank, 1, 2, 3]
            h.host_view(rank, big + 100 * MiB - 8, (1,), np.int64)[0] = 7  # the new range is memory
        usage = h.usage()
        assert usage["arrays"] == (MiB, 1) and usage["workspaces"] == (100 * MiB, 1)
        assert h.peak_used >= 101 * MiB
        h.free(big)
        assert h.allocate(100 * MiB) == big  # reused, no second growth
        assert h.growths == 1


def test_the_upper_bound_is_the_limit_and_the_error_says_what_holds_the_heap():
    with heap(bound=128 * MiB) as h:
        h.allocate(40 * MiB, owner="arrays")
        h.allocate(50 * MiB, owner="workspaces")  # grows to the bound
        assert h.mapped_size == 128 * MiB
        with pytest.raises(HeapExhaustedError) as e:
            h.allocate(60 * MiB)
        message = str(e.value)
        assert "pass the heap's upper bound" in message, message
        assert "arrays 40.00 MiB (1)" in message and "workspaces 50.00 MiB (1)" in message, message
        assert "upper bound 128.00 MiB" in message and "IRIS_HEAP_SIZE" in message, message


def test_a_rank_that_cannot_grow_fails_the_growth_everywhere_and_changes_nothing():
    with heap(device_memory={1: 96 * MiB}) as h:  # rank 1's simulated device has 96 MiB
        h.allocate(32 * MiB)
        before = (h.mapped_size, h.allocator.used, h.largest_free_block)
        with pytest.raises(HeapExhaustedError, match="rank 1's simulated device has 96.00 MiB"):
            h.allocate(64 * MiB)  # needs a mapping of 128 MiB
        assert (h.mapped_size, h.allocator.used, h.largest_free_block) == before
        assert h.allocate(16 * MiB) is not None  # what fits still fits


def test_a_peer_process_that_cannot_grow_fails_it_here_too():
    """`agree` (the runtime's: every process's outcome through the store) reports another
    process's failure: this process undoes its own growth and raises."""
    with heap() as h:
        undone = []
        h._unmap = lambda old, new: undone.append((old, new))
        h.agree = lambda failure: [failure] if failure else ["rank 3: out of memory"]
        with pytest.raises(HeapExhaustedError, match="rank 3: out of memory; nothing was changed"):
            h.allocate(100 * MiB)
        assert undone == [(64 * MiB, 128 * MiB)] and h.mapped_size == 64 * MiB


def test_an_attaching_process_maps_the_whole_bound():
    """A worker (no local ranks) maps the upper bound of every rank, so it reaches the bytes an
    owner's growth adds without mapping anything again."""
    with heap(world=2) as owner:
        peer = SharedMemoryHeap(2, owner.heap_size, (), owner.session)
        try:
            offset = owner.allocate(200 * MiB)  # grows
            owner.host_view(1, offset + 200 * MiB - 4, (1,), np.int32)[0] = 42
            assert peer.host_view(1, offset + 200 * MiB - 4, (1,), np.int32)[0] == 42
        finally:
            peer.close()
