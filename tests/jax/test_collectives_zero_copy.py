"""Zero-copy collectives: inputs already on the heap are read in place, not staged (CPU
simulator, the chunking tests' small workspace so every call spans several chunks).

The kernel decides per rank at run time (is my input inside my heap?), so the tests cover
every rank on the heap, no rank on the heap (staged, plus the closing "done" round), and a
mix. That the heap inputs really were read in place shows in the workspace: its data
buffers are poisoned first and must still hold the poison afterwards.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax._runtime.workspace import workspaces
from tests.jax.helpers import smap
from tests.jax.test_collectives import F32, POISON_BYTE, mesh_of, poison, rand, run_cases, shard
from tests.jax.test_collectives_chunking import N, _cases, small_workspace  # noqa: F401 (fixture)

G = 3


@pytest.fixture
def zero_copy_always(small_workspace):  # noqa: F811
    """small_workspace's config with zero_copy_from=0: every pulling call may read in place."""
    with iris_jax.use_config(small_workspace.replace(zero_copy_from=0)) as config:
        yield config


def _pulling_cases():
    """The cases whose algorithm may read in place (ring, atomic and spinlock push)."""
    return [c for c in _cases("i", G, F32) if not any(v in c.name for v in ("ring", "atomic", "spinlock"))]


def _staged_bytes_untouched() -> bool:
    rt = iris_jax.runtime()
    pool = workspaces(rt)
    for rank in range(rt.world_size):
        for ws in pool.allocated("collective"):
            data = rt.heap.host_view(rank, ws.offset + ws.layout.data, (2 * ws.layout.data_bytes,), np.uint8)
            if not (data == POISON_BYTE).all():
                return False
    return True


def _mixed(mesh, host, on_heap_ranks):
    """The array `host` sharded over `mesh`, with the shards of `on_heap_ranks` on the heap."""
    plain = shard(mesh, host)
    heap = iris_jax.to_heap(plain)
    devices = list(mesh.devices.flat)
    by_device = {s.device: s.data for s in plain.addressable_shards}
    for s in heap.addressable_shards:
        if devices.index(s.device) in on_heap_ranks:
            by_device[s.device] = s.data
    return jax.make_array_from_single_device_arrays(plain.shape, plain.sharding, [by_device[d] for d in devices])


@pytest.mark.parametrize("on_heap", [(0, 1, 2), (1,), ()], ids=["all-on-heap", "one-on-heap", "none-on-heap"])
def test_heap_inputs_are_read_in_place(small_workspace, zero_copy_always, on_heap, rng):  # noqa: F811
    mesh = mesh_of((G,), ("i",))
    failures = []
    for case in _pulling_cases():
        host = rand(rng, (G, *case.shape), F32)
        x = _mixed(mesh, host.reshape(G * case.shape[0], *case.shape[1:]), set(on_heap))
        assert [iris_jax.is_symmetric(s.data) for s in x.addressable_shards] == [r in on_heap for r in range(G)]
        iris = smap(mesh, case.iris, P("i"), P("i"))
        compiled = iris.trace(x).lower().compile()  # allocates the workspace, then poison it
        poison()
        got = np.asarray(compiled(x))
        want = np.asarray(smap(mesh, case.ref, P("i"), P("i"))(x))
        if not np.allclose(got, want, rtol=1e-5, atol=1e-5 * G):
            failures.append(f"{case.name}: differs from lax (max err {np.max(np.abs(got - want))})")
        if len(on_heap) == G and not _staged_bytes_untouched():
            failures.append(f"{case.name}: staged although every input was on the heap")
    assert not failures, "\n".join(failures)


def test_zero_copy_calls_chain_back_to_back(small_workspace, zero_copy_always, rng):  # noqa: F811
    """Several in-place calls on the same heap input in one jit, then staged ones: the
    closing round keeps them from overtaking each other."""
    mesh = mesh_of((G,), ("i",))
    x = iris_jax.to_heap(shard(mesh, rand(rng, (G * N,), F32)))

    def body(v):
        total = jnp.zeros_like(v)
        for k in range(4):  # each psum reads v in place; the products are staged
            total = total + iris_jax.psum(v, "i") * (k + 1)
            total = iris_jax.psum(total, "i") / G
        return total

    got = np.asarray(smap(mesh, body, P("i"), P("i"))(x))
    want = np.asarray(smap(mesh, lambda v: sum(lax.psum(v, "i") * (k + 1) for k in range(4)), P("i"), P("i"))(x))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)


def test_staged_inputs_with_the_closing_round(small_workspace, zero_copy_always, rng):  # noqa: F811
    """Every collective with zero-copy compiled in but inputs computed in the graph (staged)."""
    run_cases(mesh_of((G,), ("i",)), _cases("i", G, F32), F32, rng)
