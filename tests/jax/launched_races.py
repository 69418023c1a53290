"""Run by test_races.py as `python -m iris_core.sim -n W launched_races.py BUG` (one process per rank,
IRIS_DETECT_RACES=warn): race_kernels.pair_exchange with seeded bug BUG (a race_kernels constant);
prints how many races the rank's detector reported, and the first."""

import sys
import warnings

import jax
import jax.numpy as jnp
import numpy as np

import iris_jax
from tests.jax import race_kernels

N = 64


def main(bug: int):
    rt = iris_jax.init()
    assert rt.mode == "sim-launched" and rt.detect_races == "warn", (rt.mode, rt.detect_races)
    (device,) = jax.devices()
    rank, world = rt.rank_of(device), rt.world_size
    data = iris_jax.zeros((N,), jnp.float32, device=device, name="data")
    flags = [iris_jax.zeros((8,), jnp.int32, device=device, name=name) for name in ("data_flag", "ack", "counter")]
    iris_jax.barrier()  # every rank zeroed its flags before any peer raises them
    x = jnp.arange(N, dtype=jnp.float32) + rank * N
    call = jax.jit(lambda *a: iris_jax.triton_call(
        *a, kernel=race_kernels.pair_exchange, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), grid=(1,),
        BUG=bug, W=world, BLOCK=N, symmetric=(0, 1, 2, 3)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = np.asarray(call(data, *flags, x))
    found = [str(w.message) for w in caught if issubclass(w.category, iris_jax.RaceWarning)]
    if bug == race_kernels.NONE and rank % 2:
        np.testing.assert_array_equal(out, 2 * (np.arange(N) + (rank - 1) * N) + 1)
    iris_jax.barrier()
    print(f"rank {rank}: RACES {len(found)}")
    if found:
        print(found[0])


if __name__ == "__main__":
    main(int(sys.argv[1]))
