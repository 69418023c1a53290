"""The CPU simulator's time per collective call, by size (one process, simulated ranks).

    python benchmarks/sim_speed.py [--ranks 4] [--sizes 4K,64K,256K,1M,4M] [--ops psum,...] [--reps 3]
                                   [--detect-races] [--dtype float32]

Each point: a jitted shard_map over `--ranks` CPU devices calling the iris collective on
float32 of the given bytes per rank; checked against the lax op once, then timed over
`--reps` calls after a warm-up call (compilation left out); the median is printed. What it
measures is the simulator (Triton's interpreter running the collective kernel in the ranks'
worker processes), for choosing sizes to debug with (--dtype: the elements, e.g. bfloat16); GPU speed is benchmarks/collectives.py.
With --detect-races, the table is measured twice, without and with the race detector
(iris_jax.init(detect_races=True)), and a third table gives the slowdown (with / without).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402

OPS = "psum,all_gather,psum_scatter,all_to_all"
SIZES = "4K,64K,256K,1M,4M"


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def _ops(ax):
    from jax import lax

    import iris_jax

    return {
        "psum": (lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax)),
        "all_gather": (lambda v: iris_jax.all_gather(v, ax, tiled=True), lambda v: lax.all_gather(v, ax, tiled=True)),
        "psum_scatter": (lambda v: iris_jax.psum_scatter(v, ax, tiled=True),
                         lambda v: lax.psum_scatter(v, ax, tiled=True)),
        "all_to_all": (lambda v: iris_jax.all_to_all(v, ax, 0, 0, tiled=True),
                       lambda v: lax.all_to_all(v, ax, 0, 0, tiled=True)),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--detect-races", action="store_true", help="also time with the race detector on")
    parser.add_argument("--dtype", default="float32", help="the elements' type (a jax.numpy dtype name)")
    small.add_flag(parser, "psum of 4 KiB per rank on 2 ranks, once")
    opts = parser.parse_args()
    if opts.small:
        opts.ranks, opts.sizes, opts.ops, opts.reps = 2, "4K", "psum", 1
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={opts.ranks}").strip()

    tables = [_table(opts, detect_races=False)]
    if opts.detect_races:
        tables.append(_table(opts, detect_races=True))
        print(f"slowdown with the race detector (with / without)\n{'op':<14}"
              + "".join(f"{s:>10}" for s in opts.sizes.split(",")))
        for name in opts.ops.split(","):
            print(f"{name:<14}" + "".join(f"{b / a:>9.1f}x" for a, b in zip(tables[0][name], tables[1][name])))


def _table(opts, detect_races: bool) -> dict:
    """Seconds per call of every op and size: {op: [seconds by size]}; prints the table."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import iris_jax

    rt = iris_jax.init(detect_races=detect_races)
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("i",), devices=rt.devices)
    ops = _ops("i")
    table = {}
    detector = ", race detector on" if detect_races else ""
    dtype = jnp.dtype(opts.dtype)
    tolerance = 1e-5 if dtype.itemsize >= 4 else 2e-2
    print(f"simulator, {W} ranks, {os.cpu_count()} cores, {dtype.name}{detector}: seconds per call (median of "
          f"{opts.reps})")
    print(f"{'op':<14}" + "".join(f"{s:>10}" for s in opts.sizes.split(",")))
    for name in opts.ops.split(","):
        iris_op, lax_op = ops[name]
        cells = []
        for size in opts.sizes.split(","):
            n = parse_size(size) // dtype.itemsize
            x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal(W * n), dtype),
                               jax.sharding.NamedSharding(mesh, P("i")))
            run = jax.jit(jax.shard_map(iris_op, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
            ref = jax.jit(jax.shard_map(lax_op, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
            np.testing.assert_allclose(np.asarray(run(x), np.float32), np.asarray(ref(x), np.float32),
                                       rtol=tolerance, atol=tolerance)
            times = []
            for _ in range(opts.reps):
                start = time.perf_counter()
                run(x).block_until_ready()
                times.append(time.perf_counter() - start)
            cells.append(statistics.median(times))
            print(f"  {name} {size}: {cells[-1]:.3f} s", file=sys.stderr, flush=True)
        print(f"{name:<14}" + "".join(f"{t:>10.3f}" for t in cells), flush=True)
        table[name] = cells
    iris_jax.shutdown()
    return table


if __name__ == "__main__":
    main()
