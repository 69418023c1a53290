"""iris collectives against lax on real GPUs, one process with every GPU (pytest -m gpu)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

VARIANTS = ["auto", "one_shot", "two_shot"]


@pytest.fixture(scope="module")
def mesh():
    import jax

    import iris_jax

    if jax.device_count() < 2 or jax.devices()[0].platform != "gpu":
        pytest.fail("the gpu tests need at least 2 GPUs (they never skip)")
    rt = iris_jax.init()
    return jax.make_mesh((len(rt.devices),), ("i",), devices=rt.devices)


def _pair(mesh, iris_fn, lax_fn, x, out_specs):
    import jax
    from jax.sharding import PartitionSpec as P

    run = lambda f: np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=out_specs))(x),
                               np.float32)
    return run(iris_fn), run(lax_fn)


def _input(mesh, n, dtype, seed=0):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    W = mesh.size
    return jax.device_put(jax.random.normal(jax.random.key(seed), (W * n,), jnp.float32).astype(dtype),
                          NamedSharding(mesh, P("i")))


@pytest.mark.parametrize("n", [1, 37, 4099, 1 << 20, (1 << 28) + 3])
@pytest.mark.parametrize("variant", VARIANTS)
def test_all_reduce(mesh, n, variant):
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    for dtype in (jnp.float32, jnp.bfloat16) if n < (1 << 28) else (jnp.float32,):
        x = _input(mesh, n, dtype, seed=n)
        got, want = _pair(mesh, lambda v: iris_jax.all_reduce(v, "i", variant=variant), lambda v: lax.psum(v, "i"),
                          x, P())
        tol = 1e-5 if dtype == jnp.float32 else 3e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [37, 4099, (1 << 22) + 5])
@pytest.mark.parametrize("variant", ["ring", "atomic", "spinlock"])
def test_all_reduce_other_algorithms(mesh, n, variant):
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    x = _input(mesh, n, jnp.float32, seed=n)
    got, want = _pair(mesh, lambda v: iris_jax.all_reduce(v, "i", variant=variant), lambda v: lax.psum(v, "i"), x, P())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [5, 4099, 1 << 22])
def test_other_collectives(mesh, n):
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W = mesh.size
    perm = [(i, (i + 1) % W) for i in range(W)]
    cases = [
        (lambda v: iris_jax.pmax(v, "i"), lambda v: lax.pmax(v, "i"), P()),
        (lambda v: iris_jax.pmin(v, "i"), lambda v: lax.pmin(v, "i"), P()),
        (lambda v: iris_jax.all_gather(v, "i"), lambda v: lax.all_gather(v, "i"), P("i")),
        (lambda v: iris_jax.psum_scatter(v[: n // W * W], "i", tiled=True),
         lambda v: lax.psum_scatter(v[: n // W * W], "i", tiled=True), P("i")),
        (lambda v: iris_jax.all_to_all(v[: n // W * W], "i", 0, 0, tiled=True),
         lambda v: lax.all_to_all(v[: n // W * W], "i", 0, 0, tiled=True), P("i")),
        (lambda v: iris_jax.ppermute(v, "i", perm), lambda v: lax.ppermute(v, "i", perm), P("i")),
        (lambda v: iris_jax.broadcast(v, "i", 1), lambda v: lax.psum(v * (lax.axis_index("i") == 1), "i"), P()),
    ]
    for dtype in (jnp.float32, jnp.bfloat16, jnp.int32):
        x = _input(mesh, n, jnp.float32, seed=n) * 100
        x = x.astype(dtype)
        for iris_fn, lax_fn, spec in cases:
            got, want = _pair(mesh, iris_fn, lax_fn, x, spec)
            tol = 1e-5 if dtype != jnp.bfloat16 else 3e-2
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 100)


def test_ten_thousand_back_to_back(mesh):
    """10k psums in one fori_loop: no deadlock, no drift, workspace reuse is race-free."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W = mesh.size
    rt = iris_jax.runtime()
    x = _input(mesh, 4099, jnp.float32)
    used = rt.heap.used

    def loop(psum):
        def body(v):
            # v <- psum(v) / W + rank: the exact result depends on every iteration's data
            rank = jax.lax.axis_index("i").astype(jnp.float32)
            return jax.lax.fori_loop(0, 10_000, lambda i, v: psum(v, "i") / W + rank, v)

        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                                check_vma=False))(x)).reshape(W, -1)

    got = loop(iris_jax.psum)
    np.testing.assert_allclose(got, loop(jax.lax.psum), rtol=1e-6)
    # fixed point of v = mean(v) + rank: mean(v) + rank where mean grows by mean(rank) each step
    x0 = np.asarray(x).reshape(W, -1)
    mean = x0.mean(0)
    for _ in range(10_000):
        mean = mean + np.arange(W).mean()
    expected = mean[None, :] - np.arange(W).mean() + np.arange(W)[:, None]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-2)
    assert rt.heap.used == used
