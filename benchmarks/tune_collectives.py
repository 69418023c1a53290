"""Sweeps the collective kernel's launch configuration (tile size, programs per SM, warps).

    python benchmarks/tune_collectives.py [--cases ppermute:64M,psum:64M,psum:256K] [--out DIR]
        [--configs 8192/1/8,16384/2/8/50]

Each configuration is a CollectiveConfig (block, programs_per_sm, warps and their streamed
twins, as IRIS_COLLECTIVE_* would set them; iris_jax.collectives.lowering.launch_config), used
for the calls traced inside `use_config`, checked against lax, then timed as in
benchmarks/collectives.py. A configuration is tile elements / programs per SM / warps, and
optionally / the streamed calls' sending share (percent, IRIS_COLLECTIVE_STREAM_SENDERS).
Configurations run from the safest to the most demanding: every program must be resident,
and one that is not ends the run at the collective timeout (10 s here). GPUs only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("IRIS_COLLECTIVE_TIMEOUT", "10")

from collectives import op_pair, parse_size, runtime_mesh, time_per_call  # noqa: E402

from benchmarks import small  # noqa: E402

# (elements per tile, programs per SM, warps), the current default first
CONFIGS = "2048/1/8,4096/1/8,8192/1/8,8192/1/16,16384/1/16,2048/2/8,4096/2/8,8192/2/8"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="ppermute:64M,psum:64M,psum:1M,psum:16K")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "out"))
    parser.add_argument("--best-env", help="write the best configuration (geometric mean of the cases' "
                        "times, correct ones only) here as shell `export` lines")
    parser.add_argument("--configs", default=CONFIGS)
    small.add_flag(parser, "psum of 4 KiB per rank under one configuration (512/2/4/25), 2 ranks on the CPU "
                   "simulator, values only")
    opts = parser.parse_args()
    if opts.small:
        small.use_simulator()
        opts.cases, opts.configs, opts.out = "psum:4K", "512/2/4/25", os.path.join(opts.out, "simulator")
    configs = [tuple(int(v) for v in c.split("/")) for c in opts.configs.split(",")]
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W, mesh = runtime_mesh(None if opts.small else "tune_collectives.py")
    rows = []
    for config in configs:
        block, per_sm, warps = config[:3]
        # the environment's other settings (run.sh's steps set some), this configuration's launch
        cfg = iris_jax.default_config().replace(
            block=block, programs_per_sm=per_sm, warps=warps, stream_programs_per_sm=per_sm, stream_warps=warps,
            stream_senders_percent=config[3] if len(config) > 3 else iris_jax.CollectiveConfig.stream_senders_percent)
        for case in opts.cases.split(","):
            op, _, size = case.partition(":")
            n = max(W, parse_size(size) // 4 // W * W)
            x = jax.device_put(jax.random.normal(jax.random.key(n), (W * n,), jnp.float32),
                               NamedSharding(mesh, P("i")))
            iris_fn, lax_fn, out_spec, busbw_factor = op_pair(op, "one_shot", W, iris_jax, lax)
            run = lambda f: np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=out_spec))(x))
            with iris_jax.use_config(cfg):  # iris's calls traced inside take it
                ok = bool(np.allclose(run(iris_fn), run(lax_fn), rtol=1e-5, atol=1e-5 * W))
                times = (0.0, 0.0) if opts.small else time_per_call(iris_fn, x, mesh, n, jnp.dtype(jnp.float32),
                                                                     jax, jnp, P)
            us, kernel_us = (t * 1e6 for t in times)
            row = {"config": "/".join(map(str, config)), "case": case, "us": us, "kernel_us": kernel_us,
                   "busbw": busbw_factor * n * 4 / us / 1e3 if us else 0.0, "correct": ok}
            rows.append(row)
            print(f"config={row['config']:>14} {case:>14}: {us:9.1f} us (kernel {kernel_us:.1f}) "
                  f"{row['busbw']:7.1f} GB/s correct={ok}", flush=True)
    os.makedirs(opts.out, exist_ok=True)
    with open(os.path.join(opts.out, "tune_collectives.json"), "w") as f:
        json.dump(rows, f, indent=1)
    names = list(dict.fromkeys(r["config"] for r in rows))
    print("| case | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for case in dict.fromkeys(r["case"] for r in rows):
        print(f"| {case} | " + " | ".join(f"{r['us']:.1f}" for r in rows if r["case"] == case) + " |")
    if not opts.small:  # (no timings)
        scores = {}
        for name in names:
            mine = [r for r in rows if r["config"] == name]
            if all(r["correct"] for r in mine):
                scores[name] = float(np.exp(np.mean(np.log([r["us"] for r in mine]))))
        best = min(scores, key=scores.get)
        print(f"best (geometric mean {scores[best]:.1f} us): {best} (tile elements/programs per SM/warps[/senders %])")
        if opts.best_env:
            block, per_sm, warps = best.split("/")[:3]
            with open(opts.best_env, "w") as f:
                f.write(f"export IRIS_COLLECTIVE_BLOCK={block} IRIS_COLLECTIVE_PROGRAMS_PER_SM={per_sm} "
                        f"IRIS_COLLECTIVE_WARPS={warps} IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM={per_sm} "
                        f"IRIS_COLLECTIVE_STREAM_WARPS={warps}\n")
    if not all(r["correct"] for r in rows):
        sys.exit("some results differ from lax")


if __name__ == "__main__":
    main()
