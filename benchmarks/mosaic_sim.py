"""What a Mosaic GPU multi-device kernel costs on the simulator (issue 67: at most 2x JAX's own
interpreter on the same kernel with its remote parts made local; the race detector at most 5x more).

    python benchmarks/mosaic_sim.py [--devices 2,4,8] [--rows 1,64] [--reps 10]     # jax 0.12 (newest stack)

Kernels, each `plgpu.kernel` under `jax.shard_map` over the first N CPU devices, timed per call
(median of `--reps` after a warm-up; compilation left out):

* ring: each device stores its rows into the next device's output through `plgpu.remote_ref`,
  signals that device's semaphore and waits for its own (iris's rules run the remote store and
  the semaphores);
* local: the same kernel with its remote parts made local (its rows into its own output, a signal
  of its own semaphore and the wait): JAX's interpreter alone;

each without and with `detect_races=True`. Prints ms per call and the ratios ring / local and
detection on / off.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import small  # noqa: E402

L = 128


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="2,4,8")
    parser.add_argument("--rows", default="1,64", help="rows of 128 float32 per device")
    parser.add_argument("--reps", type=int, default=10)
    small.add_flag(parser, "2 devices, one row, one call each (on JAX without the interpreter: says so)")
    opts = parser.parse_args()
    if opts.small:
        opts.devices, opts.rows, opts.reps = "2", "1", 1
    counts = [int(n) for n in opts.devices.split(",")]
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={max(counts)}"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import mosaic_gpu as plgpu
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from iris_jax.pallas import mosaic_gpu as iris_mgpu

    if opts.small and iris_mgpu.unsupported_reason() is not None:
        print(f"not run: {iris_mgpu.unsupported_reason()}")
        return
    iris_mgpu.require()

    def ring(x_ref, o_ref, sem):
        nxt = lax.rem(lax.axis_index("x") + 1, lax.axis_size("x"))
        plgpu.remote_ref(o_ref, {"x": nxt})[...] = x_ref[...]
        pl.semaphore_signal(sem, 1, device_id={"x": nxt})
        pl.semaphore_wait(sem, 1)

    def local(x_ref, o_ref, sem):
        o_ref[...] = x_ref[...]
        pl.semaphore_signal(sem, 1)
        pl.semaphore_wait(sem, 1)

    def timed(body, n, rows, detect):
        mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
        call = plgpu.kernel(body, out_type=jax.ShapeDtypeStruct((rows, L), jnp.float32),
                            scratch_types=[plgpu.SemaphoreType.REGULAR])
        x = jax.device_put(np.ones((n * rows, L), np.float32), NamedSharding(mesh, P("x")))
        with iris_mgpu.simulating(detect_races=detect):
            f = jax.jit(jax.shard_map(call, mesh=mesh, in_specs=P("x"), out_specs=P("x"), check_vma=False))
            jax.block_until_ready(f(x))
            times = []
            for _ in range(opts.reps):
                start = time.perf_counter()
                jax.block_until_ready(f(x))
                times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    print(f"Mosaic GPU kernels on the simulator, {os.cpu_count()} cores, jax {jax.__version__}: ms per call, "
          f"median of {opts.reps}")
    print(f"{'devices':>8}{'rows':>6}{'local':>9}{'ring':>9}{'ring/local':>12}{'local+det':>11}{'ring+det':>10}"
          f"{'det on/off':>12}")
    for n in counts:
        for rows in [int(r) for r in opts.rows.split(",")]:
            a, b = timed(local, n, rows, False), timed(ring, n, rows, False)
            c, d = timed(local, n, rows, True), timed(ring, n, rows, True)
            print(f"{n:>8}{rows:>6}{a:>9.2f}{b:>9.2f}{b / a:>11.2f}x{c:>11.2f}{d:>10.2f}{d / b:>11.2f}x", flush=True)


if __name__ == "__main__":
    main()
