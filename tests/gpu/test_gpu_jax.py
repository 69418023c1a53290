"""iris_jax on real GPUs, one process with every local GPU (run: pytest -m gpu)."""

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]  # one GPU: test_gpu_shared.py stands in


@pytest.fixture(scope="module")
def setup():
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()) or jax.device_count() < 2:
        pytest.fail("the gpu tests need at least 2 GPUs (they never skip)")
    import iris_jax

    rt = iris_jax.init()
    assert rt.mode == "gpu-single-process"
    mesh = jax.make_mesh((len(rt.devices),), ("i",), devices=rt.devices)
    return rt, mesh


def _smap(mesh, f, n_in, out_specs=None):
    import jax
    from jax.sharding import PartitionSpec as P

    out_specs = P("i") if out_specs is None else out_specs  # P() is falsy
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("i"),) * n_in, out_specs=out_specs))


@pytest.mark.parametrize("n,hint", [(37, None), (4096, 16), (1 << 20, 16)])
def test_remote_store_and_load(setup, n, hint):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.jax.kernels import read_local, ring_load, ring_store

    rt, mesh = setup
    W = len(rt.devices)
    sh = NamedSharding(mesh, P("i"))
    buf = iris_jax.full((W * n,), -7.0, jnp.float32, sharding=sh)
    x = jax.device_put(jax.random.normal(jax.random.key(n), (W * n,)), sh)
    out_t = jax.ShapeDtypeStruct((n,), jnp.float32)
    block = 1024
    grid = (triton_cdiv(n, block),)

    def step(buf, x):
        out = iris_jax.triton_call(buf, x, n, kernel=ring_store, out_shape=out_t, grid=grid, W=W, BLOCK=block,
                                   HINT=hint, symmetric=(0,))
        return out

    out = _smap(mesh, step, 2)(buf, x)
    expected = np.asarray(x).reshape(W, n) * 2 + np.arange(W)[:, None]
    np.testing.assert_allclose(np.asarray(out).reshape(W, n), expected, rtol=1e-6)
    local = _smap(mesh, lambda b: iris_jax.triton_call(b, n, kernel=read_local, out_shape=out_t, grid=grid,
                                                        BLOCK=block), 1)(buf)
    np.testing.assert_array_equal(np.asarray(local).reshape(W, n), np.roll(np.asarray(x).reshape(W, n), 1, axis=0))
    loaded = _smap(mesh, lambda b: iris_jax.triton_call(b, n, kernel=ring_load, out_shape=out_t, grid=grid, W=W,
                                                         BLOCK=block, symmetric=(0,)), 1)(buf)
    # the next rank's buf holds x of the rank before it: my own x
    np.testing.assert_array_equal(np.asarray(loaded).reshape(W, n), np.asarray(x).reshape(W, n))


def triton_cdiv(a, b):
    return (a + b - 1) // b


def test_atomic_hammer(setup):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.kernels import hammer

    rt, mesh = setup
    W = len(rt.devices)
    counter = iris_jax.zeros((W * 64,), jnp.int32, sharding=NamedSharding(mesh, P("i")))
    programs, iters = 132, 100
    _smap(mesh, lambda c: iris_jax.triton_call(c, kernel=hammer, out_shape=jax.ShapeDtypeStruct((programs,), jnp.int32),
                                                grid=(programs,), ITERS=iters, W=W, symmetric=(0,)), 1)(counter)
    from tests.jax.kernels import read_local

    local = _smap(mesh, lambda b: iris_jax.triton_call(b, 64, kernel=read_local, out_shape=jax.ShapeDtypeStruct((64,), jnp.int32),
                                                        grid=(1,), BLOCK=64), 1)(counter)
    assert int(np.asarray(local)[0]) == W * programs * iters


def test_heap_arrays_keep_their_blocks_until_collected(setup):
    import gc

    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    rt, mesh = setup
    W = len(rt.devices)
    sh = NamedSharding(mesh, P("i"))
    a = iris_jax.arange(W * 64, dtype=jnp.int32, sharding=sh)
    gc.collect()
    b = iris_jax.zeros((W * 64,), jnp.int32, sharding=sh)
    assert iris_jax.heap_offset(a) != iris_jax.heap_offset(b), "a's block was reused while a is alive"
    np.testing.assert_array_equal(np.asarray(a), np.arange(W * 64))
    offset = iris_jax.heap_offset(b)
    del b
    gc.collect()
    assert iris_jax.heap_offset(iris_jax.zeros((W * 64,), jnp.int32, sharding=sh)) == offset, "not freed"


def test_message_passing(setup):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.kernels import ping_pong

    rt, mesh = setup
    W = len(rt.devices)
    if W != 2:
        pytest.fail("ping-pong is written for 2 ranks")
    rounds = 101
    sh = NamedSharding(mesh, P("i"))
    flags = iris_jax.zeros((W * 128,), jnp.int32, sharding=sh)
    data = iris_jax.zeros((W * 128,), jnp.int32, sharding=sh)
    out = _smap(mesh, lambda f, d: iris_jax.triton_call(f, d, kernel=ping_pong, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                                                         grid=(1,), ROUNDS=rounds, W=W, symmetric=(0, 1)), 2)(flags, data)
    # the receiver of the last round holds `rounds`, the other rank `rounds - 1`
    assert sorted(np.asarray(out).tolist()) == [rounds - 1, rounds]


def test_fori_loop_check_vma(setup):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.jax.kernels import ring_store

    rt, mesh = setup
    W, n = len(rt.devices), 1000
    sh = NamedSharding(mesh, P("i"))
    buf = iris_jax.zeros((W * n,), jnp.float32, sharding=sh)
    x = jax.device_put(jnp.ones((W * n,)), sh)
    out_t = jax.ShapeDtypeStruct((n,), jnp.float32)

    def body(buf, x):
        def step(i, acc):
            return iris_jax.triton_call(buf, acc, n, kernel=ring_store, out_shape=out_t, grid=(1,), W=W, BLOCK=1024,
                                        HINT=None) * 0.5
        return jax.lax.fori_loop(0, 10, step, x)

    out = _smap(mesh, body, 2)(buf, x)
    # acc <- (2 acc + rank) / 2 = acc + rank/2, ten times
    expected = 1 + 10 * np.arange(W)[:, None] / 2 * np.ones((1, n))
    np.testing.assert_allclose(np.asarray(out).reshape(W, n), expected, rtol=1e-6)


def test_device_barrier(setup):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    rt, mesh = setup
    W = len(rt.devices)
    x = jax.device_put(jnp.arange(W * 3.0), NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(lambda v: iris_jax.device_barrier(v * 2), mesh=mesh, in_specs=P("i"),
                              out_specs=(P("i"), P("i"))))
    for _ in range(100):
        status, y = f(x)
    iris_jax.check_barrier(status)
    np.testing.assert_array_equal(np.asarray(y), np.arange(W * 3.0) * 2)


@pytest.mark.parametrize("mode,target", [("ffi", "iris_triton_kernel_call"), ("legacy", "triton_kernel_call_ffi")])
def test_launch_path_in_the_compiled_program(setup, monkeypatch, mode, target):
    """iris kernels reach XLA as the command-buffer-compatible FFI call (default) or, with
    IRIS_TRITON_CALL=legacy, as jaxlib's own host-launched one; both compute the same thing."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    rt, mesh = setup
    monkeypatch.setenv("IRIS_TRITON_CALL", mode)
    W, n = len(rt.devices), 301
    x = jax.device_put(jnp.arange(W * n, dtype=jnp.float32), NamedSharding(mesh, P("i")))
    f = _smap(mesh, lambda v: iris_jax.psum(v * 2, "i") + 1, 1, out_specs=P())
    assert f'custom_call_target="{target}"' in f.lower(x).compile().as_text()
    np.testing.assert_allclose(np.asarray(f(x)), np.asarray(x).reshape(W, n).sum(0) * 2 + 1, rtol=1e-6)
