"""iris_jax.triton_call inside jax.jit(jax.shard_map(...)) on the CPU simulator."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax import kernels
from tests.jax.helpers import child_env, read_heap, run_python, smap, use_runtime

N = 13  # elements per rank: odd, and smaller than BLOCK
BLOCK = 16


@pytest.fixture(params=[2, 4], ids=["w2", "w4"], scope="module")
def world(request):
    """(runtime, mesh, row sharding) over the first W devices."""
    W = request.param
    rt = use_runtime(W)
    mesh = jax.make_mesh((W,), ("i",), devices=jax.devices()[:W])
    return rt, mesh, NamedSharding(mesh, P("i"))


def read_local(mesh, buf, n, dtype):
    """Every rank's copy of `buf` (n per rank), read by a kernel (XLA has no copy of it)."""
    out = smap(mesh, lambda b: iris_jax.triton_call(b, n, kernel=kernels.read_local,
                                                      out_shape=jax.ShapeDtypeStruct((n,), dtype), grid=(1,),
                                                      BLOCK=BLOCK), P("i"), P("i"))(buf)
    return np.asarray(out).reshape(-1, n)


def test_pointer_is_the_heap_offset(world):
    rt, mesh, rows = world
    W = rt.world_size
    pad = iris_jax.zeros((W * 3,), jnp.float32, sharding=rows)  # something before it on the heap
    buf = iris_jax.zeros((W * 7,), jnp.float32, sharding=rows)
    with jax.enable_x64(True):
        f = lambda b: iris_jax.triton_call(b, kernel=kernels.heap_offset_of, grid=(1,), W=W, symmetric=(0,),
                                           out_shape=jax.ShapeDtypeStruct((2,), jnp.int64))
        out = np.asarray(smap(mesh, f, P("i"), P("i"))(buf)).reshape(W, 2)
    assert out.dtype == np.int64
    offset = iris_jax.heap_offset(buf)
    assert offset > iris_jax.heap_offset(pad)
    np.testing.assert_array_equal(out[:, 0], np.full(W, offset))
    np.testing.assert_array_equal(out[:, 1], np.arange(W))


def test_remote_store(world):
    rt, mesh, rows = world
    W = rt.world_size
    buf = iris_jax.full((W * N,), -1.0, jnp.float32, sharding=rows)
    x = jax.device_put(jax.random.normal(jax.random.key(W), (W * N,)), rows)
    f = lambda b, x: iris_jax.triton_call(b, x, N, kernel=kernels.ring_store, grid=(1,), W=W, BLOCK=BLOCK, HINT=None,
                                          out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), symmetric=(0,))
    out = np.asarray(smap(mesh, f, (P("i"), P("i")), P("i"))(buf, x)).reshape(W, N)
    xs = np.asarray(x).reshape(W, N)
    np.testing.assert_allclose(out, xs * 2 + np.arange(W)[:, None], rtol=1e-6)
    expected = np.roll(xs, 1, axis=0)  # rank r's buf holds rank r-1's x
    np.testing.assert_array_equal(read_local(mesh, buf, N, jnp.float32), expected)
    for r in range(W):
        np.testing.assert_array_equal(read_heap(buf, r, (N,), np.float32), expected[r])


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32, jnp.bfloat16])
def test_remote_load(world, dtype):
    rt, mesh, rows = world
    W = rt.world_size
    buf = iris_jax.arange(W * N, dtype=dtype, sharding=rows)
    f = lambda b: iris_jax.triton_call(b, N, kernel=kernels.ring_load, grid=(1,), W=W, BLOCK=BLOCK,
                                       out_shape=jax.ShapeDtypeStruct((N,), dtype), symmetric=(0,))
    out = np.asarray(smap(mesh, f, P("i"), P("i"))(buf)).reshape(W, N)
    expected = np.roll(np.asarray(jnp.arange(W * N, dtype=dtype)).reshape(W, N), -1, axis=0)
    np.testing.assert_array_equal(out, expected)


def test_atomics(world):
    rt, mesh, rows = world
    W = rt.world_size
    iters = 25
    counters = iris_jax.zeros((W * 6,), jnp.int32, sharding=rows)
    f = lambda c: iris_jax.triton_call(c, kernel=kernels.atomics_all, grid=(1,), W=W, ITERS=iters, symmetric=(0,),
                                       out_shape=jax.ShapeDtypeStruct((2,), jnp.int32))
    old = np.asarray(smap(mesh, f, P("i"), P("i"))(counters)).reshape(W, 2)
    final = read_local(mesh, counters, 6, jnp.int32)
    np.testing.assert_array_equal(final[:, 0], np.full(W, W * (W + 1) // 2))  # add from everyone
    np.testing.assert_array_equal(final[:, 1], np.full(W, 10 * (W - 1)))  # max
    np.testing.assert_array_equal(final[:, 5], np.full(W, -(W - 1)))  # min
    np.testing.assert_array_equal(final[:, 2], [W * iters] + [0] * (W - 1))  # contended adds, none lost
    # CAS: exactly one rank saw 0 and wrote its id; the others saw the winner's id
    cas_old = old[:, 0]
    winners = np.flatnonzero(cas_old == 0)
    assert len(winners) == 1, cas_old
    assert final[0, 3] == winners[0] + 1 and (final[1:, 3] == 0).all()
    assert set(cas_old[cas_old != 0]) <= {winners[0] + 1}
    # xchg: one writer per slot; old value 0, new value the previous rank's id
    np.testing.assert_array_equal(old[:, 1], np.zeros(W))
    np.testing.assert_array_equal(final[:, 4], np.roll(np.arange(W) + 1, 1))
    for r in range(W):
        np.testing.assert_array_equal(read_heap(counters, r, (6,), np.int32), final[r])


def test_fori_loop_with_check_vma(world):
    rt, mesh, rows = world
    W = rt.world_size
    counter = iris_jax.zeros((W,), jnp.int32, sharding=rows)
    x = jax.device_put(jnp.arange(W * N, dtype=jnp.float32), rows)

    def body(x, counter):
        step = lambda i, x: iris_jax.triton_call(x, counter, N, kernel=kernels.add_rank_bump_peer, out_shape=x,
                                                 grid=(1,), W=W, BLOCK=BLOCK, symmetric=(1,))
        return jax.lax.fori_loop(0, 10, step, x)

    out = smap(mesh, body, (P("i"), P("i")), P("i"), check_vma=True)(x, counter)
    expected = np.arange(W * N, dtype=np.float32).reshape(W, N) + 10 * (np.arange(W)[:, None] + 1)
    np.testing.assert_array_equal(np.asarray(out).reshape(W, N), expected)
    for r in range(W):  # the previous rank bumped my counter once per iteration
        np.testing.assert_array_equal(read_heap(counter, r, (1,), np.int32), [10])


def test_kernel_with_only_a_remote_effect_is_kept(world):
    rt, mesh, rows = world
    W = rt.world_size
    buf = iris_jax.zeros((W,), jnp.int32, sharding=rows)
    x = jax.device_put(jnp.arange(W * 3.0), rows)

    def f(buf, x):
        iris_jax.triton_call(buf, kernel=kernels.store_to_next, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                             grid=(1,), W=W, symmetric=(0,))  # result unused
        return x * 2

    out = smap(mesh, f, (P("i"), P("i")), P("i"))(buf, x)
    np.testing.assert_array_equal(np.asarray(out), np.arange(W * 3.0) * 2)
    expected = (np.arange(W) - 1) % W + 42
    np.testing.assert_array_equal(read_local(mesh, buf, 1, jnp.int32)[:, 0], expected)


def test_not_on_heap_concrete_raises_before_running(world):
    rt, mesh, rows = world
    W = rt.world_size
    heap = iris_jax.zeros((W,), jnp.int32, sharding=rows)
    plain = jax.device_put(jnp.zeros((W,), jnp.int32), rows)
    with pytest.raises(iris_jax.NotOnHeapError, match="argument 0 must be on the symmetric heap") as info:
        iris_jax.triton_call(plain, heap, kernel=kernels.write_peer_through, grid=(1,), W=W, symmetric=(0,),
                             out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))
    assert "iris_jax.to_heap" in str(info.value)
    with pytest.raises(IndexError, match="symmetric index 5"):
        iris_jax.triton_call(heap, heap, kernel=kernels.write_peer_through, grid=(1,), W=W, symmetric=(5,),
                             out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))
    np.testing.assert_array_equal(read_local(mesh, heap, 1, jnp.int32)[:, 0], np.zeros(W))


def test_not_on_heap_inside_jit_fails_at_run_time(world):
    rt, mesh, rows = world
    W = rt.world_size
    heap = iris_jax.zeros((W,), jnp.int32, sharding=rows)
    plain = jax.device_put(jnp.zeros((W,), jnp.int32), rows)
    f = smap(mesh, lambda s, h: iris_jax.triton_call(s, h, kernel=kernels.write_peer_through, grid=(1,), W=W,
                                                       symmetric=(0,), out_shape=jax.ShapeDtypeStruct((1,), jnp.int32)),
             (P("i"), P("i")), P("i"))
    with pytest.raises(Exception, match="symmetric") as info:
        jax.block_until_ready(f(plain, heap))  # a tracer at trace time: checked when the kernel runs
    assert "NotOnHeapError" in str(info.value)
    # nothing ran: no rank wrote into its peer's heap buffer
    np.testing.assert_array_equal(read_local(mesh, heap, 1, jnp.int32)[:, 0], np.zeros(W))
    for r in range(W):
        np.testing.assert_array_equal(read_heap(heap, r, (1,), np.int32), [0])
    # the same program with a heap array runs
    out = f(iris_jax.to_heap(plain), heap)
    np.testing.assert_array_equal(np.asarray(out), np.zeros(W))
    np.testing.assert_array_equal(read_local(mesh, heap, 1, jnp.int32)[:, 0], np.full(W, 42))


@pytest.mark.xfail(strict=True, raises=Exception, reason=(
    "library limitation: when the jitted function also returns a symmetric argument unchanged, "
    "XLA inserts copy(param) as the result and may feed that copy, not the heap buffer, to the "
    "kernel; the simulator then raises NotOnHeapError"))
def test_symmetric_argument_returned_unchanged(world):
    rt, mesh, rows = world
    W = rt.world_size
    buf = iris_jax.zeros((W,), jnp.int32, sharding=rows)

    def step(buf):
        iris_jax.triton_call(buf, kernel=kernels.store_to_next, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                             grid=(1,), W=W, symmetric=(0,))
        return buf  # e.g. `state = step(state)`

    try:
        jax.block_until_ready(smap(mesh, step, P("i"), P("i"))(buf))
    finally:
        got = read_local(mesh, buf, 1, jnp.int32)[:, 0]  # also replaces JAX's failed runtime token
    np.testing.assert_array_equal(got, (np.arange(W) - 1) % W + 42)


def test_plain_jax_triton_call_runs_on_cpu():
    import jax_triton

    use_runtime(2)
    x = jnp.arange(37, dtype=jnp.float32)
    y = jnp.linspace(-1, 1, 37, dtype=jnp.float32)
    f = jax.jit(lambda x, y: jax_triton.triton_call(x, y, 37, kernel=kernels.add_vectors, out_shape=x,
                                                    grid=(3,), BLOCK=16))
    np.testing.assert_array_equal(np.asarray(f(x, y)), np.asarray(x + y))


def test_import_keeps_triton_cache_dir_usable():
    assert os.environ.get("TRITON_CACHE_DIR") != ""
    code = "import os, iris_jax; print(repr(os.environ.get('TRITON_CACHE_DIR')))"
    for preset, expected in [(None, "None"), ("/tmp/iris-triton-cache", "'/tmp/iris-triton-cache'")]:
        result = subprocess.run([sys.executable, "-c", code], env=child_env(TRITON_CACHE_DIR=preset),
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == expected


USER_SCRIPT = '''
import jax, jax.numpy as jnp, numpy as np, triton, triton.language as tl
from jax.sharding import NamedSharding, PartitionSpec as P
import iris_jax
from iris_jax import Context
from iris_core.device import global_timer, load_acquire, nanosleep


@triton.jit
def ping(context_ptr, flag_ptr, out_ptr, W: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    ctx.atomic_xchg(flag_ptr, 1, to_rank=(ctx.rank + 1) % W, sem="release", scope="sys")
    start = global_timer()
    while load_acquire(flag_ptr) == 0:
        nanosleep(1000)
    tl.store(out_ptr, ctx.rank + 10 * (global_timer() >= start))


W = 2
iris_jax.init(devices=jax.devices()[:W])
mesh = jax.make_mesh((W,), ("i",), devices=jax.devices()[:W])
flags = iris_jax.zeros((W,), jnp.int32, sharding=NamedSharding(mesh, P("i")))
f = jax.jit(jax.shard_map(lambda fl: iris_jax.triton_call(fl, kernel=ping, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                                                          grid=(1,), W=W), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
print("got", np.asarray(f(flags)).tolist())
'''


def test_a_kernel_in_main_uses_the_simulators_intrinsics(tmp_path):
    """A user's kernel defined in `__main__` (pickled by value into each simulated rank) that
    waits with iris_core.device.load_acquire, nanosleep and global_timer: on the simulator those
    are the simulator's (they were NVIDIA's inline PTX there, which the interpreter refuses)."""
    script = tmp_path / "user_kernel.py"
    script.write_text(USER_SCRIPT)
    result = run_python([str(script)], timeout=300, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "got [10, 11]" in result.stdout, result.stdout[-3000:]


def test_a_context_decoded_for_another_world_size_is_refused(world):
    """Context.initialize(context_ptr, W) with a W other than the runtime's would read the heap
    bases from the wrong words: the simulator names both sizes before any access."""
    rt, mesh, rows = world
    W = rt.world_size
    buf = iris_jax.full((W * N,), -1.0, jnp.float32, sharding=rows)
    x = jax.device_put(jnp.arange(W * N, dtype=jnp.float32), rows)
    f = lambda b, x: iris_jax.triton_call(b, x, N, kernel=kernels.ring_store, grid=(1,), W=2 * W, BLOCK=BLOCK,
                                          HINT=None, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32),
                                          symmetric=(0,))
    with pytest.raises(Exception, match=rf"Context.initialize\(context_ptr, {2 * W}\) in a world of {W} ranks"):
        np.asarray(smap(mesh, f, (P("i"), P("i")), P("i"))(buf, x))
    for r in range(W):  # nothing was written
        np.testing.assert_array_equal(read_heap(buf, r, (N,), np.float32), np.full(N, -1.0, np.float32))
