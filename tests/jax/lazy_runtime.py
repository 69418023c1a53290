"""Run by test_runtime.py in a fresh process with 2 simulated CPU devices: a kernel call
with no iris_jax.init() creates the default runtime (every local device)."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax.kernels import write_rank

assert jax.device_count() == 2
assert not iris_jax.is_initialized()
mesh = jax.make_mesh((2,), ("i",))
f = jax.jit(jax.shard_map(
    lambda: iris_jax.triton_call(kernel=write_rank, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(1,), W=2),
    mesh=mesh, in_specs=(), out_specs=P("i")))
out = np.asarray(f())
rt = iris_jax.runtime()
assert iris_jax.is_initialized()
assert rt.mode == "sim-workers" and rt.world_size == 2 and rt.devices == jax.devices(), rt
np.testing.assert_array_equal(out, [0, 1])
assert iris_jax.init() is rt  # init after the lazy start returns the same runtime
print("OK lazy runtime", rt, flush=True)
