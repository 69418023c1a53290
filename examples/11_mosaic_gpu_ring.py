"""A Pallas Mosaic GPU multi-device kernel, written for Hopper GPUs, run on the CPU simulator.

Each device stores its block into the next device's output through `plgpu.remote_ref` and
signals the next device's semaphore; it then waits for its own. Then JAX's own Mosaic GPU
all-gather (`jax.experimental.pallas.ops.gpu.all_gather_mgpu`), unchanged. Both are checked
against lax. Without GPUs one line makes them run on the CPU devices:
`iris_jax.pallas.mosaic_gpu.simulate()` (docs/pallas.md). Needs jax 0.12 (JAX's Mosaic GPU
interpreter); on older JAX the example says so and exits.

Run: python examples/11_mosaic_gpu_ring.py   (GPUs if present, else the simulator with 4 devices)
"""

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax.pallas.mosaic_gpu as iris_mgpu  # noqa: E402
from iris_core.platform import gpus_present  # noqa: E402

RUNS = gpus_present() or iris_mgpu.unsupported_reason() is None
if RUNS:  # (older JAX lacks some of these: the example then says why it cannot run)
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.experimental.pallas.ops.gpu import all_gather_mgpu

L = 128  # elements per row: Mosaic GPU's collectives work in multiples of 128


def ring(x_ref, o_ref, sem):
    """My block into the next device's output, a signal to it, then wait for my own."""
    nxt = lax.rem(lax.axis_index("x") + 1, lax.axis_size("x"))
    plgpu.remote_ref(o_ref, {"x": nxt})[...] = x_ref[...]
    pl.semaphore_signal(sem, 1, device_id={"x": nxt})
    pl.semaphore_wait(sem, 1)


def main():
    if not RUNS:
        print(f"skipped: {iris_mgpu.unsupported_reason()}")
        return
    if not gpus_present():
        iris_mgpu.simulate()  # the one line: Mosaic GPU kernels run on the CPU devices
    n = jax.device_count()
    mesh = jax.make_mesh((n,), ("x",))
    x = jax.device_put((np.arange(n * 4 * L) % 1000).astype(np.float32).reshape(n * 4, L), NamedSharding(mesh, P("x")))
    smap = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))  # noqa: E731
    kernel = plgpu.kernel(ring, out_type=jax.ShapeDtypeStruct((4, L), jnp.float32),
                          scratch_types=[plgpu.SemaphoreType.REGULAR])
    ring_lax = lambda v: lax.ppermute(v, "x", [(i, (i + 1) % n) for i in range(n)])  # noqa: E731
    np.testing.assert_array_equal(smap(kernel)(x), smap(ring_lax)(x))
    # num_blocks: its default is the GPU's SM count (device.core_count), which CPU devices lack (issue 67)
    gather = lambda v: all_gather_mgpu.all_gather(v, axis_name="x", num_blocks=1)  # noqa: E731
    np.testing.assert_array_equal(smap(gather)(x), smap(lambda v: lax.all_gather(v, "x", tiled=True))(x))
    where = "GPUs" if gpus_present() else "CPU devices (iris's simulator)"
    print(f"OK: {n} devices on {where}; a Mosaic GPU ring equals lax.ppermute, JAX's all_gather_mgpu lax.all_gather")


if __name__ == "__main__":
    main()
