"""A user's test suite of multi-GPU JAX code, as benchmarks/plugin_suite.py times it with and without
the race detector (pytest-iris): a tensor-parallel MLP step (lax's collectives, iris's one line),
collectives checked against lax, a user kernel ring. Not part of iris's own test run."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax


def _sharded(world, shape, seed=0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return jax.device_put(x, NamedSharding(world.mesh, P("i")))


@pytest.mark.iris(ranks=(2, 4, 8))
def test_tensor_parallel_mlp_step(iris_world):
    W, d = iris_world.size, 64
    x = np.random.default_rng(1).standard_normal((16, d)).astype(np.float32)
    w1 = _sharded(iris_world, (W * d, d), 2).reshape(W * d, d)
    w2 = _sharded(iris_world, (W * d, d), 3)

    def step(x, w1, w2, collectives):
        def body(x, a, b):
            h = jax.nn.relu(x @ a.T)
            return collectives.psum(h @ b, "i")
        return jax.jit(jax.shard_map(body, mesh=iris_world.mesh, in_specs=(P(), P("i"), P("i")), out_specs=P()))(
            x, w1, w2)

    got = step(x, w1, w2, iris_jax)
    np.testing.assert_allclose(got, step(x, w1, w2, lax), rtol=1e-4, atol=1e-4)


@pytest.mark.iris(ranks=(2, 4, 8))
@pytest.mark.parametrize("op", ["all_gather", "psum_scatter", "ppermute", "all_to_all"])
def test_collective_matches_lax(iris_world, op):
    W = iris_world.size
    x = _sharded(iris_world, (W * W * 32,))
    calls = {"all_gather": lambda m, v: m.all_gather(v, "i", tiled=True),
             "psum_scatter": lambda m, v: m.psum_scatter(v, "i", tiled=True),
             "ppermute": lambda m, v: m.ppermute(v, "i", [(r, (r + 1) % W) for r in range(W)]),
             "all_to_all": lambda m, v: m.all_to_all(v, "i", 0, 0, tiled=True)}
    out = P() if op == "all_gather" else P("i")

    def run(m):
        return jax.jit(jax.shard_map(lambda v: calls[op](m, v), mesh=iris_world.mesh, in_specs=P("i"),
                                     out_specs=out, check_vma=False))(x)

    np.testing.assert_allclose(run(iris_jax), run(lax), rtol=1e-5, atol=1e-5)


@pytest.mark.iris(ranks=(2, 4, 8))
def test_training_loop_of_ten_steps(iris_world):
    W = iris_world.size
    w = jnp.ones((32,), jnp.float32)
    xs = _sharded(iris_world, (W * 8, 32), 4)

    def loss(w, x):
        return jnp.mean((x @ w) ** 2)

    def step(m):
        def body(w, x):
            return w - 0.01 * m.pmean(jax.grad(loss)(w, x), "i")
        return jax.jit(jax.shard_map(body, mesh=iris_world.mesh, in_specs=(P(), P("i")), out_specs=P(),
                                     check_vma=False))

    got, want, ours, theirs = w, w, step(iris_jax), step(lax)
    for _ in range(10):
        got, want = ours(got, xs), theirs(want, xs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
