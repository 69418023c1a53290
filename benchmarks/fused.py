"""Fused GEMM + communication (iris_jax.ops) vs unfused XLA (jnp.dot + the lax collective).

    python benchmarks/fused.py [--ms 1024,4096,8192] [--nks 4096,8192] [--ops ...] [--reps 7] [--plot]
    python benchmarks/fused.py --plot-from benchmarks/out/fused.json   # only redraw the plot

M is the global row count and N = K. Per rank: matmul_all_reduce a [M, K/W] @ b [K/W, N];
all_gather_matmul a [M/W, K] gathered, @ b [K, N/W]; matmul_reduce_scatter a [M, K/W] @
b [K/W, N] -> [M/W, N]; "matmul" is the GEMM core alone on [M, K] @ [K, N] (one device).
Both paths run the same jit(shard_map(...)) on the same inputs, with impl="fused" vs
impl="xla"; each point is first checked against the XLA result. Time = median over `reps` runs
of the GPUs' span from the profiler (first kernel start to last kernel end, slowest device;
the host's fixed cost of launching a run is left out); TFLOP/s per rank = 2 M N K / W / t.

Writes benchmarks/out/fused.json and .md, and with --plot benchmarks/fused_bf16.png (xla/fused
per shape and op). bfloat16 on GPUs. On a machine without GPUs it
runs a tiny correctness-only pass on the CPU simulator and says so (no timings).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402
from iris_core.platform import gpus_present  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from collectives import gpu_time, out_dir  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ms", default="1024,4096,8192")
    parser.add_argument("--nks", default="4096,8192")
    parser.add_argument("--ops", default="matmul,matmul_all_reduce,all_gather_matmul,matmul_reduce_scatter")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", help="results folder (default: benchmarks/out, on the simulator benchmarks/out/simulator)")
    parser.add_argument("--plot", action="store_true", help="also draw fused_bf16.png into the results folder")
    parser.add_argument("--plot-from", help="draw benchmarks/fused_bf16.png from this fused.json and exit")
    small.add_flag(parser, "one 40 x 24 x 24 problem per op, 2 ranks on the CPU simulator, values only")
    opts = parser.parse_args()
    if opts.plot_from:
        with open(opts.plot_from) as fh:
            plot(json.load(fh), os.path.join(os.path.dirname(os.path.abspath(__file__)), "fused_bf16.png"))
        return

    gpu = not opts.small and gpus_present()
    opts.out = out_dir(opts.out, gpu)
    if gpu:
        os.environ.setdefault("IRIS_HEAP_SIZE", str(8 << 30))
        os.environ.setdefault("IRIS_FUSED_WORKSPACE_BYTES", str(1 << 30))
    else:
        small.use_simulator()
        print("No GPU here (or --small): a tiny correctness-only pass on the CPU simulator (no timings).")
        opts.ms, opts.nks, opts.reps = "40", "24", 0
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax import ops

    rt = iris_jax.init()
    W = len(rt.devices)
    mesh = jax.make_mesh((W,), ("i",), devices=rt.devices)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    rows = []
    for nk in [int(v) for v in opts.nks.split(",")]:
        for m in [int(v) for v in opts.ms.split(",")]:
            N = K = nk
            for op in opts.ops.split(","):
                fns, arrays, in_specs, out_spec, flops = _case(op, m, N, K, W, dtype, mesh, jax, jnp, ops, P,
                                                               NamedSharding)
                results, times = {}, {}
                for impl in ("fused", "xla"):
                    f = jax.jit(jax.shard_map(fns(impl), mesh=mesh, in_specs=in_specs, out_specs=out_spec))
                    results[impl] = np.asarray(jax.block_until_ready(f(*arrays)), np.float32)
                    if opts.reps:
                        times[impl] = statistics.median(gpu_time(f, *arrays).span for _ in range(opts.reps)) / 1e6
                want = results["xla"]
                err = float(np.abs(results["fused"] - want).max() / max(1e-6, np.abs(want).max()))
                row = {"op": op, "M": m, "N": N, "K": K, "W": W, "dtype": jnp.dtype(dtype).name,
                       "rel_err": err, "correct": err < (2e-2 if gpu else 1e-4)}
                for impl, t in times.items():
                    row[f"{impl}_us"] = t * 1e6
                    row[f"{impl}_tflops"] = flops / t / 1e12
                if times:
                    row["speedup"] = times["xla"] / times["fused"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "fused.json"), "w") as fh:
        json.dump(rows, fh, indent=1)
    with open(os.path.join(opts.out, "fused.md"), "w") as fh:
        fh.write(markdown(rows))
    if opts.plot and gpu:
        plot(rows, os.path.join(opts.out, "fused_bf16.png"))
    if not gpu:
        print("CPU simulator: correctness only;", sum(r["correct"] for r in rows), "of", len(rows), "correct")


def plot(rows, path):
    """Bars of xla time / fused time per shape, one color per op (> 1: fused faster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops_ = [op for op in dict.fromkeys(r["op"] for r in rows) if op != "matmul"]
    shapes = list(dict.fromkeys((r["M"], r["N"]) for r in rows))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(ops_)
    for i, op in enumerate(ops_):
        by_shape = {(r["M"], r["N"]): r.get("speedup", float("nan")) for r in rows if r["op"] == op}
        ax.bar([x + (i - (len(ops_) - 1) / 2) * width for x in range(len(shapes))],
               [by_shape.get(s, float("nan")) for s in shapes], width, label=op)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(range(len(shapes)), [f"M={m}\nN=K={n}" for m, n in shapes])
    ax.set_ylabel("XLA unfused time / fused time")
    ax.set_title(f"iris fused GEMM + collective vs jnp.dot + lax collective ({rows[0]['dtype']}, "
                 f"{rows[0]['W']} GPUs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print("wrote", path)


def markdown(rows) -> str:
    """The table of fused.md (merged tables also say which run a row comes from)."""
    runs = any("run" in r for r in rows)
    lines = ["| op | M | N=K | W | fused (us) | xla (us) | fused TFLOP/s | xla TFLOP/s | xla/fused | correct |"
             + (" run |" if runs else ""), "|---|---|---|---|---|---|---|---|---|---|" + ("---|" if runs else "")]
    for r in rows:
        lines.append(f"| {r['op']} | {r['M']} | {r['N']} | {r['W']} | {r.get('fused_us', float('nan')):.1f} | "
                     f"{r.get('xla_us', float('nan')):.1f} | {r.get('fused_tflops', float('nan')):.1f} | "
                     f"{r.get('xla_tflops', float('nan')):.1f} | {r.get('speedup', float('nan')):.2f} | {r['correct']} |"
                     + (f" {r.get('run', '')} |" if runs else ""))
    return "\n".join(lines) + "\n"


def _case(op, m, N, K, W, dtype, mesh, jax, jnp, ops, P, NamedSharding):
    """(impl -> per-rank function, global inputs, in_specs, out_spec, FLOPs per rank)."""
    key = jax.random.key(m * 7 + N)
    k1, k2 = jax.random.split(key)

    def arr(k, shape, spec, scale=1.0):
        x = (jax.random.normal(k, shape, jnp.float32) * scale).astype(dtype)
        return jax.device_put(x, NamedSharding(mesh, spec))

    if op == "matmul":  # one device: the GEMM core vs jnp.dot (rank 0's shard of a replicated run)
        a, b = arr(k1, (m, K), P()), arr(k2, (K, N), P(), K ** -0.5)
        fns = lambda impl: (lambda a, b: ops.matmul(a, b) if impl == "fused" else jnp.dot(a, b))
        return fns, (a, b), (P(), P()), P("i"), 2 * m * N * K
    if op == "matmul_all_reduce":
        a, b = arr(k1, (m, K), P(None, "i")), arr(k2, (K, N), P("i", None), K ** -0.5)
        fns = lambda impl: (lambda a, b: ops.matmul_all_reduce(a, b, "i", impl=impl))
        return fns, (a, b), (P(None, "i"), P("i", None)), P(), 2 * m * N * K // W
    if op == "all_gather_matmul":
        a, b = arr(k1, (m, K), P("i", None)), arr(k2, (K, N), P(None, "i"), K ** -0.5)
        fns = lambda impl: (lambda a, b: ops.all_gather_matmul(a, b, "i", impl=impl))
        return fns, (a, b), (P("i", None), P(None, "i")), P(None, "i"), 2 * m * N * K // W
    if op == "matmul_reduce_scatter":
        a, b = arr(k1, (m, K), P(None, "i")), arr(k2, (K, N), P("i", None), K ** -0.5)
        fns = lambda impl: (lambda a, b: ops.matmul_reduce_scatter(a, b, "i", impl=impl))
        return fns, (a, b), (P(None, "i"), P("i", None)), P("i", None), 2 * m * N * K // W
    raise ValueError(f"unknown op {op}")


if __name__ == "__main__":
    main()
