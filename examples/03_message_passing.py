"""Producer/consumer message passing with flags, inside jit, over several rounds.

The ranks form a ring. In round k every rank r
  1. sends its current vector to rank r + 1: stores it into slot k of that rank's
     `mailbox`, then sets that rank's `flags[k]` with a *release* atomic (the payload is
     visible before the flag);
  2. waits for its own `flags[k]` with an *acquire* atomic (spinning until the previous
     rank's message arrived), reads mailbox slot k, and adds its rank: that becomes its
     vector for the next round.
After ROUNDS rounds rank r holds its start vector passed around the ring, which the
script checks against numpy. Each round has its own slot and flag, so a fast producer
never overwrites a message that was not consumed yet.

Run: python examples/03_message_passing.py
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

N = 29  # elements per message
BLOCK = 32
ROUNDS = 5


@triton.jit
def ring_rounds(context_ptr, x_ptr, mailbox_ptr, flags_ptr, n, out_ptr, W: tl.constexpr, ROUNDS: tl.constexpr,
                BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    next_rank = (ctx.rank + 1) % W
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    value = tl.load(x_ptr + offs, mask=mask, other=0)
    for k in range(ROUNDS):
        slot = mailbox_ptr + k * BLOCK + offs
        # producer: payload first, then the flag with release semantics
        ctx.store(slot, value, to_rank=next_rank, mask=mask)
        tl.debug_barrier()  # every thread's payload store precedes the flag
        ctx.atomic_xchg(flags_ptr + k, 1, to_rank=next_rank, sem="release")
        # consumer: spin on my own flag with acquire semantics, then read the payload
        while ctx.atomic_add(flags_ptr + k, 0, to_rank=ctx.rank, sem="acquire") == 0:
            pass
        value = tl.load(slot, mask=mask, other=0, volatile=True) + ctx.rank
    tl.store(out_ptr + offs, value, mask=mask)


def main():
    rt = iris_jax.init()
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    rows = NamedSharding(mesh, P("x"))
    x = jax.device_put(jnp.arange(W * N, dtype=jnp.float32), rows)
    mailbox = iris_jax.zeros((W * ROUNDS * BLOCK,), jnp.float32, sharding=rows)  # ROUNDS slots per rank
    flags = iris_jax.zeros((W * ROUNDS,), jnp.int32, sharding=rows)  # one flag per round per rank

    def step(x, mailbox, flags):
        return iris_jax.triton_call(x, mailbox, flags, N, kernel=ring_rounds,
                                    out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), grid=(1,),
                                    W=W, ROUNDS=ROUNDS, BLOCK=BLOCK, symmetric=(1, 2))

    out = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("x"),) * 3, out_specs=P("x")))(x, mailbox, flags)

    expected = np.arange(W * N, dtype=np.float32).reshape(W, N)
    for _ in range(ROUNDS):  # each round: move one rank along the ring, add the receiver's rank
        expected = np.roll(expected, 1, axis=0) + np.arange(W, dtype=np.float32)[:, None]
    np.testing.assert_array_equal(np.asarray(out).reshape(W, N), expected)
    print(f"OK: {W} ranks ({rt.mode}); {ROUNDS} rounds of flag-synchronized messages around the ring")


if __name__ == "__main__":
    main()
