"""Atomics on peers' heaps, inside jit: a global sum, a global max, and a leader election.

Every rank owns three int32 counters on the symmetric heap, all zero at the start:

* counters[0]: every rank atomically adds rank + 1 into every rank's slot
  -> W * (W + 1) / 2 everywhere;
* counters[1]: every rank atomically maxes 10 * rank into every rank's slot -> 10 * (W - 1);
* counters[2] on rank 0: every rank tries compare-and-swap 0 -> rank + 1; exactly one
  succeeds (its CAS returns the old value 0) and becomes the leader.

The atomics default to acq_rel ordering at system scope, the safe choice across GPUs.

Run: python examples/02_atomics.py
(all local GPUs; without GPUs, the CPU simulator with 4 ranks)
"""

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
from iris_jax import Context  # noqa: E402


@triton.jit
def atomics(context_ptr, counters_ptr, old_ptr, W: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    for peer in range(W):
        ctx.atomic_add(counters_ptr + 0, ctx.rank + 1, to_rank=peer)
        ctx.atomic_max(counters_ptr + 1, ctx.rank * 10, to_rank=peer)
    old = ctx.atomic_cas(counters_ptr + 2, 0, ctx.rank + 1, to_rank=0)
    tl.store(old_ptr, old)  # 0 for the one rank that won


@triton.jit
def read_counters(context_ptr, counters_ptr, out_ptr, W: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, 4)
    mask = offs < 3
    # an atomic read (add 0) of my own counters: sees every peer's completed update
    tl.store(out_ptr + offs, ctx.atomic_add(counters_ptr + offs, 0, to_rank=ctx.rank, mask=mask), mask=mask)


def main():
    rt = iris_jax.init()
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    counters = iris_jax.zeros((W * 3,), jnp.int32, sharding=NamedSharding(mesh, P("x")))

    def step(counters):
        old = iris_jax.triton_call(counters, kernel=atomics, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                                   grid=(1,), W=W, symmetric=(0,))
        status, counters, old = iris_jax.device_barrier(counters, old)
        final = iris_jax.triton_call(counters, kernel=read_counters, out_shape=jax.ShapeDtypeStruct((3,), jnp.int32),
                                     grid=(1,), W=W, symmetric=(0,))
        return old, final, status

    old, final, status = jax.jit(jax.shard_map(
        step, mesh=mesh, in_specs=P("x"), out_specs=(P("x"), P("x"), P("x"))))(counters)
    iris_jax.check_barrier(status)

    old, final = np.asarray(old), np.asarray(final).reshape(W, 3)
    np.testing.assert_array_equal(final[:, 0], np.full(W, W * (W + 1) // 2))
    np.testing.assert_array_equal(final[:, 1], np.full(W, 10 * (W - 1)))
    winners = np.flatnonzero(old == 0)
    assert len(winners) == 1, f"expected one leader, CAS results {old}"
    leader = int(winners[0])
    assert final[0, 2] == leader + 1, (final[0, 2], leader)
    assert set(old[old != 0]) <= {leader + 1}, old  # the losers saw the leader's id
    print(f"OK: {W} ranks ({rt.mode}); sum {final[0, 0]}, max {final[0, 1]}, leader rank {leader}")


if __name__ == "__main__":
    main()
