"""Expert-parallel dispatch + combine per layer: iris's ragged_all_to_all against XLA's, one run.

    python benchmarks/moe_dispatch.py [--tokens 4096,8192,16384] [--hidden 4096,7168]
                                      [--experts 64,256] [--top-k 8] [--dtype bfloat16]

A layer is what an MoE layer sends (examples/09_moe_expert_parallel.py without the experts'
GEMMs): each rank's T x top-k (token, expert) rows sorted by expert, dispatched with
ragged_all_to_all to the experts' ranks, scaled there (a stand-in for the experts), combined
back the same way, summed over k. Routing is uniform at random (fixed per jit); the receive
buffer holds 1.25 x the average, and a rank that would receive more drops rows (iris writes
nothing outside it), the same rows for both libraries.

Method (benchmarks/collectives.py): K data-dependent layers in one jit; time per layer = GPU
span of 2K layers minus K layers, over K, each the best of 5 profiled runs. Every point first
checks that iris and XLA give the same values. Writes benchmarks/out/moe_dispatch.json and
.md. Without GPUs it runs a tiny correctness pass on the CPU simulator (the XLA side then is
iris_jax.reference's all_gather formulation: XLA:CPU has no ragged-all-to-all) and says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from benchmarks import small  # noqa: E402
from iris_core.platform import gpus_present  # noqa: E402


def routing(T, top_k, experts, ranks, seed):
    """Per rank: the rows of its sorted (token, expert) pairs (token index per row) and the
    four ragged_all_to_all vectors for dispatch, with the receive buffer's size."""
    import numpy as np

    rng = np.random.default_rng(seed)
    local = experts // ranks
    picks = np.stack([np.stack([rng.choice(experts, top_k, replace=False) for _ in range(T)]) for _ in range(ranks)])
    order = np.argsort(picks.reshape(ranks, -1), axis=1, kind="stable")
    dest = np.take_along_axis(picks.reshape(ranks, -1), order, axis=1) // local
    counts = np.stack([np.bincount(d, minlength=ranks) for d in dest]).astype(np.int32)  # [sender, receiver]
    capacity = math.ceil(1.25 * T * top_k)
    lands_at = np.cumsum(counts, axis=0) - counts  # where sender j's slice starts on receiver i
    recv = counts.T.copy()
    sent_at = np.cumsum(counts, axis=1) - counts
    return order // top_k, sent_at.astype(np.int32), counts, lands_at.astype(np.int32), recv, capacity


def layer(ragged, capacity, top_k):
    import jax.numpy as jnp
    from jax import lax

    def f(x, tokens, sent_at, send, lands_at, recv, back_at, back_lands):
        buffer = lax.pcast(jnp.zeros((capacity, x.shape[1]), x.dtype), "i", to="varying")
        rows = ragged(x[tokens], buffer, sent_at, send, lands_at, recv, axis_name="i")
        home = lax.pcast(jnp.zeros((tokens.shape[0], x.shape[1]), x.dtype), "i", to="varying")
        back = ragged(rows * 0.5, home, back_at, recv, back_lands, send, axis_name="i")
        return back.reshape(-1, top_k, x.shape[1]).sum(1).astype(x.dtype)
    return f


def chained(f, mesh, K):
    import jax
    from jax.sharding import PartitionSpec as P

    def chain(x, *vectors):
        for _ in range(K):
            x = f(x, *vectors)
        return x

    return jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("i"), out_specs=P("i")))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", default="4096,8192,16384")
    parser.add_argument("--hidden", default="4096,7168")
    parser.add_argument("--experts", default="64,256")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out")
    small.add_flag(parser, "16 tokens per rank, hidden 8, top-2 of 8 experts, 2 ranks on the CPU simulator, values "
                   "only (a run without GPUs does the same on 4 ranks)")
    opts = parser.parse_args()
    gpu = not opts.small and os.environ.get("JAX_PLATFORMS") != "cpu" and gpus_present()
    if not gpu:
        small.use_simulator(ranks=2 if opts.small else 4)
        opts.tokens, opts.hidden, opts.experts, opts.top_k, opts.dtype = "16", "8", "8", 2, "float32"

    import jax
    import jax.numpy as jnp
    import numpy as np
    from collectives import gpu_time, out_dir, runtime_mesh
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax import reference

    W, mesh = runtime_mesh()
    dtype = jnp.dtype(opts.dtype)
    xla_ragged = lax.ragged_all_to_all if gpu else reference.ragged_all_to_all
    rows = []
    print(f"{W} ranks ({'GPUs' if gpu else 'CPU simulator: correctness only'}), top-{opts.top_k}, {dtype.name}")
    for T in map(int, opts.tokens.split(",")):
        for D in map(int, opts.hidden.split(",")):
            for E in map(int, opts.experts.split(",")):
                if E % W:
                    continue
                tokens, sent_at, counts, lands_at, recv, capacity = routing(T, opts.top_k, E, W, seed=T + D + E)
                back_at = np.cumsum(recv, axis=1) - recv  # where each sender's block sits in my buffer
                back_lands = sent_at.T.copy()  # ... goes back to where it was sent from
                vectors = [jax.device_put(np.ascontiguousarray(a, np.int32).reshape(-1), NamedSharding(mesh, P("i")))
                           for a in (tokens, sent_at, counts, lands_at, recv, back_at, back_lands)]  # [rank, ...]
                x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((W * T, D)), dtype),
                                   NamedSharding(mesh, P("i")))
                iris_f = layer(iris_jax.ragged_all_to_all, capacity, opts.top_k)
                xla_f = layer(xla_ragged, capacity, opts.top_k)
                got, want = chained(iris_f, mesh, 1)(x, *vectors), chained(xla_f, mesh, 1)(x, *vectors)
                np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                                           rtol=2e-2 if dtype == jnp.bfloat16 else 1e-6, atol=1e-6)
                row = {"tokens": T, "hidden": D, "experts": E, "top_k": opts.top_k, "dtype": dtype.name,
                       "bytes_per_rank": T * opts.top_k * D * dtype.itemsize}
                if gpu:
                    for name, f in (("iris", iris_f), ("xla", xla_f)):
                        K = 4
                        spans = [min(gpu_time(chained(f, mesh, k), x, *vectors, calls=k).span for _ in range(5))
                                 for k in (K, 2 * K)]
                        row[f"{name}_us"] = max(spans[1] - spans[0], 0.0) / K
                    row["speedup"] = row["xla_us"] / row["iris_us"] if row["iris_us"] else float("nan")
                rows.append(row)
                print(json.dumps(row))
    folder = out_dir(opts.out, gpu)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "moe_dispatch.json"), "w") as f:
        json.dump({"world": W, "gpu": gpu, "rows": rows}, f, indent=1)
    with open(os.path.join(folder, "moe_dispatch.md"), "w") as f:
        f.write("| tokens/rank | hidden | experts | top-k | MiB/rank | iris us | XLA us | XLA / iris |\n"
                "|---|---|---|---|---|---|---|---|\n")
        for r in rows:
            f.write(f"| {r['tokens']} | {r['hidden']} | {r['experts']} | {r['top_k']} | "
                    f"{r['bytes_per_rank'] / 2**20:.0f} | {r.get('iris_us', float('nan')):.1f} | "
                    f"{r.get('xla_us', float('nan')):.1f} | {r.get('speedup', float('nan')):.2f} |\n")
    print(f"OK: iris and XLA agree at every point; wrote {folder}/moe_dispatch.md")


if __name__ == "__main__":
    main()
