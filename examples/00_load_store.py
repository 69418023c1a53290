"""Remote load and store on the symmetric heap, inside jax.jit(jax.shard_map(...)).

Every device (rank) owns a row of `data` and an `inbox`, both on the symmetric heap.
One kernel reads the next rank's row with `ctx.load(..., from_rank=next)` and writes its
own row, times 10, into the next rank's inbox with `ctx.store(..., to_rank=next)`. After
a device barrier a second kernel reads the local inbox, which now holds the previous
rank's row.

Run: python examples/00_load_store.py
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

N = 37  # elements per rank
BLOCK = 64


@triton.jit
def load_next_store_next(context_ptr, data_ptr, inbox_ptr, n, loaded_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    next_rank = (ctx.rank + 1) % W
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    # remote load: the next rank's data (same offset, the next rank's heap)
    theirs = ctx.load(data_ptr + offs, from_rank=next_rank, mask=mask)
    tl.store(loaded_ptr + offs, theirs, mask=mask)
    # remote store: my data * 10 into the next rank's inbox
    mine = tl.load(data_ptr + offs, mask=mask)
    ctx.store(inbox_ptr + offs, mine * 10, to_rank=next_rank, mask=mask)


@triton.jit
def read_local(context_ptr, buf_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(buf_ptr + offs, mask=mask, volatile=True), mask=mask)


def main():
    rt = iris_jax.init()
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    rows = NamedSharding(mesh, P("x"))
    data = iris_jax.arange(W * N, dtype=jnp.float32, sharding=rows)  # rank r holds r*N .. r*N+N-1
    inbox = iris_jax.zeros((W * N,), jnp.float32, sharding=rows)
    row = jax.ShapeDtypeStruct((N,), jnp.float32)

    def step(data, inbox):
        loaded = iris_jax.triton_call(data, inbox, N, kernel=load_next_store_next, out_shape=row, grid=(1,),
                                      W=W, BLOCK=BLOCK, symmetric=(0, 1))
        # wait until every rank has stored into its peer. The barrier runs after the kernels
        # that produced its inputs (`loaded`), and what uses its outputs (`inbox`) after it.
        status, inbox, loaded = iris_jax.device_barrier(inbox, loaded)
        received = iris_jax.triton_call(inbox, N, kernel=read_local, out_shape=row, grid=(1,), BLOCK=BLOCK)
        return loaded, received, status

    loaded, received, status = jax.jit(jax.shard_map(
        step, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=(P("x"), P("x"), P("x"))))(data, inbox)
    iris_jax.check_barrier(status)

    rows_np = np.arange(W * N, dtype=np.float32).reshape(W, N)
    np.testing.assert_array_equal(np.asarray(loaded).reshape(W, N), np.roll(rows_np, -1, axis=0))
    np.testing.assert_array_equal(np.asarray(received).reshape(W, N), np.roll(rows_np * 10, 1, axis=0))
    print(f"OK: {W} ranks ({rt.mode}); each loaded its next rank's row and stored into its inbox")


if __name__ == "__main__":
    main()
