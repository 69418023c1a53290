"""The CPU simulator's time per collective call against lax's, side by side (one process, 8 CPU devices).

    python benchmarks/sim_speed.py [--ranks 2,4,8] [--sizes 4K,64K,1M,4M] [--ops psum,...] [--reps 20]
                                   [--mode host|kernels] [--detect-races] [--dtype float32]

Each point: a jitted shard_map over the first `ranks` CPU devices calling the iris collective
on `--dtype` of the given bytes per rank, and the same with the lax op (ragged_all_to_all: the
lax formulation of iris_jax.reference, since XLA:CPU cannot run lax's; put_to_next, the README's
user kernel, which the interpreter runs: lax.ppermute of the same bytes), checked once,
then timed call by call, lax and iris alternating, after a warm-up (compilation left out); the
medians and their ratio (iris / lax) are printed. `--mode` is init(sim_collectives=...): "host"
(the default: the ranks meet in this process) or "kernels" (the collective kernels under
Triton's interpreter, as before). With --detect-races the table is measured without and with the
race detector, in `--mode` (host: the detector sees the collectives' reads, writes and order;
kernels: it checks their kernels' every access), the third table giving the detector's cost (with /
without). With --compile, each cell is instead the
time to lower and compile a program of one call (a new shape each time, the median of `--reps`),
iris's and lax's. GPU speed is benchmarks/collectives.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402

OPS = "psum,all_gather,psum_scatter,all_to_all,ppermute,ragged_all_to_all,put_to_next"
SIZES = "4K,64K,1M,4M"
RANKS = "2,4,8"


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def _kernel_op(ax, W, n, dtype):
    """The README's put_to_next kernel (a user kernel: the interpreter runs it) as an op of one
    operand; its inbox, a heap array, is made here and passed to the jitted call."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from benchmarks.user_kernels import put_to_next

    mesh = jax.make_mesh((W,), (ax,), devices=iris_jax.runtime().devices[:W])
    inbox = iris_jax.zeros((W * n,), dtype, sharding=NamedSharding(mesh, P(ax)), name="inbox")
    block = 1 << max(n - 1, 0).bit_length()
    call = jax.jit(jax.shard_map(
        lambda box, v: iris_jax.triton_call(box, v, n, kernel=put_to_next, grid=(1,), W=W, BLOCK=block,
                                            out_shape=jax.ShapeDtypeStruct((n,), dtype), symmetric=(0,)),
        mesh=mesh, in_specs=(P(ax), P(ax)), out_specs=P(ax)))
    return lambda v: call(inbox, v)


def _ops(ax, W):
    """name -> (iris op, lax op, arguments builder): each op of a [W * n] operand sharded over `ax`."""
    import jax.numpy as jnp
    from jax import lax

    import iris_jax
    from iris_jax import reference

    ring = [(i, (i + 1) % W) for i in range(W)]

    def ragged(impl):
        # every member sends an equal slice of its rows to every member (an MoE dispatch of even load)
        def f(v):
            rows = v.shape[0] // W
            starts = jnp.arange(W, dtype=jnp.int32) * rows
            sizes = jnp.full((W,), rows, jnp.int32)
            return impl(v, jnp.zeros_like(v), starts, sizes, starts, sizes, axis_name=ax)
        return f

    return {
        "psum": (lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax)),
        "all_gather": (lambda v: iris_jax.all_gather(v, ax, tiled=True), lambda v: lax.all_gather(v, ax, tiled=True)),
        "psum_scatter": (lambda v: iris_jax.psum_scatter(v, ax, tiled=True),
                         lambda v: lax.psum_scatter(v, ax, tiled=True)),
        "all_to_all": (lambda v: iris_jax.all_to_all(v, ax, 0, 0, tiled=True),
                       lambda v: lax.all_to_all(v, ax, 0, 0, tiled=True)),
        "ppermute": (lambda v: iris_jax.ppermute(v, ax, ring), lambda v: lax.ppermute(v, ax, ring)),
        "ragged_all_to_all": (ragged(iris_jax.ragged_all_to_all), ragged(reference.ragged_all_to_all)),
        "put_to_next": (None, lambda v: lax.ppermute(v, ax, ring)),  # a user kernel (_kernel_op)
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default=RANKS, help="world sizes, each a mesh over the first devices")
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--reps", type=int, default=20, help="timed calls of each op (each alternating with lax)")
    parser.add_argument("--mode", default="host", choices=("host", "kernels"),
                        help="init(sim_collectives=...): how the simulator runs the collectives")
    parser.add_argument("--detect-races", action="store_true", help="time the kernels without and with the detector")
    parser.add_argument("--dtype", default="float32", help="the elements' type (a jax.numpy dtype name)")
    parser.add_argument("--compile", action="store_true", help="time lowering and compiling, not calls")
    small.add_flag(parser, "psum of 4 KiB per rank on 2 ranks, once")
    opts = parser.parse_args()
    if opts.small:
        opts.ranks, opts.sizes, opts.ops, opts.reps = "2", "4K", "psum", 1
    ranks = [int(r) for r in opts.ranks.split(",")]
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={max(ranks)}").strip()
    if opts.compile or not opts.detect_races:
        (_compile_table if opts.compile else _table)(opts, ranks, opts.mode)
        return
    plain = _table(opts, ranks, opts.mode, detect_races=False)
    checked = _table(opts, ranks, opts.mode, detect_races=True)
    print(f"\nslowdown with the race detector (with / without, iris's time)\n{'op':<18}{'ranks':>6}"
          + "".join(f"{s:>10}" for s in opts.sizes.split(",")))
    for key in plain:
        print(f"{key[0]:<18}{key[1]:>6}" + "".join(f"{b / a:>9.1f}x" for a, b in zip(plain[key], checked[key])))


def _table(opts, ranks: list[int], mode: str, detect_races: bool = False) -> dict:
    """iris's seconds per call by (op, ranks) and size; prints iris, lax and their ratio."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    dtype = jnp.dtype(opts.dtype)
    tolerance = 1e-5 if dtype.itemsize >= 4 else 2e-2
    sizes = opts.sizes.split(",")
    detector = ", race detector on" if detect_races else ""
    print(f"\nsimulator ({mode}{detector}), {os.cpu_count()} cores, {dtype.name}: ms per call, median of {opts.reps} "
          "(iris | lax | iris / lax)")
    print(f"{'op':<18}{'ranks':>6}" + "".join(f"{s:>26}" for s in sizes))
    table = {}
    for W in ranks:
        # a runtime of W ranks: a kernel's Context is decoded for the runtime's world size
        rt = iris_jax.init(devices=jax.devices()[:W], detect_races=detect_races, sim_collectives=mode)
        mesh = jax.make_mesh((W,), ("i",), devices=rt.devices)
        ops = _ops("i", W)
        for name in opts.ops.split(","):
            iris_op, lax_op = ops[name]
            cells, times = [], []
            for size in sizes:
                n = max(parse_size(size) // dtype.itemsize, W) // W * W
                x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal(W * n), dtype),
                                   NamedSharding(mesh, P("i")))
                ref = jax.jit(jax.shard_map(lax_op, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
                if name == "put_to_next":  # a user kernel, beside lax's ppermute of the same bytes
                    run = _kernel_op("i", W, n, dtype)
                    want = np.asarray(x, np.float32) + np.repeat(np.arange(W), n)
                else:
                    run = jax.jit(jax.shard_map(iris_op, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
                    want = np.asarray(ref(x), np.float32)
                np.testing.assert_allclose(np.asarray(run(x), np.float32), want, rtol=tolerance, atol=tolerance)
                iris_t, lax_t = [], []
                for _ in range(opts.reps):
                    for fn, into in ((run, iris_t), (ref, lax_t)):
                        start = time.perf_counter()
                        fn(x).block_until_ready()
                        into.append(time.perf_counter() - start)
                a, b = statistics.median(iris_t), statistics.median(lax_t)
                times.append(a)
                cells.append(f"{a * 1e3:9.2f} |{b * 1e3:7.2f} |{a / b:5.1f}x")
            print(f"{name:<18}{W:>6}" + "".join(f"{c:>26}" for c in cells), flush=True)
            table[name, W] = times
        iris_jax.shutdown()
    return table


def _compile_table(opts, ranks: list[int], mode: str) -> None:
    """Prints the milliseconds to lower and compile a program of one call, iris | lax | iris / lax, by op
    and ranks (put_to_next left out: a user kernel's call lowers as a collective's does)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    rt = iris_jax.init(sim_collectives=mode)
    dtype = jnp.dtype(opts.dtype)
    print(f"\nsimulator ({mode}), {os.cpu_count()} cores, {dtype.name}: ms to lower and compile a program of "
          f"one call, median of {opts.reps} shapes (iris | lax | iris / lax)")
    for W in ranks:
        # a runtime of W ranks: a kernel's Context is decoded for the runtime's world size
        rt = iris_jax.init(devices=jax.devices()[:W], detect_races=detect_races, sim_collectives=mode)
        mesh = jax.make_mesh((W,), ("i",), devices=rt.devices)
        for name, (iris_op, lax_op) in _ops("i", W).items():
            if name not in opts.ops.split(",") or iris_op is None:
                continue
            iris_t, lax_t = [], []
            for k in range(opts.reps):  # a new shape each time: nothing comes from a cache
                x = jax.ShapeDtypeStruct((W * W * (k + 1),), dtype, sharding=NamedSharding(mesh, P("i")))
                for op, into in ((iris_op, iris_t), (lax_op, lax_t)):
                    f = jax.jit(jax.shard_map(op, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
                    start = time.perf_counter()
                    f.lower(x).compile()
                    into.append(time.perf_counter() - start)
            a, b = statistics.median(iris_t), statistics.median(lax_t)
            print(f"{name:<18}{W:>6}{a * 1e3:9.1f} |{b * 1e3:7.1f} |{a / b:5.1f}x", flush=True)
    iris_jax.shutdown()


if __name__ == "__main__":
    main()
