"""iris_jax.pallas.mosaic_gpu: multi-device Mosaic GPU kernels, unchanged, on the CPU devices.

Each kernel runs under jax.shard_map over 2, 4 or 8 of the suite's CPU devices, its outputs
poisoned (GPU interpret mode fills them with NaN, or int minima), and is checked against lax or
numpy. Needs jax 0.12 (JAX's Mosaic GPU interpreter); on older JAX only the error is tested.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from iris_core.errors import IrisError, RankMismatchError
from iris_jax.pallas import mosaic_gpu as iris_mgpu

REASON = iris_mgpu.unsupported_reason()
needs_interpreter = pytest.mark.skipif(REASON is not None, reason=REASON or "")

if REASON is None:
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.pallas.ops.gpu import all_gather_mgpu, reduce_scatter_mgpu

L = 128  # elements per row: Mosaic GPU's collectives work in multiples of 128


@pytest.fixture
def simulated():
    """Kernels traced in the test run on the simulator; JAX's interpreter state reset after a failure."""
    with iris_mgpu.simulating(timeout_s=30):
        yield
    iris_mgpu.reset()


def mesh_1d(n):
    return jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])


def run(mesh, f, x, in_spec, out_spec):
    g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_spec, out_specs=out_spec, check_vma=False))
    return np.asarray(g(jax.device_put(x, NamedSharding(mesh, in_spec))))


def rows(n, per_device, dtype=np.float32):
    """Integer-valued rows, distinct per device (exact in every reduction order)."""
    return (np.arange(n * per_device * L) % 1000).astype(dtype).reshape(n * per_device, L)


def kernel_call(body, out_shape, dtype=jnp.float32, scratch=(plgpu.SemaphoreType.REGULAR,) if REASON is None else ()):
    return plgpu.kernel(body, out_type=jax.ShapeDtypeStruct(out_shape, dtype), scratch_types=list(scratch))


# (a) a ring: each device stores its rows into the next device's output, then signals it


def ring(x_ref, o_ref, sem):
    n = lax.axis_size("x")
    nxt = lax.rem(lax.axis_index("x") + 1, n)
    plgpu.remote_ref(o_ref, {"x": nxt})[...] = x_ref[...]
    pl.semaphore_signal(sem, 1, device_id={"x": nxt})
    pl.semaphore_wait(sem, 1)


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_remote_ref_and_semaphores(simulated, n):
    x = rows(n, 1)
    out = run(mesh_1d(n), kernel_call(ring, (1, L)), x, P("x"), P("x"))
    np.testing.assert_array_equal(out, np.roll(x, 1, axis=0))


def ring_with_global_semaphore(x_ref, o_ref):
    ring(x_ref, o_ref, pl.get_global(plgpu.SemaphoreType.REGULAR))


@needs_interpreter
def test_ring_through_pallas_call_with_mosaic_gpu_params(simulated):
    n = 4
    call = pl.pallas_call(
        ring_with_global_semaphore,
        out_shape=jax.ShapeDtypeStruct((1, L), jnp.float32),
        compiler_params=plgpu.CompilerParams(),
    )
    x = rows(n, 1)
    np.testing.assert_array_equal(run(mesh_1d(n), call, x, P("x"), P("x")), np.roll(x, 1, axis=0))


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_through_pallas_call_with_a_semaphore_in_scratch_shapes(simulated, n):
    call = pl.pallas_call(
        ring,
        out_shape=jax.ShapeDtypeStruct((1, L), jnp.float32),
        scratch_shapes=[plgpu.SemaphoreType.REGULAR],
        compiler_params=plgpu.CompilerParams(),
    )
    x = rows(n, 1)
    np.testing.assert_array_equal(run(mesh_1d(n), call, x, P("x"), P("x")), np.roll(x, 1, axis=0))


@needs_interpreter
def test_simulate_switches_interpret_mode_on_globally():
    n = 2
    iris_mgpu.simulate()
    try:
        out = run(mesh_1d(n), kernel_call(ring, (1, L)), rows(n, 1), P("x"), P("x"))
    finally:
        plgpu.set_gpu_interpret_mode(None)
    np.testing.assert_array_equal(out, np.roll(rows(n, 1), 1, axis=0))


# (b), (c) JAX's own Mosaic GPU collectives, unchanged


@needs_interpreter
def test_cpu_devices_report_a_settable_core_count():
    """Mosaic GPU ops default their block count to the device's SM count: CPU devices report one."""
    n = 2
    with iris_mgpu.simulating(core_count=3):
        assert [d.core_count for d in jax.devices()] == [3] * len(jax.devices())
        x = rows(n, 4)
        got = run(mesh_1d(n), lambda v: all_gather_mgpu.all_gather(v, axis_name="x"), x, P("x"), P("x"))
    iris_mgpu.reset()
    expected = run(mesh_1d(n), lambda v: lax.all_gather(v, "x", tiled=True), x, P("x"), P("x"))
    np.testing.assert_array_equal(got, expected)
    with pytest.raises(ValueError, match="core_count must be a positive int"):
        iris_mgpu.simulate(core_count=0)


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_jax_all_gather_mgpu(simulated, n):
    x = rows(n, 4)
    gather = lambda v: all_gather_mgpu.all_gather(v, axis_name="x", num_blocks=2 if n == 4 else 1)  # noqa: E731
    expected = run(mesh_1d(n), lambda v: lax.all_gather(v, "x", tiled=True), x, P("x"), P("x"))
    np.testing.assert_array_equal(run(mesh_1d(n), gather, x, P("x"), P("x")), expected)


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("scatter_dimension", [None, 0])
def test_jax_reduce_scatter_mgpu(simulated, n, scatter_dimension):
    x = rows(n, n)
    scatter = lambda v: reduce_scatter_mgpu.reduce_scatter(  # noqa: E731
        v, axis_name="x", scatter_dimension=scatter_dimension, num_blocks=1
    )
    if scatter_dimension is None:
        reference = lambda v: lax.psum(v, "x")  # noqa: E731
    else:
        reference = lambda v: lax.psum_scatter(v, "x", scatter_dimension=0, tiled=True)  # noqa: E731
    expected = run(mesh_1d(n), reference, x, P("x"), P("x"))
    np.testing.assert_array_equal(run(mesh_1d(n), scatter, x, P("x"), P("x")), expected)


# (d) a 2D mesh: tuple ids, dict ids naming one axis, and a dict id over both axes joined


def three_neighbours(x_ref, o_ref, sem):
    a, b = lax.axis_index("a"), lax.axis_index("b")
    size_a, size_b = lax.axis_size("a"), lax.axis_size("b")
    targets = [
        (a, lax.rem(b + 1, size_b)),  # a tuple of mesh coordinates
        {"a": lax.rem(a + 1, size_a)},  # a dict naming one axis: b is ours
        {("a", "b"): lax.rem(a * size_b + b + 1, size_a * size_b)},  # both axes as one
    ]
    for slot, target in enumerate(targets):
        plgpu.remote_ref(o_ref.at[pl.ds(slot, 1)], target)[...] = x_ref[...]
        pl.semaphore_signal(sem, 1, device_id=target)
    pl.semaphore_wait(sem, 3)


@needs_interpreter
@pytest.mark.parametrize("shape", [(2, 2), (2, 4)])
def test_2d_mesh_tuple_and_dict_device_ids(simulated, shape):
    size_a, size_b = shape
    n = size_a * size_b
    mesh = jax.make_mesh(shape, ("a", "b"), devices=jax.devices()[:n])
    x = rows(n, 1)
    out = run(mesh, kernel_call(three_neighbours, (3, L)), x, P(("a", "b")), P(("a", "b"))).reshape(n, 3, L)
    grid = x.reshape(size_a, size_b, L)
    expected = np.stack(
        [np.roll(grid, 1, axis=1).reshape(n, L), np.roll(grid, 1, axis=0).reshape(n, L), np.roll(x, 1, axis=0)], axis=1
    )
    np.testing.assert_array_equal(out, expected)


# (e) multimem


def gather_by_multimem(x_ref, o_ref, sem):
    n = lax.axis_size("x")
    plgpu.multimem_store(x_ref[...], o_ref.at[pl.ds(lax.axis_index("x"), 1)], "x")
    plgpu.semaphore_signal_multicast(sem, collective_axes="x")
    pl.semaphore_wait(sem, n, decrement=False)


def sum_by_multimem(x_ref, o_ref):
    o_ref[...] = plgpu.multimem_load_reduce(x_ref, collective_axes="x", reduction_op="add")


def max_by_multimem(x_ref, o_ref):
    o_ref[...] = plgpu.multimem_load_reduce(x_ref, collective_axes="x", reduction_op="max")


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_multimem_store_and_load_reduce(simulated, n):
    x = rows(n, 1)
    gathered = run(mesh_1d(n), kernel_call(gather_by_multimem, (n, L)), x, P("x"), P("x"))
    np.testing.assert_array_equal(gathered, np.tile(x, (n, 1)))
    summed = run(mesh_1d(n), kernel_call(sum_by_multimem, (1, L), scratch=()), x, P("x"), P("x"))
    np.testing.assert_array_equal(summed, np.tile(x.sum(axis=0, keepdims=True), (n, 1)))
    ints = rows(n, 1, np.int32)[::-1].copy()
    largest = run(mesh_1d(n), kernel_call(max_by_multimem, (1, L), jnp.int32, scratch=()), ints, P("x"), P("x"))
    np.testing.assert_array_equal(largest, np.tile(ints.max(axis=0, keepdims=True), (n, 1)))


@needs_interpreter
def test_multimem_over_part_of_the_mesh_is_refused(simulated):
    mesh = jax.make_mesh((2, 2), ("a", "b"), devices=jax.devices()[:4])

    def store_along_a(x_ref, o_ref):
        plgpu.multimem_store(x_ref[...], o_ref, "a")

    with pytest.raises(NotImplementedError, match=re.escape("Only collective_axes that include all JAX device mesh")):
        run(mesh, kernel_call(store_along_a, (1, L), scratch=()), rows(4, 1), P(("a", "b")), P(("a", "b")))


# (f) a wait that no one signals fails, naming itself


def wait_forever(x_ref, o_ref, sem):
    o_ref[...] = x_ref[...]

    @pl.when(lax.axis_index("x") == 0)
    def _():
        pl.semaphore_wait(sem, 1)  # no one signals it: the other device finishes and waits at the end


@needs_interpreter
def test_unsignalled_wait_fails_with_its_place():
    with iris_mgpu.simulating(timeout_s=0.5), pytest.raises(Exception) as caught:
        run(mesh_1d(2), kernel_call(wait_forever, (1, L)), rows(2, 1), P("x"), P("x"))
    iris_mgpu.reset()
    text = str(caught.value)
    assert "semaphore_wait in Mosaic GPU kernel 'wait_forever' at " in text, text
    assert "test_pallas_mosaic_gpu.py" in text and "on device 0 timed out after 0.5 s" in text, text
    assert "the semaphore's count is 0, waiting for 1" in text, text


# (f) atomics into a peer's ref, and pl.semaphore_read


def atomic_sum_into_device_0(x_ref, o_ref, count_ref, ready, done):
    """Every device atomically adds its row into device 0's first output row and maxes it into the second,
    once device 0 has zeroed them; device 0 then waits for all of them and reads the semaphore's count."""
    n = lax.axis_size("x")
    me = lax.axis_index("x")
    o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(me == 0)
    def _():
        for d in range(n):
            pl.semaphore_signal(ready, 1, device_id={"x": d})

    pl.semaphore_wait(ready, 1)
    plgpu.atomic_add(plgpu.remote_ref(o_ref, {"x": 0}).at[pl.ds(0, 1)], x_ref[...])
    plgpu.atomic_max(plgpu.remote_ref(o_ref, {"x": 0}).at[pl.ds(1, 1)], x_ref[...])
    pl.semaphore_signal(done, 1, device_id={"x": 0})

    @pl.when(me == 0)
    def _():
        pl.semaphore_wait(done, n, decrement=False)
        count_ref[0] = pl.semaphore_read(done)


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_atomics_into_a_peers_ref_and_semaphore_read(simulated, n):
    kernel = plgpu.kernel(
        atomic_sum_into_device_0,
        out_type=(jax.ShapeDtypeStruct((2, L), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.int32)),
        scratch_types=[plgpu.SemaphoreType.REGULAR, plgpu.SemaphoreType.REGULAR],
    )
    mesh = mesh_1d(n)
    x = rows(n, 1)
    g = jax.jit(jax.shard_map(kernel, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x")), check_vma=False))
    out, count = map(np.asarray, g(jax.device_put(x, NamedSharding(mesh, P("x")))))
    np.testing.assert_array_equal(out[:2], np.stack([x.sum(axis=0), x.max(axis=0)]))
    np.testing.assert_array_equal(out[2:], np.zeros((2 * n - 2, L), np.float32))
    assert count[0] == n


# (f') a persistent grid: blocks that wait on each other run at once where a GPU keeps them resident


def blocks_meet(x_ref, o_ref):
    """Every block signals the device's semaphore, then waits for all of them: on a GPU this ends
    only when the grid's blocks are resident at once, as a grid of at most one block per SM is."""
    sem = pl.get_global(plgpu.SemaphoreType.REGULAR)
    pl.semaphore_signal(sem, 1)
    pl.semaphore_wait(sem, lax.axis_size("b"), decrement=False)
    b = lax.axis_index("b")
    o_ref.at[pl.ds(b, 1)][...] = x_ref.at[pl.ds(b, 1)][...] + 1


def meeting_blocks(blocks):
    return plgpu.kernel(blocks_meet, out_type=jax.ShapeDtypeStruct((blocks, L), jnp.float32), grid=(blocks,),
                        grid_names=("b",))


@needs_interpreter
@pytest.mark.parametrize("n, blocks", [(2, 2), (2, 4), (4, 4)])
def test_a_grid_that_fits_the_sms_is_resident(n, blocks):
    with iris_mgpu.simulating(timeout_s=30, core_count=blocks):
        x = rows(n, blocks)
        out = run(mesh_1d(n), meeting_blocks(blocks), x, P("x"), P("x"))
    iris_mgpu.reset()
    np.testing.assert_array_equal(out, x + 1)


@needs_interpreter
def test_a_grid_larger_than_the_sms_runs_in_waves_and_its_wait_is_named():
    """More blocks than SMs: a GPU runs them in waves, so blocks that wait for all the others never end;
    here the wait fails within its timeout, saying why the blocks did not run at once."""
    with iris_mgpu.simulating(timeout_s=0.5, core_count=2), pytest.raises(Exception) as caught:
        run(mesh_1d(2), meeting_blocks(3), rows(2, 3), P("x"), P("x"))
    iris_mgpu.reset()
    text = str(caught.value)
    assert "semaphore_wait in Mosaic GPU kernel 'blocks_meet' at " in text, text
    assert "the semaphore's count is 1, waiting for 3" in text, text
    assert "the grid's 3 blocks run one after another: more than the device's core_count (2)" in text, text


@needs_interpreter
@pytest.mark.parametrize("n", [2])  # 4 devices hung 1 run in 5 with the CPUs loaded (benchmarks/RESULTS.md)
def test_jax_collective_matmul(n):
    """JAX's all_gather_lhs_matmul: every block of a device waits for a signal from every block of the
    previous one, so it ends only with its grid resident. It needs all of its process's devices, so it runs
    in a process of its own: n devices of 2 blocks of 3 warpgroups, within XLA's CPU pool without
    PJRT_NPROC (larger grids, measured: benchmarks/RESULTS.md)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PJRT_NPROC", "NPROC")}
    script = os.path.join(os.path.dirname(__file__), "mosaic_collective_matmul.py")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, script, str(n), "2", "60"], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    error = float(re.search(r"relative error (\S+)", done.stdout).group(1))
    assert error < 1e-2, done.stdout  # bfloat16 outputs: a unit in the last place is 2**-8 of the value


@needs_interpreter
def test_threads_waiting_in_xla_to_start_are_named(monkeypatch):
    """XLA runs at most 32 computations of one CPU device at once; a thread whose computation waits for a
    slot is counted, and a wait's timeout then names that instead of a missing signal."""
    import threading

    from jax._src.pallas.mosaic.interpret import thread_map
    from jax.experimental import io_callback

    from iris_jax.pallas.mosaic_gpu import interpreter

    interpreter.install()
    monkeypatch.setattr(interpreter, "_PER_DEVICE", 64)  # every thread's computation on CPU device 0
    release, entered, lock = threading.Event(), [0], threading.Lock()

    def block(x):
        with lock:
            entered[0] += 1
        release.wait(60)
        return x

    closed = jax.make_jaxpr(lambda x: io_callback(block, jax.ShapeDtypeStruct((), jnp.int32), x))(np.int32(0))
    threads = [threading.Thread(target=thread_map._run_jaxpr, args=(closed.jaxpr, closed.consts, np.int32(i)))
               for i in range(34)]
    for t in threads:
        t.start()
    try:
        for _ in range(600):
            if entered[0] >= 32 - 1 and interpreter._unstarted_threads() >= 2:
                break
            release.wait(0.05)
        unstarted = interpreter._unstarted_threads()
        site = interpreter._Site("'k'", "k.py:1")
        message = interpreter._wait_timeout_message(site, 0, 0, 1, 1.0)
    finally:
        release.set()
        for t in threads:
            t.join(60)
    assert unstarted >= 2, (unstarted, entered)
    assert f"{unstarted} of the kernel's threads are still waiting inside XLA to start" in message, message


# (g) device ids outside the mesh, and the GPU path's own checks


@needs_interpreter
def test_a_partially_manual_shard_map_is_refused_naming_the_kernel(simulated):
    mesh = jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:4],
                         axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    f = jax.jit(jax.shard_map(kernel_call(ring, (1, L)), mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                              axis_names={"x"}, check_vma=False))
    with pytest.raises(NotImplementedError, match=r"kernel 'ring' is in a partially manual shard_map \(manual axes "
                       r"\['x'\], automatic \['y'\] of the mesh \{'x': 2, 'y': 2\}\)"):
        f(jax.device_put(rows(2, 1), NamedSharding(mesh, P("x"))))


def store_to(device_id):
    def kernel(x_ref, o_ref):
        o_ref[...] = x_ref[...]
        plgpu.remote_ref(o_ref, device_id(lax.axis_index("x")))[...] = x_ref[...]

    return kernel


@needs_interpreter
def test_device_id_outside_the_mesh_is_named_before_anything_runs(simulated):
    kernel = kernel_call(store_to(lambda me: {"x": 5}), (1, L), scratch=())
    with pytest.raises(
        RankMismatchError,
        match=re.escape("names device_id {'x': 5}, which is outside the mesh {'x': 4}: 'x' must be in [0, 4), got 5"),
    ):
        run(mesh_1d(4), kernel, rows(4, 1), P("x"), P("x"))


@needs_interpreter
def test_device_id_outside_the_mesh_at_run_time_is_named():
    kernel = kernel_call(store_to(lambda me: {"x": me + 2}), (1, L), scratch=())
    with iris_mgpu.simulating(), pytest.raises(Exception) as caught:
        run(mesh_1d(2), kernel, rows(2, 1), P("x"), P("x"))
    iris_mgpu.reset()
    assert re.search(
        r"on device [01] names device_id \{'x': [23]\}, which is outside the mesh \{'x': 2\}: "
        r"'x' must be in \[0, 2\)",
        str(caught.value),
    ), str(caught.value)


@needs_interpreter
def test_a_mesh_not_in_device_id_order_is_refused_for_kernels_that_reach_peers(simulated):
    """Mosaic GPU's lowering refuses it (device ids are NVSHMEM's PE ids): the same error, before anything
    runs; a kernel that stays on its device runs on such a mesh."""
    mesh = jax.sharding.Mesh(jax.devices()[:2][::-1], ("x",))
    x = rows(2, 1)
    with pytest.raises(NotImplementedError, match=r"row-major device ids\. Got: \[1 0\]"):
        run(mesh, kernel_call(ring, (1, L)), x, P("x"), P("x"))
    copy = kernel_call(lambda x_ref, o_ref, sem: o_ref.__setitem__(..., x_ref[...] + 1), (1, L))
    np.testing.assert_array_equal(run(mesh, copy, x, P("x"), P("x")), x + 1)


@needs_interpreter
def test_gpu_device_id_checks(simulated):
    wrong_count = kernel_call(store_to(lambda me: (me, me)), (1, L), scratch=())
    with pytest.raises(
        ValueError, match="Number of device ids must match the number of mesh axes, but got 2 ids for a 1D mesh"
    ):
        run(mesh_1d(2), wrong_count, rows(2, 1), P("x"), P("x"))

    def logical_dict(x_ref, o_ref, sem):
        pl.semaphore_signal(sem, 1, device_id={"x": 0}, device_id_type=pl.DeviceIdType.LOGICAL)

    with pytest.raises(ValueError, match="`device_id_type` must be MESH if `device_id` is a dict"):
        run(mesh_1d(2), kernel_call(logical_dict, (1, L)), rows(2, 1), P("x"), P("x"))


# (h) races: remote accesses, semaphores as release / acquire, multimem (simulate(detect_races=True))


@pytest.fixture
def detecting():
    """Kernels traced in the test run on the simulator with the race detector on."""
    with iris_mgpu.simulating(timeout_s=30, detect_races=True):
        yield
    iris_mgpu.reset()


def handshake_ring(bug):
    """Each device still reads its own output, tells the device before it that the buffer is free,
    waits for the next device's word that its buffer is free, stores its rows there and signals."""

    def kernel(x_ref, o_ref, free, arrived):
        n, me = lax.axis_size("x"), lax.axis_index("x")
        nxt, prev = lax.rem(me + 1, n), lax.rem(me + n - 1, n)
        o_ref[...] = o_ref[...]  # the buffer in use (a read, and a plain write back)
        pl.semaphore_signal(free, 1, device_id={"x": prev})
        if bug != "write_before_free":
            pl.semaphore_wait(free, 1)
        plgpu.remote_ref(o_ref, {"x": nxt})[...] = x_ref[...]
        pl.semaphore_signal(arrived, 1, device_id={"x": nxt})
        if bug == "read_before_wait":
            o_ref[...] = o_ref[...] * 1  # BUG: reads what the previous device writes before waiting for it
        pl.semaphore_wait(arrived, 1)
        if bug == "write_before_free":
            pl.semaphore_wait(free, 1)  # BUG: only now, after the store into the next device's buffer

    return kernel_call(kernel, (1, L), scratch=(plgpu.SemaphoreType.REGULAR,) * 2)


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("bug", ["read_before_wait", "write_before_free"])
def test_seeded_races_are_named(detecting, n, bug):
    with pytest.raises(Exception) as caught:
        run(mesh_1d(n), handshake_ring(bug), rows(n, 1), P("x"), P("x"))
    text = str(caught.value)
    assert re.search(r"RaceError: data race on device \d+'s o_ref \(GMEM buffer \d+\)", text), text
    lines = re.findall(r"(load|store) by device (\d+), block 0, warpgroup 0 at \S*test_pallas_mosaic_gpu.py:(\d+)", text)
    assert len(lines) == 2 and lines[0][1] != lines[1][1], text  # two devices' accesses, each with its line
    assert "pl.semaphore_signal after its access" in text, text


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_correct_kernels_report_no_race(detecting, n):
    x = rows(n, 1)
    np.testing.assert_array_equal(run(mesh_1d(n), handshake_ring(None), x, P("x"), P("x")), np.roll(x, 1, axis=0))
    np.testing.assert_array_equal(run(mesh_1d(n), kernel_call(ring, (1, L)), x, P("x"), P("x")), np.roll(x, 1, axis=0))
    y = rows(n, 4)
    gather = lambda v: all_gather_mgpu.all_gather(v, axis_name="x", num_blocks=1)  # noqa: E731
    expected = run(mesh_1d(n), lambda v: lax.all_gather(v, "x", tiled=True), y, P("x"), P("x"))
    np.testing.assert_array_equal(run(mesh_1d(n), gather, y, P("x"), P("x")), expected)
    z = rows(n, n)
    scatter = lambda v: reduce_scatter_mgpu.reduce_scatter(v, axis_name="x", scatter_dimension=0, num_blocks=1)  # noqa: E731
    expected = run(mesh_1d(n), lambda v: lax.psum_scatter(v, "x", scatter_dimension=0, tiled=True), z, P("x"), P("x"))
    np.testing.assert_array_equal(run(mesh_1d(n), scatter, z, P("x"), P("x")), expected)


def ring_on_a_kept_semaphore(bug):
    """A ring whose semaphore outlives the launch (plgpu.alloc_semaphore), run twice: each device stores into
    the next device's output, signals it, waits for its own store and doubles what arrived. With the bug the
    wait leaves its count, so the second launch's wait returns at once, before the store it waits for."""

    def kernel(arrived, x_ref, o_ref):
        nxt = lax.rem(lax.axis_index("x") + 1, lax.axis_size("x"))
        plgpu.remote_ref(o_ref, {"x": nxt})[...] = x_ref[...]
        pl.semaphore_signal(arrived, 1, device_id={"x": nxt})
        pl.semaphore_wait(arrived, 1, decrement=bug is None)  # BUG (decrement=False): the count stays
        o_ref[...] = o_ref[...] * 2

    call = plgpu.kernel(kernel, out_type=jax.ShapeDtypeStruct((1, L), jnp.float32))

    def twice(x):
        arrived = plgpu.alloc_semaphore(())
        return call(arrived, call(arrived, x))

    return twice


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_semaphore_reused_across_two_launches_is_named(detecting, n):
    with pytest.raises(Exception) as caught:
        run(mesh_1d(n), ring_on_a_kept_semaphore("decrement=False"), rows(n, 1), P("x"), P("x"))
    text = str(caught.value)
    assert re.search(r"RaceError: data race on device \d+'s o_ref \(GMEM buffer \d+\)", text), text
    assert re.search(r"device \d+'s semaphore_wait at \S*test_pallas_mosaic_gpu.py:\d+:\d+ \(\S+\) returned on a count "
                     r"of 1 left by an earlier launch", text), text


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_a_semaphore_kept_across_launches_holds_its_count(detecting, n):
    """The correct ring on a kept semaphore reports nothing and gives the ring's values; a semaphore from
    plgpu.alloc_semaphore keeps its count from one launch to the next, as on a GPU."""
    x = rows(n, 1)
    out = run(mesh_1d(n), ring_on_a_kept_semaphore(None), x, P("x"), P("x"))
    np.testing.assert_array_equal(out, 4 * np.roll(x, 2, axis=0))

    def count(sem, o_ref):
        pl.semaphore_signal(sem, 3)
        o_ref[0] = pl.semaphore_read(sem)

    counted = plgpu.kernel(count, out_type=jax.ShapeDtypeStruct((1,), jnp.int32))

    def two_launches(v):
        sem = plgpu.alloc_semaphore(())
        return jnp.concatenate([counted(sem), counted(sem), v[:1]])

    out = run(mesh_1d(n), two_launches, np.zeros(n, np.int32), P("x"), P("x"))
    np.testing.assert_array_equal(out, np.tile([3, 6, 0], n))


def atomic_without_handshake(x_ref, o_ref, done):
    """Each device stores its own output while the previous device atomically adds into it: nothing orders
    the plain store and the atomic."""
    n, me = lax.axis_size("x"), lax.axis_index("x")
    o_ref[...] = x_ref[...]
    plgpu.atomic_add(plgpu.remote_ref(o_ref, {"x": lax.rem(me + 1, n)}), x_ref[...])
    pl.semaphore_signal(done, 1, device_id={"x": lax.rem(me + 1, n)})
    pl.semaphore_wait(done, 1)


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_an_atomic_racing_a_plain_store_is_named(detecting, n):
    with pytest.raises(Exception) as caught:
        run(mesh_1d(n), kernel_call(atomic_without_handshake, (1, L)), rows(n, 1), P("x"), P("x"))
    text = str(caught.value)
    assert "RaceError: data race on device " in text, text
    kinds = re.findall(r"(atomic|store) by device (\d+), block 0, warpgroup 0 at \S*test_pallas_mosaic_gpu.py:\d+", text)
    assert sorted(kind for kind, _ in kinds) == ["atomic", "store"] and kinds[0][1] != kinds[1][1], text


@needs_interpreter
@pytest.mark.parametrize("n", [2, 4, 8])
def test_atomics_among_themselves_report_no_race(detecting, n):
    """Every device's atomics into device 0's rows are unordered with each other, as on a GPU that is fine;
    device 0's zeroing comes before its signal and its read after its wait."""
    kernel = plgpu.kernel(
        atomic_sum_into_device_0,
        out_type=(jax.ShapeDtypeStruct((2, L), jnp.float32), jax.ShapeDtypeStruct((1,), jnp.int32)),
        scratch_types=[plgpu.SemaphoreType.REGULAR, plgpu.SemaphoreType.REGULAR],
    )
    mesh, x = mesh_1d(n), rows(n, 1)
    g = jax.jit(jax.shard_map(kernel, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x")), check_vma=False))
    out, _ = map(np.asarray, g(jax.device_put(x, NamedSharding(mesh, P("x")))))
    np.testing.assert_array_equal(out[:2], np.stack([x.sum(axis=0), x.max(axis=0)]))


# (h) older JAX


@pytest.mark.skipif(REASON is None, reason="this JAX has the Mosaic GPU interpreter")
def test_simulate_needs_jax_0_12():
    with pytest.raises(IrisError, match=r"needs jax >= 0\.12 .*tested with jax 0\.12\.0\.1"):
        iris_mgpu.simulate()
