"""Where a streamed psum's time goes: its device trace, summed up per rank.

    python benchmarks/stream_timeline.py [--sizes 4M,16M,64M] [--out DIR]

Traces one warm streamed psum (float32) per size, every size streamed
(IRIS_COLLECTIVE_STREAM_FROM=0 unless set; iris_jax.tracing: a `transfer` span per
program, a `wait` span per received tile) and prints, per rank, in us from the first
program's start: when the first tile arrived, when 10/50/90/100% of the tiles had, the
arrival rate between 10% and 90% (GB/s of tiles received), when the senders and receivers
ended (first / median / last) and the whole kernel. The ranks' kernels of one call start
tens of us apart (launch skew), so a rank's arrivals also show when its peer started; its
senders' own spans do not. Tracing adds a few stores per tile, so the times run a little
above the untraced kernel's (benchmarks/collectives.py). GPUs only.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ.setdefault("IRIS_COLLECTIVE_STREAM_FROM", "0")

from collectives import out_dir, parse_size, runtime_mesh  # noqa: E402

from benchmarks import small  # noqa: E402


def summarize(events, nbytes):
    """One rank's row: the phases of a streamed call, us from its first program's start."""
    from iris_core.tracing import events as ids

    transfer = events[events["event_id"] == ids.TRANSFER]
    wait = events[events["event_id"] == ids.WAIT]
    sending = set(events["pid"][events["event_id"] == ids.STORE].tolist())
    t0 = transfer["timestamp"].min()
    ends = transfer["timestamp"] + transfer["duration"] - t0
    senders = np.sort(ends[np.isin(transfer["pid"], list(sending))])
    receivers = np.sort(ends[~np.isin(transfer["pid"], list(sending))])
    arrivals = np.sort(wait["timestamp"] + wait["duration"] - t0)
    at = {q: arrivals[min(int(q * len(arrivals)), len(arrivals) - 1)] for q in (0.1, 0.5, 0.9)}
    rate = 0.8 * nbytes / max(at[0.9] - at[0.1], 1)  # bytes per ns = GB/s

    def spread(v):
        return f"{v[0] / 1e3:.1f} / {np.median(v) / 1e3:.1f} / {v[-1] / 1e3:.1f}"

    return (f"| {len(senders)} + {len(receivers)} | {arrivals[0] / 1e3:.1f} | "
            + " / ".join(f"{at[q] / 1e3:.1f}" for q in (0.1, 0.5, 0.9)) + f" / {arrivals[-1] / 1e3:.1f} | "
            f"{rate:.0f} | {spread(senders)} | {spread(receivers)} | {ends.max() / 1e3:.1f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4M,16M,64M")
    parser.add_argument("--out", help="where the traces go (default: benchmarks/out, with --small "
                        "benchmarks/out/simulator)")
    small.add_flag(parser, "one streamed psum of 16 KiB per rank, traced, 2 ranks on the CPU simulator")
    opts = parser.parse_args()
    opts.out = out_dir(opts.out, gpu=not opts.small)
    if opts.small:
        small.use_simulator()
        opts.sizes = "16K"
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_core.tracing import events

    W, mesh = runtime_mesh(None if opts.small else "stream_timeline.py")
    os.makedirs(opts.out, exist_ok=True)
    iris_jax.tracing.enable(max_events=1 << 16)
    psum = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    print("| size | rank | senders + receivers | first tile | 10 / 50 / 90 / 100% of tiles | GB/s (10-90%) "
          "| senders end (first / median / last) | receivers end | kernel |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in opts.sizes.split(","):
        n = parse_size(size) // 4
        x = jax.device_put(jnp.ones((W * n,), jnp.float32), NamedSharding(mesh, P("i")))
        out = psum(x)  # compiles, warms up
        out.block_until_ready()
        iris_jax.tracing.reset()
        out = psum(x)
        assert float(out[0]) == W and float(out[-1]) == W, "wrong sum"
        iris_jax.barrier()
        for trace in iris_jax.tracing.read():
            assert np.any(trace.events["event_id"] == events.STORE), "not streamed: raise IRIS_STREAM_BYTES"
            assert trace.dropped == 0, f"{trace.dropped} events dropped: raise max_events"
            print(f"| {size} | {trace.rank} " + summarize(trace.events, n * 4 * (W - 1)))
        iris_jax.tracing.export(os.path.join(opts.out, f"stream_{size}.json"))


if __name__ == "__main__":
    main()
