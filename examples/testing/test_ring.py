"""ring.shift tested on 2, 4 and 8 simulated ranks: `pytest examples/testing` (pytest-iris)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import ring
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P


@pytest.mark.iris(ranks=(2, 4, 8))
def test_shift_moves_each_block_to_the_next_rank(iris_world):
    W, n = iris_world.size, 37
    x = jax.device_put(jnp.arange(W * n, dtype=jnp.float32), NamedSharding(iris_world.mesh, P("i")))
    got = ring.shift(x, iris_world.mesh)
    np.testing.assert_array_equal(got, np.roll(np.arange(W * n, dtype=np.float32).reshape(W, n), 1, 0).ravel())


@pytest.mark.iris(ranks=4)
def test_shift_is_lax_ppermute(iris_world):
    W = iris_world.size
    x = jax.device_put(jax.random.normal(jax.random.key(0), (W * 64,)), NamedSharding(iris_world.mesh, P("i")))
    ring_shift = jax.jit(jax.shard_map(lambda v: lax.ppermute(v, "i", [(r, (r + 1) % W) for r in range(W)]),
                                       mesh=iris_world.mesh, in_specs=P("i"), out_specs=P("i")))
    np.testing.assert_array_equal(ring.shift(x, iris_world.mesh), ring_shift(x))


@pytest.mark.iris(ranks=2, processes=True)
def test_shift_with_one_process_per_rank(iris_world):
    """As code written for one process per GPU runs: each rank its own process."""
    W, n = iris_world.size, 8
    x = jax.make_array_from_callback((W * n,), NamedSharding(iris_world.mesh, P("i")),
                                     lambda idx: np.arange(W * n, dtype=np.float32)[idx])
    got = ring.shift(x, iris_world.mesh)
    for shard in got.addressable_shards:
        r = shard.index[0].start // n
        np.testing.assert_array_equal(shard.data, np.arange(n, dtype=np.float32) + ((r - 1) % W) * n)
