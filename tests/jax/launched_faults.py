"""Run by test_faults.py as `python -m iris_core.sim -n W launched_faults.py CASE`: one fault per run.

Rank `VICTIM` (1) misbehaves, the others wait for it in a device barrier (bounded by
BARRIER_TIMEOUT_S). Every rank prints what it is about to do, with its pid, so the test can
time the error from there and kill a rank at the right moment:

* kill: ranks 0 and 1 wait in the barrier for rank 2, which never calls it; the test SIGKILLs
  rank 1 there.
* raise: the victim runs a kernel whose store the heap guard refuses (NotOnHeapError).
* never_init: the victim never calls `iris_jax.init()`; rank 0's init times out
  (IRIS_RENDEZVOUS_TIMEOUT).
* skip_barrier: the victim initializes but never calls the barrier; the others' barrier times out.
* shapes: a multi-controller run (`jax.distributed.initialize()`) whose processes disagree on the
  shape: rank r's shard holds N + r elements; every rank calls one psum (timeout
  BARRIER_TIMEOUT_S) and says what it returned.
"""

import os
import sys
import time

CASE = sys.argv[1]
RANK, WORLD = int(os.environ["IRIS_SIM_RANK"]), int(os.environ["IRIS_SIM_WORLD_SIZE"])
VICTIM = 1
BARRIER_TIMEOUT_S = float(os.environ.get("FAULT_BARRIER_TIMEOUT", "120"))  # longer than the launcher takes
N = 64


def say(what: str) -> None:
    print(f"rank {RANK} pid {os.getpid()}: {what}", flush=True)


def idle() -> None:
    say("idle")
    time.sleep(600)  # until the launcher stops this rank


def shapes_differ() -> None:
    import jax

    jax.distributed.initialize()
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    iris_jax.init(heap_size=16 << 20)
    n = N + RANK  # this process's idea of every shard's length
    mesh = jax.make_mesh((WORLD,), ("i",), devices=jax.devices())
    host = np.arange(WORLD * n, dtype=np.float32)
    x = jax.make_array_from_callback((WORLD * n,), NamedSharding(mesh, P("i")), lambda index: host[index])
    config = iris_jax.CollectiveConfig(timeout_s=BARRIER_TIMEOUT_S)
    psum = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i", config=config), mesh=mesh, in_specs=P("i"),
                                 out_specs=P())).lower(x).compile()
    say(f"psum of {n} elements per rank")
    out = np.asarray(psum(x).addressable_shards[0].data)
    say(f"psum returned {out.shape[0]} elements without an error")


def main() -> None:
    if CASE == "shapes":
        return shapes_differ()
    if CASE == "never_init" and RANK == VICTIM:
        idle()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import iris_jax
    from tests.jax.fault_kernels import store_past_heap_on_rank

    say("init")
    rt = iris_jax.init()
    say(f"session {rt.heap.session}")
    # compiled by every rank: its first trace allocates the barrier's heap block, a host sync
    barrier = jax.jit(lambda: iris_jax.device_barrier(timeout_s=BARRIER_TIMEOUT_S)[0]).lower().compile()
    if (CASE, RANK) in (("skip_barrier", VICTIM), ("kill", 2)):
        idle()
    if RANK == VICTIM and CASE == "raise":
        device = rt.devices[0]
        buf = iris_jax.zeros((N,), jnp.float32, device=device)
        x = jax.device_put(np.ones(N, np.float32), device)
        store = jax.jit(lambda b, x: iris_jax.triton_call(
            b, x, N, VICTIM, rt.heap_size // 4, kernel=store_past_heap_on_rank,
            out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), grid=(1,), W=WORLD, BLOCK=N))
        say("store")
        jax.block_until_ready(store(buf, x))
        say("stored: unexpected")
        return
    say("barrier")
    iris_jax.check_barrier(barrier())
    say("passed the barrier: unexpected")


if __name__ == "__main__":
    main()
