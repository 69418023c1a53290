"""Device event tracing: trace an all-reduce, write a Perfetto trace and a timeline PNG.

Every rank holds a vector on the symmetric heap; a one-shot all-reduce kernel reads each
peer's vector (ctx.load) and sums. Built with TRACING=True, the kernel records

* every Context RMA op by itself (here `load`, with the peer as target rank),
* its own phases: a `transfer` span around each peer's read and a `reduce` span around
  each addition (ctx.tracing.record_event_start / record_event_end),

and the device barriers before and after it record `barrier` spans (with their
`atomic_max` signals). The trace has one process per rank and one track per SM (on the
simulator: per program); open the JSON in https://ui.perfetto.dev.

Run: python examples/04_trace_all_reduce.py [--out DIR]
(all local GPUs; without GPUs, the CPU simulator with 4 ranks). Writes
DIR/trace_all_reduce.json and DIR/trace_all_reduce.png (DIR: the current directory).
"""

import argparse
import os

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402
from iris_core.device.tracing import EVENT_REDUCE, EVENT_TRANSFER  # noqa: E402
from iris_jax import Context  # noqa: E402

N = 1024  # elements per rank
BLOCK = 256  # one program per block: N // BLOCK tracks per rank


@triton.jit
def one_shot_all_reduce(context_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr,
                        TRACING: tl.constexpr):
    ctx = Context.initialize(context_ptr, W, tracing=TRACING)
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.zeros((BLOCK,), tl.float32)
    for i in range(W):
        peer = (ctx.rank + i) % W  # start with myself, then the next ranks: spreads the traffic
        transfer = ctx.tracing.record_event_start(EVENT_TRANSFER, peer, x_ptr + offs, pid, 0, mask=mask)
        value = ctx.load(x_ptr + offs, from_rank=peer, mask=mask, other=0.0)  # records a `load`
        ctx.tracing.record_event_end(transfer)
        reduce = ctx.tracing.record_event_start(EVENT_REDUCE, ctx.rank, out_ptr + offs, pid, 0, mask=mask)
        acc += value
        ctx.tracing.record_event_end(reduce)
    tl.store(out_ptr + offs, acc, mask=mask)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="directory for the trace JSON and the PNG")
    out_dir = parser.parse_args().out
    os.makedirs(out_dir, exist_ok=True)

    rt = iris_jax.init()
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    x = iris_jax.to_heap(jnp.arange(W * N, dtype=jnp.float32), sharding=NamedSharding(mesh, P("x")))

    iris_jax.tracing.enable(max_events=4096)  # before jitting: functions compiled from now on record

    def step(x):
        _, x = iris_jax.device_barrier(x)  # every rank's input is in place before peers read it
        out = iris_jax.triton_call(x, N, kernel=one_shot_all_reduce, out_shape=jax.ShapeDtypeStruct((N,), x.dtype),
                                   grid=(N // BLOCK,), W=W, BLOCK=BLOCK, TRACING=iris_jax.tracing.is_enabled(),
                                   symmetric=(0,))
        status, out = iris_jax.device_barrier(out)  # nobody leaves while a peer still reads its input
        return out, status

    run = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x"))))
    iris_jax.check_barrier(run(x)[1])  # the first run also loads the kernels on every device:
    iris_jax.tracing.reset()  # trace the second, steady-state one
    out, status = run(x)
    iris_jax.check_barrier(status)
    expected = np.arange(W * N, dtype=np.float32).reshape(W, N).sum(axis=0)
    np.testing.assert_allclose(np.asarray(out).reshape(W, N), np.broadcast_to(expected, (W, N)))

    json_path = os.path.join(out_dir, "trace_all_reduce.json")
    png_path = os.path.join(out_dir, "trace_all_reduce.png")
    traces = iris_jax.tracing.read()
    iris_jax.tracing.export(json_path)
    iris_jax.tracing.plot(json_path, png_path)
    iris_jax.tracing.disable()

    counts = {}
    for trace in traces:
        for e in trace.events:
            name = iris_jax.tracing.events.event_name(int(e["event_id"]))
            counts[name] = counts.get(name, 0) + 1
    expected_spans = W * (N // BLOCK) * W  # ranks x programs x peers
    for name in ("transfer", "load", "reduce"):
        assert counts.get(name) == expected_spans, (name, counts)
    assert counts.get("barrier") == 2 * W, counts
    assert all(t.dropped == 0 for t in traces)
    summary = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
    print(f"OK: {W} ranks ({rt.mode}); all-reduce verified; events: {summary}")
    print(f"trace: {json_path} (open in https://ui.perfetto.dev)\ntimeline: {png_path}")


if __name__ == "__main__":
    main()
