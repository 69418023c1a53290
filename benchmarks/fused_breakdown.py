"""Where the time of one fused matmul_all_reduce / matmul_reduce_scatter goes (2 GPUs, bf16).

    python benchmarks/fused_breakdown.py [--m 8192] [--n 8192] [--k 4096] [--reduce-programs 8,16] [--poll-ns 500]

Per rank a [M, K] @ b [K, N] (K per rank), each piece timed alone by the GPU span of one
call (median of 5, benchmarks/collectives.gpu_time; `busy` = time some kernel runs on the
busiest GPU): XLA's dot and the iris GEMM core (every GPU on its own), the collective alone
(iris and lax on the [M, N] result), the fused kernel over a group of one (the same kernel
and programs, no link traffic) and over both GPUs, for each count of reducing programs and flag polling interval
(CollectiveConfig.fused_reduce_programs, .fused_poll_ns).
GPUs only.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--reduce-programs", default="8,16")
    parser.add_argument("--poll-ns", default="500")
    small.add_flag(parser, "every piece once at M = N = 32, K = 16 per rank, one reducing program, 2 ranks on the "
                   "CPU simulator (no timings)")
    opts = parser.parse_args()
    if opts.small:
        small.use_simulator()
        opts.m, opts.n, opts.k, opts.reduce_programs, opts.poll_ns = 32, 32, 16, "1", "0"
    else:
        os.environ.setdefault("IRIS_HEAP_SIZE", str(8 << 30))
        os.environ.setdefault("IRIS_FUSED_WORKSPACE_BYTES", str(1 << 30))
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax import ops

    if jax.devices()[0].platform != "gpu" and not opts.small:
        sys.exit("fused_breakdown.py needs GPUs (--small runs it on the CPU simulator)")
    rt = iris_jax.init()
    W = len(rt.devices)
    M, N, K = opts.m, opts.n, opts.k
    mesh = jax.make_mesh((W,), ("i",), devices=rt.devices)
    mesh1 = jax.make_mesh((W, 1), ("i", "one"), devices=rt.devices)  # groups of one along "one"
    k1, k2 = jax.random.split(jax.random.key(0))
    a = jax.device_put(jax.random.normal(k1, (M, W * K), jnp.bfloat16), NamedSharding(mesh, P(None, "i")))
    b = jax.device_put((jax.random.normal(k2, (W * K, N), jnp.float32) * K ** -0.5).astype(jnp.bfloat16),
                       NamedSharding(mesh, P("i", None)))
    a1, b1 = (jax.device_put(x, NamedSharding(mesh1, x.sharding.spec)) for x in (a, b))
    c = jax.device_put(jnp.ones((W * M, N), jnp.bfloat16), NamedSharding(mesh, P("i", None)))

    def timed(name, f, *args):
        if opts.small:
            jax.block_until_ready(f(*args))
            print(f"| {name} | ran | |", flush=True)
            return
        runs = [gpu_time(f, *args) for _ in range(5)]
        span = statistics.median(r.span for r in runs)
        busy = statistics.median(r.busy for r in runs)
        print(f"| {name} | {span:.1f} | {busy:.1f} |", flush=True)

    def smap(fn, m=None, ins=None, out=None):
        return jax.jit(jax.shard_map(fn, mesh=m or mesh, in_specs=ins or (P(None, "i"), P("i", None)),
                                     out_specs=P() if out is None else out, check_vma=False))

    print(f"M={M} N={N} K per rank={K}, {W} {'simulated ranks' if opts.small else 'GPUs'}, bf16")
    print("| piece | GPU span (us) | busy (us) |\n|---|---|---|")
    timed("XLA dot", smap(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype),
                          out=P("i")), a, b)
    timed("iris GEMM core (ops.matmul)", smap(lambda a, b: ops.matmul(a, b), out=P("i")), a, b)
    ins1 = (P("i", None),)
    timed("lax.psum of the result", smap(lambda c: lax.psum(c, "i"), ins=ins1), c)
    timed("iris psum of the result", smap(lambda c: iris_jax.psum(c, "i"), ins=ins1), c)
    timed("lax.psum_scatter of the result", smap(lambda c: lax.psum_scatter(c, "i", tiled=True), ins=ins1,
                                                 out=P("i")), c)
    timed("XLA dot + lax.psum", smap(lambda a, b: ops.matmul_all_reduce(a, b, "i", impl="xla")), a, b)
    timed("XLA dot + lax.psum_scatter", smap(lambda a, b: ops.matmul_reduce_scatter(a, b, "i", impl="xla"),
                                             out=P("i")), a, b)
    for count in opts.reduce_programs.split(","):
        for poll in opts.poll_ns.split(","):
            cfg = iris_jax.CollectiveConfig(fused_reduce_programs=int(count), fused_poll_ns=int(poll))
            how = f"{count} reducing programs, polling every {poll} ns"
            timed(f"fused matmul_all_reduce, group of one, {how}",
                  smap(lambda a, b: ops.matmul_all_reduce(a, b, "one", impl="fused", config=cfg), m=mesh1,
                       out=P("i", None)), a1, b1)
            timed(f"fused matmul_all_reduce, {how}",
                  smap(lambda a, b: ops.matmul_all_reduce(a, b, "i", impl="fused", config=cfg)), a, b)
            timed(f"fused matmul_reduce_scatter, {how}",
                  smap(lambda a, b: ops.matmul_reduce_scatter(a, b, "i", impl="fused", config=cfg), out=P("i")),
                  a, b)


if __name__ == "__main__":
    main()
