"""How soon faults are reported on the simulator: the watchdog's report, a timeout's named error.

    python benchmarks/fault_latency.py [--reps 5] [--timeouts 1,2] [--ranks 3]

Two latencies that tests used to assert with wall-clock bounds (issue 58; docs/testing.md):

* watchdog: from a fault record written into a rank's fault page (as a GPU kernel writes it) to
  the watchdog's line on stderr (iris_jax._runtime.faults.FaultWatch over host arrays; it reads
  the pages every WATCH_S, so at most WATCH_S plus scheduling);
* timeout: a psum that rank 1 of `--ranks` never calls, with timeout_s T: the seconds from the
  call to the surviving ranks' PeerTimeoutError naming the op and rank 1, minus T (the overshoot).

Each row: median and max over `--reps`. The workers are warmed by a psum that completes first.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402


class _Pages:
    """The part of a GPU heap the watch reads: a fault page and a status word per local rank."""

    heap_size = 1 << 20

    def __init__(self, ranks):
        import numpy as np

        from iris_core import faults

        self.local_ranks = list(ranks)
        self.pages = {r: np.zeros(faults.PAGE_BYTES // 8, np.int64) for r in ranks}

    def fault_words(self, rank):
        return self.pages[rank]

    def peek_status(self, rank):
        return 0

    def clear_status(self, rank):
        pass

    def record(self, rank, what, peer):
        """What a kernel's fail() writes: the fields, then the code."""
        from iris_core import faults

        at = faults.SLOTS_AT
        words = self.pages[rank]
        words[at + 1:at + faults.SLOT] = [faults.what_id(what), peer, 1, -1, 0, 0, time.time_ns()]
        words[at] = faults.TIMEOUT


def watchdog_latency(reps: int) -> list[float]:
    """Seconds from a record written to the watchdog's report of it, `reps` times."""
    from types import SimpleNamespace

    from iris_core import faults
    from iris_jax._runtime import faults as watch_lib

    heap = _Pages((0, 1))
    watch = watch_lib.FaultWatch(SimpleNamespace(heap=heap), "exit")
    faults.named("psum@bench", kernel="_collective_kernel")
    seconds = []
    try:
        for _ in range(reps):
            with contextlib.redirect_stderr(io.StringIO()) as err:
                watch.reported_at = None
                time.sleep(random.uniform(0, watch_lib.WATCH_S))  # at any phase of the watchdog's period
                written = time.monotonic()
                heap.record(1, "psum@bench", peer=0)
                deadline = written + 60  # against a hung watchdog only
                while watch.reported_at is None and time.monotonic() < deadline:
                    time.sleep(0.001)
            assert watch.reported_at is not None and "PeerTimeoutError: iris psum@bench" in err.getvalue()
            seconds.append(watch.reported_at - written)
            assert len(watch.take()) == 1  # clears the page for the next record
    finally:
        watch.close()
    return seconds


def timeout_latency(ranks: int, timeout_s: float, reps: int) -> list[float]:
    """Seconds from the call to every survivor's named PeerTimeoutError, minus `timeout_s`."""
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    seconds = []
    for _ in range(reps):
        rt = iris_jax.init(heap_size=16 << 20, devices=jax.devices()[:ranks])
        mesh = jax.make_mesh((ranks,), ("i",), devices=rt.devices)
        x = jax.device_put(np.ones((ranks, 64), np.float32), NamedSharding(mesh, P("i")))

        def spmd(body):
            return jax.jit(jax.shard_map(lambda v: body(v[0])[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                         check_vma=False))

        def psum(v, t):
            return iris_jax.psum(v, "i", config=iris_jax.CollectiveConfig(timeout_s=t))

        np.testing.assert_array_equal(np.asarray(spmd(lambda v: psum(v, 60.0))(x))[0], np.full(64, ranks))  # warm
        skip = spmd(lambda v: lax.cond(lax.axis_index("i") == 1, lambda u: u, lambda u: psum(u, timeout_s), v))
        skip = skip.lower(x).compile()
        start = time.monotonic()
        out = skip(x)
        for shard in out.addressable_shards:
            if shard.device.id == 1:
                continue
            try:
                shard.data.block_until_ready()
                raise AssertionError("a survivor's psum returned")
            except Exception as e:  # noqa: BLE001 - each device's error comes as a JaxRuntimeError
                assert "PeerTimeoutError" in str(e) and "timed out waiting for rank 1" in str(e), str(e)[:500]
        seconds.append(time.monotonic() - start - timeout_s)
        iris_jax.shutdown()  # a timeout leaves its group's flags poisoned
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--timeouts", default="1,2", help="the psum's timeout_s values, seconds")
    parser.add_argument("--ranks", type=int, default=3)
    small.add_flag(parser, "one record and one 0.5 s timeout on 2 ranks, checked, not timed")
    opts = parser.parse_args()
    if opts.small:
        opts.reps, opts.timeouts, opts.ranks = 1, "0.5", 2
    small.use_simulator(opts.ranks)

    rows = [("watchdog report (record -> stderr)", watchdog_latency(opts.reps))]
    for t in opts.timeouts.split(","):
        rows.append((f"timeout {float(t):g} s -> named error, minus the timeout",
                     timeout_latency(opts.ranks, float(t), opts.reps)))
    if opts.small:
        print("fault_latency --small: the watchdog reported, every survivor named the op and rank 1")
        return
    print(f"simulator, {opts.ranks} ranks, {os.cpu_count()} cores: seconds (median and max of {opts.reps})")
    print(f"| {'latency':<50} | median | max |\n|---|---|---|")
    for name, seconds in rows:
        print(f"| {name:<50} | {statistics.median(seconds):.3f} | {max(seconds):.3f} |")


if __name__ == "__main__":
    main()
