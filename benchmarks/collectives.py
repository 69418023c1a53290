"""iris collectives vs XLA's (NCCL) in one run: latency, bus bandwidth, ratio.

    python benchmarks/collectives.py [--sizes 1K,4K,...,1G] [--dtypes float32,bfloat16] [--ops psum,...]

An op is `name` or `name:variant`; `psum:heap` times psum on an input already on the heap
(read in place, zero-copy) against lax.psum on the same values.

Method (../shared/DESIGN.md): inside one jit, K data-dependent calls back to back (each call
followed by the same cheap elementwise op for both libraries); time per call = GPU time from
the profiler, (span of a 2K-call jit - span of a K-call jit) / K, so what a run of a jit pays
once (host launch, CUDA-graph update: ~100-150 us) is left out. The JSON rows also carry
`iris_comm_us` / `lax_comm_us`: the time the communication kernels alone run per call
(COMM_KERNELS; without the elementwise op, which at large sizes is a fair share), from the
2K-call jit's kernels after the first call's (those also wait out the GPUs' launch skew).
Every point is first checked against the lax op. Bus bandwidth follows nccl-tests:
all-reduce 2(W-1)/W * S / t, all-gather and reduce-scatter (W-1)/W * S_total / t, all-to-all
(W-1)/W * S / t, ppermute and broadcast S / t, with S the bytes per device.

Writes benchmarks/out/collectives.json and .md (and PNG plots with --plot). On a machine
without GPUs it runs a tiny correctness-only pass on the CPU simulator and says so.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402
from iris_core.platform import gpus_present  # noqa: E402

SIZES = "1K,4K,16K,64K,256K,1M,4M,16M,64M,256M,1G"
OPS = "psum,psum:two_shot,psum:heap,all_gather,psum_scatter,all_to_all,ppermute,broadcast"
SMALL_OPS = "psum,psum:heap,all_gather,ppermute"  # --small's default


def parse_size(s: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1]] if s[-1] in units else int(s)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=SIZES)
    parser.add_argument("--dtypes", default="float32")
    parser.add_argument("--ops", default=OPS)
    parser.add_argument("--out", help="results folder (default: see out_dir)")
    parser.add_argument("--plot", action="store_true")
    small.add_flag(parser, f"1 KiB per rank, 2 ranks on the CPU simulator, values only (ops: {SMALL_OPS} "
                   "unless --ops says)")
    opts = parser.parse_args()

    gpu = not opts.small and os.environ.get("JAX_PLATFORMS") != "cpu" and gpus_present()
    opts.out = out_dir(opts.out, gpu)
    if gpu:  # psum:heap at 1 GiB puts a 1 GiB input on the heap next to the workspaces
        os.environ.setdefault("IRIS_HEAP_SIZE", str(4 << 30))
    else:
        small.use_simulator()
        print("No GPU here (or --small): a tiny correctness-only pass on the CPU simulator (no timings).")
        opts.sizes = "1K" if opts.small else "1K,4K"
        if opts.small and opts.ops == OPS:
            opts.ops = SMALL_OPS
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W, mesh = runtime_mesh()
    sharded = NamedSharding(mesh, P("i"))
    rows = []
    for dtype_name in opts.dtypes.split(","):
        dtype = jnp.dtype(dtype_name)
        for size_name in opts.sizes.split(","):
            nbytes = parse_size(size_name)
            n = max(W, nbytes // dtype.itemsize // W * W)
            x = jax.device_put(jax.random.normal(jax.random.key(n), (W * n,), jnp.float32).astype(dtype), sharded)
            for op_name in opts.ops.split(","):
                op, _, variant = op_name.partition(":")
                in_place = variant == "heap"  # the input on the heap: read in place (zero-copy)
                iris_op, lax_op, out_spec, busbw_factor = op_pair(op, "auto" if in_place or not variant else variant, W,
                                                               iris_jax, lax)
                single = {}
                for lib, fn in (("iris", iris_op), ("lax", lax_op)):
                    single[lib] = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("i"), out_specs=out_spec))
                xi = iris_jax.to_heap(x) if in_place else x
                got, want = single["iris"](xi), single["lax"](x)
                tol = 1e-5 if dtype == jnp.float32 else 2e-2
                ok = bool(np.allclose(np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol * W))
                row = {"op": op_name, "dtype": dtype_name, "bytes": n * dtype.itemsize, "correct": ok}
                if gpu:
                    for lib, fn, arg in (("iris", iris_op, xi), ("lax", lax_op, x)):
                        per_call, comm = time_per_call(fn, arg, mesh, n, dtype, jax, jnp, P, in_place and lib == "iris")
                        row[f"{lib}_us"], row[f"{lib}_comm_us"] = per_call * 1e6, comm * 1e6
                    row["ratio"] = row["lax_us"] / row["iris_us"]
                    for key in ("iris_us", "lax_us", "iris_comm_us", "lax_comm_us"):  # GB/s; None: no such kernel
                        t = row[key]
                        row[key.replace("_us", "_busbw")] = busbw_factor * row["bytes"] / t / 1e3 if t else None
                rows.append(row)
                print(_format_row(row, gpu), flush=True)
                _save_json(opts.out, W, gpu, rows)  # after every row: a run cut short keeps what it measured
                del xi
    table = _markdown(rows, gpu)
    with open(os.path.join(opts.out, "collectives.md"), "w") as f:
        f.write(table)
    print(table)
    if opts.plot and gpu:
        plot(os.path.join(opts.out, "collectives.json"), opts.out)
    if not all(r["correct"] for r in rows):
        sys.exit("some results differ from lax")


OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")


def out_dir(requested: str | None, gpu: bool) -> str:
    """Where a benchmark writes: `requested` (--out), else benchmarks/out on GPUs and
    benchmarks/out/simulator (git-ignored) for the CPU correctness pass, so that a run
    without GPUs never overwrites the measured results kept in the repository."""
    return requested or (OUT_DIR if gpu else os.path.join(OUT_DIR, "simulator"))


def runtime_mesh(needs_gpus: str | None = None):
    """(world size, 1-D mesh "i" over the iris runtime's devices), the runtime created here.
    `needs_gpus`: the calling script's name; it then exits with a message on a machine
    without GPUs."""
    import jax

    import iris_jax

    if needs_gpus and not any(d.platform == "gpu" for d in jax.devices()):
        sys.exit(f"{needs_gpus} needs GPUs")
    rt = iris_jax.init()
    W = len(rt.devices)
    return W, jax.make_mesh((W,), ("i",), devices=rt.devices)


def _save_json(out_dir, W, gpu, rows):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "collectives.json"), "w") as f:
        json.dump({"world_size": W, "gpu": gpu, "rows": rows}, f, indent=1)


def op_pair(op, variant, W, iris_jax, lax):
    """(iris fn, lax fn, out_spec, busbw factor) for one op on per-device input v."""
    from jax.sharding import PartitionSpec as P

    if op == "psum":
        return (lambda v: iris_jax.all_reduce(v, "i", variant=variant), lambda v: lax.psum(v, "i"), P(),
                2 * (W - 1) / W)
    if op == "all_gather":
        return (lambda v: iris_jax.all_gather(v, "i", tiled=True), lambda v: lax.all_gather(v, "i", tiled=True),
                P("i"), (W - 1))
    if op == "psum_scatter":
        return (lambda v: iris_jax.psum_scatter(v, "i", tiled=True), lambda v: lax.psum_scatter(v, "i", tiled=True),
                P("i"), (W - 1) / W)
    if op == "all_to_all":
        return (lambda v: iris_jax.all_to_all(v, "i", 0, 0, tiled=True), lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True),
                P("i"), (W - 1) / W)
    if op == "ppermute":
        perm = [(i, (i + 1) % W) for i in range(W)]
        return (lambda v: iris_jax.ppermute(v, "i", perm), lambda v: lax.ppermute(v, "i", perm), P("i"), 1.0)
    if op == "broadcast":
        # lax has no broadcast collective: the XLA way is a one-hot psum
        def lax_broadcast(v):
            keep = (lax.axis_index("i") == 0).astype(v.dtype)
            return lax.psum(v * keep, "i")

        return (lambda v: iris_jax.broadcast(v, "i", 0), lax_broadcast, P(), 1.0)
    raise ValueError(op)


def chain_jit(fn, mesh, n, dtype, K, jax, jnp, P, in_place=False):
    """One jit of K data-dependent calls of `fn`. With `in_place`, every call gets the input
    itself (on the heap: read in place) and the results are summed, the same elementwise work
    per call."""

    def chain(x0):
        v, total = x0, jnp.zeros((n,), dtype)
        for _ in range(K):
            y = fn(x0 if in_place else v)
            # the same cheap elementwise op for both libraries, back to the input's shape
            v = (jnp.resize(y.reshape(-1), (n,)) * 0.5).astype(dtype)
            if in_place:
                total = total + v
        return total if in_place else v

    return jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))


def calls_per_jit(nbytes: int) -> int:
    return 20 if nbytes <= (4 << 20) else 5 if nbytes <= (256 << 20) else 2


def time_per_call(fn, x, mesh, n, dtype, jax, jnp, P, in_place=False) -> tuple[float, float]:
    """GPU time of one call, in seconds: the GPUs' span for 2K chained calls minus that for
    K calls, divided by K (each span the best of 5 profiled runs). The difference leaves out
    what every run of a jit pays once (the host's launch, CUDA-graph updates). Also returns,
    the time of the communication kernels alone per call (GpuTime.comm of the 2K-call run)."""
    K = calls_per_jit(n * dtype.itemsize)
    runs = []
    for k in (K, 2 * K):
        f = chain_jit(fn, mesh, n, dtype, k, jax, jnp, P, in_place)
        runs.append(min((gpu_time(f, x, calls=k) for _ in range(5)), key=lambda t: t.span))
    return max(runs[1].span - runs[0].span, 0.0) / K / 1e6, runs[1].comm / 1e6


def wall_time_per_call(fn, x, mesh, n, dtype, jax, jnp, P) -> float:
    """Median wall time of a jit of K chained calls, divided by K (seconds): what the host
    sees, fixed costs of the run included."""
    K = calls_per_jit(n * dtype.itemsize)
    f = chain_jit(fn, mesh, n, dtype, K, jax, jnp, P)
    f(x).block_until_ready()
    times = []
    for _ in range(7):
        start = time.perf_counter()
        f(x).block_until_ready()
        times.append(time.perf_counter() - start)
    return statistics.median(times) / K


# the communication kernels in a profile: iris's collective kernel, XLA's NCCL kernels, and
# XLA's own all-reduce kernel (stream_executor::gpu::AllReduceKernelImpl; lax.psum's profiles
# at <= 1 MiB on 2 x H200 held no NCCL kernel, presumably this one: its name is taken from
# XLA's source, not yet seen in one of our profiles)
COMM_KERNELS = re.compile(r"collective_kernel|nccl|AllReduceKernel", re.IGNORECASE)


class GpuTime(NamedTuple):
    """One run on the GPUs, in us (see gpu_activity)."""
    span: float
    busy: float
    comm: float


def gpu_time(f, *args, calls: int = 1) -> GpuTime:
    """GPU activity of one run of `f(*args)` (after a warm-up run), from a jax.profiler trace;
    `calls`: how many collective calls the run makes (see gpu_activity)."""
    import glob
    import tempfile

    import jax

    jax.block_until_ready(f(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            jax.block_until_ready(f(*args))
        (path,) = glob.glob(os.path.join(d, "**", "*.xplane.pb"), recursive=True)
        data = jax.profiler.ProfileData.from_file(path)
    return gpu_activity([(plane.name, [(line.name, [(e.start_ns, e.end_ns, e.name) for e in line.events])
                                       for line in plane.lines]) for plane in data.planes], calls)


def gpu_activity(planes, calls: int = 1) -> GpuTime:
    """From a profile's planes, [(plane name, [(line name, [(start ns, end ns, kernel name)])])]
    of a run of `calls` collective calls:

    span: from the moment every GPU has started (the latest first kernel) to the moment every
    GPU is done (the latest last kernel), so the host's launch skew between devices is left
    out; leading memsets are not counted (XLA issues one before the host's launch work).
    busy: time some kernel runs, busiest device. comm: time the COMM_KERNELS kernels run per
    call, busiest device; with calls > 1, the first call's kernels are left out (they also
    wait for the GPUs the host launched later), else the time some of them runs."""
    starts, ends, busy, comm = [], [], [0.0], [0.0]
    for plane, lines in planes:
        if not plane.startswith("/device:GPU:"):
            continue
        events = sorted(e for line, line_events in lines if line.startswith("Stream") for e in line_events)
        while events and events[0][2].startswith("Memset"):
            events.pop(0)
        if not events:
            continue
        starts.append(events[0][0])
        ends.append(max(end for _, end, _ in events))
        busy.append(_covered(events))
        kernels = [e for e in events if COMM_KERNELS.search(e[2])]
        first = len(kernels) // calls  # kernels per call
        if calls > 1 and first:
            comm.append(_covered(kernels[first:]) / (calls - 1))
        else:
            comm.append(_covered(kernels))
    span = (max(ends) - max(starts)) / 1e3 if starts else 0.0
    return GpuTime(span, max(busy) / 1e3, max(comm) / 1e3)


def _covered(events) -> float:
    """Length of the union of sorted (start, end, name) intervals."""
    total, reach = 0.0, events[0][0] if events else 0.0
    for start, end, _ in events:
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def _format_row(r, gpu):
    head = f"{r['op']:>16} {r['dtype']:>8} {r['bytes']:>11} B  correct={r['correct']}"
    if not gpu:
        return head
    return head + (f"  iris {r['iris_us']:9.1f} us (kernel {r['iris_comm_us']:.1f})  lax {r['lax_us']:9.1f} us "
                   f"(kernel {r['lax_comm_us']:.1f})  x{r['ratio']:.2f}")


def _markdown(rows, gpu):
    if not gpu:
        lines = ["| op | dtype | bytes/device | correct |", "|---|---|---|---|"]
        lines += [f"| {r['op']} | {r['dtype']} | {r['bytes']} | {r['correct']} |" for r in rows]
        return "\n".join(lines) + "\n"
    # per call (with the elementwise op), then the communication kernels alone (nccl-tests' view;
    # blank where the profile had none); merged tables also say which run a row comes from
    runs = any("run" in r for r in rows)
    lines = ["| op | dtype | bytes/device | iris (us) | lax (us) | lax/iris | iris busbw (GB/s) | lax busbw (GB/s) "
             "| iris kernel (us) | lax kernel (us) | kernel lax/iris | iris kernel busbw | lax kernel busbw | correct |"
             + (" run |" if runs else ""),
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if runs else "")]

    def kernel(r, key, digits=1):
        value = r.get(key)
        return "" if not value else f"{value:.{digits}f}"

    for r in rows:
        ik, lk = r.get("iris_comm_us"), r.get("lax_comm_us")
        ratio = f"{lk / ik:.2f}" if ik and lk else ""
        lines.append(f"| {r['op']} | {r['dtype']} | {_human(r['bytes'])} | {r['iris_us']:.1f} | {r['lax_us']:.1f} | "
                     f"{r['ratio']:.2f} | {r['iris_busbw']:.1f} | {r['lax_busbw']:.1f} | {kernel(r, 'iris_comm_us')} | "
                     f"{kernel(r, 'lax_comm_us')} | {ratio} | {kernel(r, 'iris_comm_busbw')} | "
                     f"{kernel(r, 'lax_comm_busbw')} | {r['correct']} |" + (f" {r.get('run', '')} |" if runs else ""))
    return "\n".join(lines) + "\n"


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:g} {unit}"
        n /= 1024
    return f"{n:g} TiB"


def plot(json_path, out_dir):
    """Latency and bus-bandwidth plots (log axes), one line per op/variant and its lax twin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.load(open(json_path))
    for dtype in sorted({r["dtype"] for r in data["rows"]}):
        fig, (lat, bw) = plt.subplots(1, 2, figsize=(14, 5.5))
        rows = [r for r in data["rows"] if r["dtype"] == dtype]
        for i, op in enumerate(dict.fromkeys(r["op"] for r in rows)):
            pts = [r for r in rows if r["op"] == op]
            sizes = [r["bytes"] for r in pts]
            color = f"C{i}"
            lat.plot(sizes, [r["iris_us"] for r in pts], "-o", color=color, label=f"iris {op}", ms=3)
            lat.plot(sizes, [r["lax_us"] for r in pts], "--", color=color, label=f"lax {op}", alpha=0.6)
            bw.plot(sizes, [r["iris_busbw"] for r in pts], "-o", color=color, label=f"iris {op}", ms=3)
            bw.plot(sizes, [r["lax_busbw"] for r in pts], "--", color=color, alpha=0.6)
        for ax, label in ((lat, "time per call (us)"), (bw, "bus bandwidth (GB/s)")):
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("bytes per device")
            ax.set_ylabel(label)
            ax.grid(True, which="both", alpha=0.3)
        lat.legend(fontsize=7, ncol=2)
        fig.suptitle(f"iris vs XLA collectives, {data['world_size']} GPUs, {dtype}")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, f"collectives_{dtype}.png"), dpi=110)


if __name__ == "__main__":
    main()
