"""Fixtures for the iris_core tests: symmetric heaps shared by the simulated ranks.

Rank-side functions and kernels live at module level in the test files: workers import
the test module to unpickle them, so test modules keep their top-level imports light.
"""

import pytest

from iris_core.sim import get_world


@pytest.fixture
def sim_heap():
    """`sim_heap(world_size, nbytes=1 MiB)`: a fresh heap per rank of get_world(world_size),
    closed (and removed from every worker) when the test ends."""
    heaps = []

    def create(world_size: int, nbytes: int = 1 << 20):
        heap = get_world(world_size).create_heaps(nbytes)
        heaps.append(heap)
        return heap

    yield create
    for heap in heaps:
        heap.close()

