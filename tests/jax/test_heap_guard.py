"""The heap guard inside jax.jit on the simulator: refused accesses are named errors.

Runs the GPU suite's scenario (tests/gpu/heap_guard.py) over the first W CPU devices: a
store through an array that is not on the heap and a store to a rank outside the world
fail with NotOnHeapError naming the kernel, op, ranks and offset; heap arrays stay
poisoned; the same program with a heap array gives numpy's values.
"""

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.gpu.heap_guard import heap_guard, heap_guard_bound
from tests.gpu.scenarios import World
from tests.jax.helpers import use_runtime


class FirstDevices(World):
    """scenarios.World over the first W devices (the test process has 8)."""

    def __init__(self, W: int, heap_size: int | None = None):
        self.runtime = use_runtime(W) if heap_size is None else use_runtime(W, heap_size=heap_size)
        self.mesh = Mesh(np.array(jax.devices()[:W]), ("i",))
        self.ranks = list(range(W))
        self.process, self.size, self.out_dir = 0, W, ""
        self.rows = NamedSharding(self.mesh, P("i"))
        self.failures, self.checks = [], 0


@pytest.mark.parametrize("W", [2, 3])
def test_refused_stores_inside_jit_are_named(W):
    world = FirstDevices(W)
    heap_guard(world)
    assert not world.failures, "\n".join(world.failures)
    assert world.checks >= 10


@pytest.mark.parametrize("W", [2, 4])
def test_the_guard_bound_is_what_is_mapped_before_and_after_a_growth(W):
    """Issue 66: a heap of 256 MiB upper bound maps 64 MiB at start: stores just past the mapped
    bytes, just below the upper bound and past it, on the caller's heap and the next rank's, are
    refused and named; after a growth the same compiled program's store at the old bound lands,
    the new bound is refused; the next call works after each (tests/gpu/heap_guard.py)."""
    world = FirstDevices(W, heap_size=256 << 20)
    assert world.runtime.heap.mapped_size == 64 << 20
    try:
        heap_guard_bound(world)
        assert not world.failures, "\n".join(world.failures)
        assert world.checks >= 40
    finally:
        iris_jax.shutdown()  # (the grown heap is not the other tests' runtime)


def test_check_heap_errors_reports_and_clears_a_gpu_status_word():
    """What GPUs leave in a status word (the simulator raises at once instead)."""
    from iris_core.heap import status
    from iris_jax.sync import check_heap_errors

    rt = use_runtime(2)
    check_heap_errors()  # nothing recorded
    word = status.encode("put", 1, 64 << 20)
    rt.heap.host_view(1, status.STATUS_OFFSET, (1,), np.int64)[0] = word
    with pytest.raises(iris_jax.NotOnHeapError, match=(
            r"on rank 1: put to rank 1 through a pointer at byte offset 67108864 from the caller's heap base, past "
            r"the heap's end \(16777216 bytes\); nothing was accessed")):
        check_heap_errors()
    check_heap_errors()  # cleared
    rt.heap.host_view(0, status.STATUS_OFFSET, (1,), np.int64)[0] = status.encode("atomic_add", 5, rank_error=True)
    with pytest.raises(iris_jax.NotOnHeapError, match="on rank 0: atomic_add with rank 5, which is outside"):
        iris_jax.barrier()  # the host barrier checks too
