"""Where a small collective's time goes: the per-call floor of each layer, in one run.

    python benchmarks/latency_floor.py [--bytes 1024] [--out DIR]

Times, by the method of benchmarks/collectives.py (K data-dependent calls in one jit, each
followed by the same elementwise op), per call: the GPU time (the benchmark's measure), the
host's wall time of the jit / K (fixed costs of a run included), and the time kernels run:

    elementwise only             the method's own floor (XLA fuses the K ops into one)
    jax_triton copy kernel       + one plain Triton custom call
    iris copy kernel             + the device's context row (selected in-graph)
    iris copy kernel + group     + the group row (what every iris collective receives)
    iris psum / lax.psum         the collectives themselves

and writes the optimized HLO of the iris psum chain (K = 2) to DIR/psum_chain.hlo.txt, to
count what runs per call. GPUs only.
"""

from __future__ import annotations

import argparse
import os
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from collectives import chain_jit, gpu_time, out_dir, runtime_mesh, time_per_call, wall_time_per_call  # noqa: E402

from benchmarks import small  # noqa: E402


# (jax-triton passes the outputs after the arguments)
@triton.jit
def copy_kernel(x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def context_copy_kernel(context_ptr, x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    copy_kernel(x_ptr, n, out_ptr, BLOCK)


@triton.jit
def group_copy_kernel(context_ptr, group_ptr, x_ptr, n, out_ptr, BLOCK: tl.constexpr):
    copy_kernel(x_ptr, n, out_ptr, BLOCK)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--out", help="where psum_chain.hlo.txt goes (default: benchmarks/out, with --small "
                        "benchmarks/out/simulator)")
    small.add_flag(parser, "every layer's call once, 2 ranks on the CPU simulator (no timings)")
    opts = parser.parse_args()
    opts.out = out_dir(opts.out, gpu=not opts.small)
    if opts.small:
        small.use_simulator()
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    jt = iris_jax.compat.jax_triton()  # (imports on machines without JAX's CUDA plugin too)

    W, mesh = runtime_mesh(None if opts.small else "latency_floor.py")
    n = opts.bytes // 4
    x = jax.device_put(jax.random.normal(jax.random.key(0), (W * n,), jnp.float32), NamedSharding(mesh, P("i")))
    block = triton.next_power_of_2(n)

    def jt_copy(v):
        return jt.triton_call(v, n, kernel=copy_kernel, out_shape=v, grid=(1,), BLOCK=block)

    def iris_copy(v):
        return iris_jax.triton_call(v, n, kernel=context_copy_kernel, out_shape=v, grid=(1,), BLOCK=block)

    def iris_group_copy(v):
        return iris_jax.triton_call(v, n, kernel=group_copy_kernel, out_shape=v, grid=(1,), group_axes=("i",),
                                    BLOCK=block)

    cases = [("elementwise only", lambda v: v), ("jax_triton copy kernel", jt_copy),
             ("iris copy kernel (context row)", iris_copy), ("iris copy kernel + group row", iris_group_copy),
             ("iris psum", lambda v: iris_jax.psum(v, "i")), ("lax.psum", lambda v: lax.psum(v, "i"))]
    launch = os.environ.get("IRIS_TRITON_CALL", "ffi")
    print(f"launch path: IRIS_TRITON_CALL={launch}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}")
    print(f"| layer ({opts.bytes} B float32 per device, {W} GPUs) | GPU us per call | wall us per call "
          "| GPU busy us per call |\n|---|---|---|---|")
    f32 = jnp.dtype(jnp.float32)
    for name, fn in cases:
        if opts.small:
            jax.block_until_ready(chain_jit(fn, mesh, n, f32, 1, jax, jnp, P)(x))
            print(f"| {name} | ran | | |", flush=True)
            continue
        us = time_per_call(fn, x, mesh, n, f32, jax, jnp, P)[0] * 1e6
        wall = wall_time_per_call(fn, x, mesh, n, f32, jax, jnp, P) * 1e6
        busy = gpu_time(chain_jit(fn, mesh, n, f32, 20, jax, jnp, P), x).busy / 20
        print(f"| {name} | {us:.1f} | {wall:.1f} | {busy:.1f} |", flush=True)

    def chain(v):
        for _ in range(2):
            v = iris_jax.psum(v, "i") * 0.5
        return v

    compiled = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)).lower(
        x).compile()
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "psum_chain.hlo.txt"), "w") as f:
        f.write(compiled.as_text())


if __name__ == "__main__":
    main()
