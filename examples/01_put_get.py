"""Put and get: bulk copies between my memory and a peer's heap, inside jit.

`ctx.put(src, dst, to_rank)` copies my local `src` (any buffer) into `to_rank`'s heap at
the offset of `dst`; `ctx.get(src, dst, from_rank)` copies `from_rank`'s heap at `src`
into my local `dst` (here: the kernel's output). Every rank puts its vector `x` into the
next rank's `mailbox`; after a device barrier every rank gets the previous rank's mailbox,
which holds the vector of the rank two places before it.

Run: python examples/01_put_get.py
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

N = 45  # elements per rank
BLOCK = 64


@triton.jit
def put_to_next(context_ptr, x_ptr, mailbox_ptr, n, done_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    # x is an ordinary (non-heap) input: put reads it locally, writes the peer's heap
    ctx.put(x_ptr + offs, mailbox_ptr + offs, to_rank=(ctx.rank + 1) % W, mask=offs < n)
    tl.store(done_ptr, ctx.rank)


@triton.jit
def get_from_prev(context_ptr, mailbox_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    ctx.get(mailbox_ptr + offs, out_ptr + offs, from_rank=(ctx.rank + W - 1) % W, mask=offs < n)


def main():
    rt = iris_jax.init()
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    rows = NamedSharding(mesh, P("x"))
    x = jax.device_put(jax.random.normal(jax.random.key(0), (W * N,)), rows)  # ordinary array
    mailbox = iris_jax.zeros((W * N,), jnp.float32, sharding=rows)  # on the heap

    def step(x, mailbox):
        done = iris_jax.triton_call(x, mailbox, N, kernel=put_to_next, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                                    grid=(1,), W=W, BLOCK=BLOCK, symmetric=(1,))
        status, mailbox, done = iris_jax.device_barrier(mailbox, done)
        got = iris_jax.triton_call(mailbox, N, kernel=get_from_prev, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32),
                                   grid=(1,), W=W, BLOCK=BLOCK, symmetric=(0,))
        return got, done, status

    got, done, status = jax.jit(jax.shard_map(
        step, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x"), P("x"))))(x, mailbox)
    iris_jax.check_barrier(status)

    x_np = np.asarray(x).reshape(W, N)
    np.testing.assert_array_equal(np.asarray(done), np.arange(W))
    np.testing.assert_array_equal(np.asarray(got).reshape(W, N), np.roll(x_np, 2, axis=0))
    print(f"OK: {W} ranks ({rt.mode}); put to the next rank, got from the previous one "
          f"(rank 0 holds rank {(0 - 2) % W}'s vector)")


if __name__ == "__main__":
    main()
