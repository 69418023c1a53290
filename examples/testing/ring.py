"""A tiny library of multi-GPU code, tested on iris's simulator by test_ring.py (pytest-iris).

`shift(x, mesh)` moves each rank's block to the next rank (lax.ppermute's answer for a
one-step ring), written as a user's kernels would be: one stores into the next rank's heap,
a device barrier, one reads what arrived.
"""

import jax
import jax.numpy as jnp
import triton
import triton.language as tl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import Context


@triton.jit
def put_to_next(context_ptr, inbox_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """x into the next rank's inbox; out = x."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    ctx.store(inbox_ptr + offs, x, to_rank=(ctx.rank + 1) % W, mask=offs < n)
    tl.store(out_ptr + offs, x, mask=offs < n)


@triton.jit
def read_local(context_ptr, inbox_ptr, n, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(inbox_ptr + offs, mask=offs < n, volatile=True), mask=offs < n)


def shift(x: jax.Array, mesh: jax.sharding.Mesh, axis: str = "i") -> jax.Array:
    """x (sharded over `axis` of `mesh`) with every rank's block moved to the next rank."""
    W, n = mesh.shape[axis], x.shape[0] // mesh.shape[axis]
    block, row = triton.next_power_of_2(n), jax.ShapeDtypeStruct((n,), x.dtype)
    inbox = iris_jax.zeros(x.shape, x.dtype, sharding=NamedSharding(mesh, P(axis)))

    def step(inbox, x):
        sent = iris_jax.triton_call(inbox, x, n, kernel=put_to_next, out_shape=row, grid=(1,), W=W, BLOCK=block,
                                    symmetric=(0,))
        status, inbox, sent = iris_jax.device_barrier(inbox, sent)  # every rank's store has landed
        return iris_jax.triton_call(inbox, n, kernel=read_local, out_shape=row, grid=(1,), BLOCK=block), status

    out, status = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(axis), P(axis)),
                                        out_specs=(P(axis), P(axis))))(inbox, x)
    iris_jax.check_barrier(status)
    return jnp.asarray(out)
