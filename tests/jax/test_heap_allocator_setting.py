"""The heap-allocator setting at the runtime: validated in every model, ignored by the simulator."""

import pytest

import iris_jax
from iris_jax._runtime import backends


def test_unknown_heap_allocator_fails_before_anything_starts():
    with pytest.raises(ValueError, match=r"unknown heap allocator 'cuda'.*IRIS_HEAP_ALLOCATOR"):
        iris_jax.init(heap_allocator="cuda")


def test_domains_by_host_groups_ranks_in_first_rank_order():
    assert backends._domains_by_host([b"b", b"a", b"b", b"a"]) == ((0, 2), (1, 3))
    assert backends._domains_by_host([b"h"] * 3) == ((0, 1, 2),)
