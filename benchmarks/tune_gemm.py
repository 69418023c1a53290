"""Sweeps the GEMM core's tile configuration (bfloat16) against XLA's jnp.dot on one GPU.

    python benchmarks/tune_gemm.py [--sizes 4096,8192] [--reps 20]

Each configuration (IRIS_GEMM_CONFIG="BM,BN,BK,GROUP_M,warps,stages", read by
iris_jax.ops.FusedWorkspace.config) runs iris_jax.ops.matmul on M = N = K = size, checked
against jnp.dot, timed as the median wall time of `reps` calls (a GEMM of this size takes
milliseconds, so launch overhead is noise). Prints a markdown table. GPUs only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CONFIGS = ["128,128,64,8,8,3", "128,256,64,8,8,3", "128,256,64,8,8,4", "256,128,64,8,8,3", "128,128,64,8,4,4",
           "128,128,128,8,8,3", "128,256,64,16,8,3"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,8192")
    parser.add_argument("--configs", default=";".join(CONFIGS))
    parser.add_argument("--reps", type=int, default=20)
    opts = parser.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import iris_jax
    from iris_jax import ops

    if jax.devices()[0].platform != "gpu":
        sys.exit("tune_gemm.py needs a GPU")
    iris_jax.init(devices=jax.devices()[:1])

    def median_ms(f, *args):
        f(*args).block_until_ready()
        times = []
        for _ in range(opts.reps):
            start = time.perf_counter()
            f(*args).block_until_ready()
            times.append(time.perf_counter() - start)
        return statistics.median(times) * 1e3

    print("| config (BM,BN,BK,GROUP_M,warps,stages) | size | iris (ms) | XLA (ms) | XLA/iris | iris TFLOP/s | correct |")
    print("|---|---|---|---|---|---|---|")
    for size in (int(s) for s in opts.sizes.split(",")):
        key_a, key_b = jax.random.split(jax.random.key(size))
        a = jax.random.normal(key_a, (size, size), jnp.bfloat16)
        b = jax.random.normal(key_b, (size, size), jnp.bfloat16)
        xla = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype))
        want = np.asarray(xla(a, b), np.float32)
        xla_ms = median_ms(xla, a, b)
        for config in opts.configs.split(";"):
            os.environ["IRIS_GEMM_CONFIG"] = config
            try:
                f = jax.jit(lambda a, b: ops.matmul(a, b))  # a new function: traced again with this config
                got = np.asarray(f(a, b), np.float32)
                ok = bool(np.allclose(got, want, rtol=2e-2, atol=2e-2 * np.sqrt(size)))
                ms = median_ms(f, a, b)
            except Exception as e:  # a configuration that does not compile (shared memory)
                print(f"| {config} | {size} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | | |")
                continue
            tflops = 2 * size**3 / ms / 1e9
            print(f"| {config} | {size} | {ms:.3f} | {xla_ms:.3f} | {xla_ms / ms:.2f} | {tflops:.0f} | {ok} |",
                  flush=True)


if __name__ == "__main__":
    main()
