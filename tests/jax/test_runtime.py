"""The global runtime: init/shutdown/runtime, lazy creation, execution models, peer timeouts."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import iris_jax
from iris_jax._runtime import backends
from tests.jax import kernels
from tests.jax.helpers import TEST_HEAP, run_python, use_runtime


def test_init_twice_returns_the_same_runtime():
    rt = use_runtime(2)
    assert iris_jax.is_initialized()
    assert iris_jax.init() is rt
    assert iris_jax.init(heap_size=TEST_HEAP) is rt
    assert iris_jax.init(devices=jax.devices()[:2]) is rt
    assert iris_jax.init(heap_size=TEST_HEAP, devices=jax.devices()[:2]) is rt
    assert iris_jax.runtime() is rt


def test_runtime_describes_the_simulator():
    rt = use_runtime(2)
    assert rt.mode == "sim-workers"
    assert rt.world_size == 2 and rt.heap_size == TEST_HEAP
    assert rt.devices == jax.devices()[:2]
    assert [rt.rank_of(d) for d in jax.devices()[:2]] == [0, 1]
    assert rt.heap.world_size == 2 and len(rt.heap.heap_bases) == 2
    with pytest.raises(iris_jax.RankMismatchError):
        rt.rank_of(jax.devices()[2])
    assert "sim-workers" in repr(rt)


def test_the_backend_owns_what_the_model_decides():
    """One process of CPU devices: the simulator's backend, one process for every rank."""
    rt = use_runtime(2)
    backend = rt.backend
    assert isinstance(backend, backends.SimulatorWorkers) and rt.mode == backend.mode
    assert backend.interprets_kernels and not backend.process_per_rank and not backend.speed_guides_auto
    assert backend.sm_count(rt.devices) == backends.SIM_SMS and backend.collective_warps(8) == 4
    with pytest.raises(AttributeError):
        rt.mode = backends.GPU_SINGLE  # a name for display: the backend decides
    gpu = backends.GpuMultiProcess()  # its defaults need no GPU
    assert gpu.process_per_rank and not gpu.interprets_kernels and gpu.collective_warps(8) == 8
    assert gpu.host_kernels is None and backend.host_kernels == "worker"  # GPU kernels never run on the host


def test_conflicting_init_raises_and_names_shutdown():
    rt = use_runtime(2)
    with pytest.raises(iris_jax.IrisError, match=r"shutdown\(\)") as info:
        iris_jax.init(heap_size=TEST_HEAP * 2)
    assert str(TEST_HEAP) in str(info.value)
    with pytest.raises(iris_jax.IrisError, match=r"shutdown\(\)"):
        iris_jax.init(devices=jax.devices()[:3])
    assert iris_jax.runtime() is rt  # still the same, still usable
    assert iris_jax.is_symmetric(iris_jax.zeros((3,), device=jax.devices()[1]))


def test_shutdown_then_init_with_other_settings():
    rt = use_runtime(2)
    iris_jax.shutdown()
    assert not iris_jax.is_initialized()
    assert rt.heap.closed
    iris_jax.shutdown()  # idempotent
    rt2 = iris_jax.init(heap_size=TEST_HEAP * 2, devices=jax.devices()[:2])
    assert rt2 is not rt and rt2.heap_size == TEST_HEAP * 2
    a = iris_jax.arange(6, dtype=jnp.int32, device=jax.devices()[1])
    assert iris_jax.is_symmetric(a)
    np.testing.assert_array_equal(np.asarray(a), np.arange(6))
    iris_jax.shutdown()
    rt3 = use_runtime(2)
    assert rt3.heap_size == TEST_HEAP and rt3 is iris_jax.runtime()


def _psum_over(n):
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((n,), ("i",), devices=jax.devices()[:n])
    x = jax.device_put(np.arange(n * 5, dtype=np.float32).reshape(n, 5), NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v[0], "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    return f, x, np.arange(n * 5, dtype=np.float32).reshape(n, 5).sum(0)


def test_jitted_functions_retrace_for_a_new_runtime():
    """A program holds its runtime's heap bases as constants: after shutdown and init, the
    same jitted function compiles again for the new heaps."""
    use_runtime(2)
    f, x, want = _psum_over(2)
    np.testing.assert_array_equal(np.asarray(f(x)), want)
    iris_jax.shutdown()
    use_runtime(2)
    np.testing.assert_array_equal(np.asarray(f(x)), want)
    assert f._cache_size() == 2


@pytest.mark.parametrize("mode", ["kernels", "host"])
def test_shutdown_waits_for_calls_in_flight(mode):
    """Shutting down while a collective still waits for a peer (rank 1 never calls) neither
    crashes nor hangs: shutdown waits for the call to time out, and the next runtime works.
    A collective on the host carries no kernel effect, so shutdown cannot wait for a program that
    was dispatched but had not reached it yet, and members waiting in the C meeting fail when the
    runtime closes it: such calls fail naming the shut-down runtime."""
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    use_runtime(3, sim_collectives=mode)
    mesh = jax.make_mesh((3,), ("i",), devices=jax.devices()[:3])
    x = jax.device_put(np.ones((3, 40), np.float32), NamedSharding(mesh, P("i")))
    skip_rank_1 = lambda v: lax.cond(lax.axis_index("i") == 1, lambda u: u,
                                     lambda u: iris_jax.psum(u, "i", config=iris_jax.CollectiveConfig(timeout_s=2)), v)
    f = jax.jit(jax.shard_map(lambda v: skip_rank_1(v[0])[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                              check_vma=False))
    out = f(x)  # dispatched, not waited for
    start = time.monotonic()
    iris_jax.shutdown()
    # against a hang only: 30 times the call's timeout (shutdown waits for it)
    assert time.monotonic() - start < iris_jax.CollectiveConfig().timeout_s
    named = "timed out waiting for rank 1" + ("" if mode == "kernels" else "|belongs to an iris runtime that was shut down")
    with pytest.raises(Exception, match=named):
        jax.block_until_ready(out)
    use_runtime(3)
    g, y, want = _psum_over(3)
    np.testing.assert_array_equal(np.asarray(g(y)), want)


def test_arrays_survive_shutdown_of_their_runtime():
    use_runtime(2)
    a = iris_jax.full((5,), 3.0, jnp.float32, device=jax.devices()[0])
    iris_jax.shutdown()
    np.testing.assert_array_equal(np.asarray(a), np.full(5, 3.0))  # the mapping lives with the array
    assert not iris_jax.is_symmetric(a)  # no runtime: nothing is symmetric
    del a


def test_lazy_default_runtime_in_this_process():
    """Tracing a triton_call with no runtime creates the default one (every local device)."""
    iris_jax.shutdown()
    assert not iris_jax.is_initialized()
    try:
        out = jax.eval_shape(lambda: iris_jax.triton_call(kernel=kernels.write_rank, grid=(1,), W=1,
                                                          out_shape=jax.ShapeDtypeStruct((1,), jnp.int32)))
        assert out.shape == (1,) and out.dtype == jnp.int32
        assert iris_jax.is_initialized()
        rt = iris_jax.runtime()
        assert rt.mode == "sim-workers"
        assert rt.devices == jax.local_devices() and rt.world_size == jax.local_device_count()
    finally:
        iris_jax.shutdown()  # no kernel ran: the simulator never started workers for it


def test_lazy_default_runtime():
    """A jitted triton_call without init() creates the default runtime and runs (fresh
    process with 2 devices)."""
    result = run_python(["tests/jax/lazy_runtime.py"], timeout=180,
                        XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert result.returncode == 0, result.stdout
    assert "OK lazy runtime" in result.stdout


@pytest.mark.parametrize("mode", ["init", "lazy"])
def test_missing_peer_times_out(mode):
    """A launched rank whose peer never initializes fails with PeerTimeoutError after its 2 s."""
    result = run_python(["-m", "iris_core.sim", "-n", "2", "tests/jax/launched_peer_missing.py", mode], timeout=120,
                        IRIS_RENDEZVOUS_TIMEOUT="2")  # bounded: a hang raises TimeoutExpired
    assert result.returncode != 0, result.stdout
    assert "PeerTimeoutError" in result.stdout, result.stdout
    assert "not published within 2 s" in result.stdout, result.stdout
    assert "did not start or did not initialize its heap" in result.stdout
    assert "unexpected" not in result.stdout


def test_shared_state_is_zeroed_even_where_freed_arrays_left_data():
    rt = use_runtime(2)
    dirty = iris_jax.full((4096,), -1, jnp.int32, device=jax.devices()[0])
    offset = iris_jax.heap_offset(dirty)
    del dirty  # frees the block, its bytes stay as they were
    import gc

    gc.collect()
    shared = rt.allocate_shared(4096 * 4)
    try:
        assert shared == offset, "the allocator reuses the freed block first (first fit)"
        for r in range(rt.world_size):
            assert not rt.heap.host_view(r, shared, (4096,), np.int32).any()
    finally:
        rt.heap.free(shared)


def test_the_heap_grows_past_its_first_mapping_and_moves_nothing(rng):
    """heap_size is an upper bound: the simulator maps 64 MiB at start and grows as arrays and
    workspaces need, every rank at once; arrays already on the heap keep their offsets and
    values, and a collective over arrays and a workspace in the grown range equals lax's."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    MiB = 1 << 20
    rt = use_runtime(4, heap_size=512 * MiB)
    mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    sharding = NamedSharding(mesh, P("i"))
    start, bases = iris_jax.memory_stats(), list(rt.heap.heap_bases)
    assert start["bytes_limit"] == 512 * MiB and start["bytes_mapped"] == 64 * MiB, start
    host = rng.standard_normal(4 * 1024).astype(np.float32)
    first = iris_jax.to_heap(jax.device_put(host, sharding))
    offset = iris_jax.heap_offset(first)
    filler = iris_jax.empty((4 * (64 * MiB - offset) // 4,), jnp.float32, sharding=sharding)  # past 64 MiB
    stats = iris_jax.memory_stats()
    assert stats["bytes_mapped"] > 64 * MiB and stats["num_growths"] == start["num_growths"] + 1, stats
    assert stats["arrays_bytes_in_use"] >= 64 * MiB - offset, stats
    x = iris_jax.to_heap(jax.device_put(rng.standard_normal(4 * 65536).astype(np.float32), sharding))
    assert iris_jax.heap_offset(x) >= 64 * MiB  # in the grown range
    psum = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    want = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    np.testing.assert_allclose(np.asarray(psum(x)), np.asarray(want(x)), rtol=1e-5, atol=1e-5)
    assert iris_jax.heap_offset(first) == offset
    np.testing.assert_array_equal(np.asarray(first), host)
    assert rt.heap.heap_bases == bases
    del filler
