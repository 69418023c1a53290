"""JAX's collective matmul (`all_gather_lhs_matmul`, a persistent kernel whose blocks wait for a
signal from every block of the previous device) on N simulated devices, against lax; run by
tests/jax/test_pallas_mosaic_gpu.py in a process of its own, as the kernel needs every device of
its process:

    python tests/jax/mosaic_collective_matmul.py DEVICES CORE_COUNT TIMEOUT_S

Prints the largest difference from lax.all_gather + matmul, relative to the largest value.
"""

import functools
import os
import sys

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={sys.argv[1]}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax import lax, random  # noqa: E402
from jax.experimental.pallas.ops.gpu import collective_matmul_mgpu as cm  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from iris_jax.pallas import mosaic_gpu as iris_mgpu  # noqa: E402


def main(core_count: int, timeout_s: float) -> None:
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",), axis_types=(jax.sharding.AxisType.Explicit,))
    m_shard, n_shard, k = 64, 128, 128
    with jax.set_mesh(mesh):
        k1, k2 = random.split(random.key(0))
        lhs = jax.sharding.reshard(random.normal(k1, (n * m_shard, k), jnp.bfloat16), P("x", None))
        rhs = jax.sharding.reshard(random.normal(k2, (k, n * n_shard), jnp.bfloat16), P(None, "x"))

        def run(body):
            out = jax.jit(jax.shard_map(body, out_specs=P(None, "x"), check_vma=False))(lhs, rhs)
            return jax.shard_map(lambda o: lax.all_gather(o, "x", axis=1, tiled=True), out_specs=P(None),
                                 check_vma=False)(out).astype(jnp.float32)

        expected = run(lambda a, b: lax.all_gather(a, "x", axis=0, tiled=True) @ b)
        config = cm.TuningConfig(tile_m=64, tile_n=64, tile_k=64, max_concurrent_steps=2,
                                 grid_minor_dim=cm.MatmulDimension.N, grid_tile_width=1,
                                 wg_dimension=cm.MatmulDimension.N)
        with iris_mgpu.simulating(timeout_s=timeout_s, core_count=core_count):
            got = run(functools.partial(cm.all_gather_lhs_matmul, axis_name="x", config=config, dtype=jnp.bfloat16))
        print("relative error", float(jnp.max(jnp.abs(got - expected)) / jnp.max(jnp.abs(expected))))


if __name__ == "__main__":
    main(int(sys.argv[2]), float(sys.argv[3]))
