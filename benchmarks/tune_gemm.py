"""Sweeps the GEMM core's tile configuration (bfloat16) against XLA's jnp.dot on one GPU.

    python benchmarks/tune_gemm.py [--shapes 1024x4096x4096,8192x8192x8192] [--reps 7]

Each configuration ("BM,BN,BK,GROUP_M,warps,stages": CollectiveConfig.gemm_config, as
IRIS_GEMM_CONFIG sets it) runs iris_jax.ops.matmul on [M, K] @ [K, N] (shapes written MxNxK),
checked against jnp.dot, timed as the median GPU span of `reps` calls from
the profiler (benchmarks/collectives.gpu_time; the host's launch cost is left out, which
matters for the small shapes). Prints a markdown table. GPUs only.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from collectives import gpu_time  # noqa: E402

from benchmarks import small  # noqa: E402

# the default first; 64-row tiles and 128 x 128 give small-M problems more than one wave of tiles
CONFIGS = ["128,256,64,8,8,3", "128,128,64,8,8,3", "128,256,64,8,8,4", "256,128,64,8,8,3", "128,128,64,8,4,4",
           "128,128,128,8,8,3", "128,256,64,16,8,3", "64,128,64,8,4,4", "64,256,64,8,8,3"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1024x4096x4096,4096x4096x4096,8192x8192x8192")
    parser.add_argument("--configs", default=";".join(CONFIGS))
    parser.add_argument("--reps", type=int, default=7)
    small.add_flag(parser, "one 32x32x32 product under the default configuration on the CPU simulator (which keeps "
                   "its own tile), values only")
    opts = parser.parse_args()
    if opts.small:
        small.use_simulator(ranks=1)
        opts.shapes, opts.configs = "32x32x32", CONFIGS[0]
    import jax
    import jax.numpy as jnp
    import numpy as np

    import iris_jax
    from iris_jax import ops

    if jax.devices()[0].platform != "gpu" and not opts.small:
        sys.exit("tune_gemm.py needs a GPU (--small runs it on the CPU simulator)")
    iris_jax.init(devices=jax.devices()[:1])

    def median_ms(f, *args):
        if opts.small:
            return float("nan")
        return statistics.median(gpu_time(f, *args).span for _ in range(opts.reps)) / 1e3

    print("| config (BM,BN,BK,GROUP_M,warps,stages) | MxNxK | iris (ms) | XLA (ms) | XLA/iris | iris TFLOP/s | correct |")
    print("|---|---|---|---|---|---|---|")
    for shape in opts.shapes.split(","):
        M, N, K = (int(v) for v in shape.split("x"))
        key_a, key_b = jax.random.split(jax.random.key(M * N + K))
        a = jax.random.normal(key_a, (M, K), jnp.bfloat16)
        b = jax.random.normal(key_b, (K, N), jnp.bfloat16)
        xla = jax.jit(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype))
        want = np.asarray(xla(a, b), np.float32)
        xla_ms = median_ms(xla, a, b)
        for config in opts.configs.split(";"):
            cfg = iris_jax.default_config().replace(gemm_config=tuple(int(v) for v in config.split(",")))
            try:
                f = jax.jit(lambda a, b, cfg=cfg: ops.matmul(a, b, config=cfg))
                got = np.asarray(f(a, b), np.float32)
                ok = bool(np.allclose(got, want, rtol=2e-2, atol=2e-2 * np.sqrt(K)))
                ms = median_ms(f, a, b)
            except Exception as e:  # a configuration that does not compile (shared memory)
                if opts.small:
                    raise
                print(f"| {config} | {shape} | failed: {type(e).__name__}: {str(e).splitlines()[0][:80]} | | | | |")
                continue
            tflops = 2 * M * N * K / ms / 1e9
            print(f"| {config} | {shape} | {ms:.3f} | {xla_ms:.3f} | {xla_ms / ms:.2f} | {tflops:.0f} | {ok} |",
                  flush=True)


if __name__ == "__main__":
    main()
