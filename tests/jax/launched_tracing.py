"""Run by test_tracing.py as `python -m iris_core.sim -n W launched_tracing.py OUT_JSON`.

Every rank (one process each) enables tracing, runs a barrier and a traced read of the
next rank's data, then reads every rank's events from the shared heaps; rank 0 exports.
"""

import sys

import jax
import jax.numpy as jnp
import numpy as np

import iris_jax
from iris_jax.tracing import events
from tests.jax.tracing_kernels import read_next

N = 13


def main():
    rt = iris_jax.init()
    assert rt.mode == "sim-launched", rt.mode
    (device,) = jax.devices()
    rank, W = rt.rank_of(device), rt.world_size
    x = iris_jax.full((N,), rank, jnp.float32, device=device)
    iris_jax.tracing.enable(max_events=64)  # every rank: the same allocation, one offset
    iris_jax.barrier()  # every rank's x is written before a peer reads it

    @jax.jit
    def step(x):
        status, x = iris_jax.device_barrier(x)
        out = iris_jax.triton_call(x, N, kernel=read_next, out_shape=jax.ShapeDtypeStruct((N,), x.dtype), grid=(1,),
                                   W=W, BLOCK=16, TRACING=iris_jax.tracing.is_enabled(), symmetric=(0,))
        return out, status

    out, status = step(x)
    iris_jax.check_barrier(status)
    np.testing.assert_array_equal(np.asarray(out), np.full(N, (rank + 1) % W))
    iris_jax.barrier()  # every rank's kernels finished: any process can read every rank
    for t in iris_jax.tracing.read():
        names = [events.event_name(int(i)) for i in t.events["event_id"]]
        assert sorted(names) == sorted(["barrier"] + ["atomic_max"] * W + ["transfer", "load"]), (t.rank, names)
        load = t.events[t.events["event_id"] == events.LOAD]
        assert np.all(t.events["cur_rank"] == t.rank) and load["target_rank"][0] == (t.rank + 1) % W
    if rank == 0:
        iris_jax.tracing.export(sys.argv[1])
    iris_jax.barrier()
    print(f"rank {rank}/{W}: tracing OK", flush=True)


if __name__ == "__main__":
    main()
