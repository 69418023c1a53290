"""A one-shot all-reduce written as a Pallas kernel with iris (experimental), checked against lax.psum.

`iris_jax.pallas.pallas_call` runs a Pallas kernel whose first argument is an iris context:
`ctx.rank`, `ctx.world_size` and remote ops on the refs of heap arrays (`symmetric=`).
Each rank writes its vector into its slot of a heap buffer, raises a flag on every peer
(release, system scope), waits until every peer's flag on its own heap is up (acquire),
then reads every peer's buffer and sums. Called again, a rank that finished early would
overwrite its slot while a slower peer still reads it: call again with epoch + 1 only after
`iris_jax.device_barrier` (or alternate two buffers by epoch). GPUs: Pallas's Triton backend; without GPUs: Pallas
interpret mode on the CPU simulator, every rank at once.

Run: python examples/06_pallas_all_reduce.py
(all local GPUs; without GPUs, the CPU simulator with 4 ranks)
"""

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402
from iris_jax import pallas as ipl  # noqa: E402

N = 256  # elements per rank (a power of two: Triton blocks)


def one_shot_all_reduce(ctx, buf_ref, flags_ref, epoch_ref, x_ref, o_ref):
    epoch = epoch_ref[0]
    ctx.store(buf_ref, x_ref[...], to_rank=ctx.rank)  # my slot of the heap buffer
    ctx.sync_threads()  # every thread's part of the store is done before the flag goes up
    for peer in range(ctx.world_size):
        ctx.atomic_max(flags_ref.at[ctx.rank], epoch, to_rank=peer, sem="release")
    total = jnp.zeros_like(x_ref[...])
    for peer in range(ctx.world_size):
        ctx.wait(flags_ref.at[peer], epoch)  # acquire: peer's buffer is complete
        total += ctx.load(buf_ref, from_rank=peer)
    o_ref[...] = total


def main():
    rt = iris_jax.init()
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    rows = NamedSharding(mesh, P("x"))
    buf = iris_jax.zeros((W * N,), jnp.float32, sharding=rows)  # N per rank, on the heap
    flags = iris_jax.zeros((W * W,), jnp.int32, sharding=rows)  # slot p on my heap: rank p's epoch
    x = jax.device_put(jax.random.normal(jax.random.key(0), (W * N,)), rows)

    all_reduce = ipl.pallas_call(one_shot_all_reduce, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32),
                                 symmetric=(0, 1))
    epoch = jax.device_put(jnp.ones((W,), jnp.int32), rows)  # one int per rank: this call's epoch
    step = jax.jit(jax.shard_map(lambda b, f, e, x: (all_reduce(b, f, e, x), lax.psum(x, "x")), mesh=mesh,
                                 in_specs=(P("x"),) * 4, out_specs=(P("x"), P("x"))))
    got, expect = step(buf, flags, epoch, x)
    got = np.asarray(got).reshape(W, N)
    np.testing.assert_allclose(got, np.asarray(expect).reshape(W, N), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[0], np.asarray(x).reshape(W, N).sum(0), rtol=1e-5, atol=1e-5)
    print(f"OK: {W} ranks ({rt.mode}); a Pallas one-shot all-reduce equals lax.psum")


if __name__ == "__main__":
    main()
