"""Run by test_launched.py as `python -m iris_core.sim -n W launched_ring.py`.

Each rank (one process, one CPU device) makes a heap buffer and a flag, writes a payload
into the next rank's buffer and bumps that rank's flag (release), then waits for its own
flag (acquire) and checks it holds the previous rank's payload.
"""

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import iris_jax
from iris_jax import Context

N = 8


@triton.jit
def send_to_next(context_ptr, buf_ptr, flag_ptr, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    peer = (ctx.rank + 1) % W
    offs = tl.arange(0, BLOCK)
    ctx.store(buf_ptr + offs, (ctx.rank * 100 + offs).to(tl.float32), to_rank=peer)
    ctx.atomic_add(flag_ptr, 1, to_rank=peer, sem="release")
    tl.store(out_ptr, ctx.rank)


@triton.jit
def wait_and_read(context_ptr, flag_ptr, buf_ptr, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    while ctx.atomic_add(flag_ptr, 0, to_rank=ctx.rank, sem="acquire") < 1:
        pass
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(buf_ptr + offs))


def main():
    rt = iris_jax.init()
    assert rt.mode == "sim-launched", rt.mode
    (device,) = jax.devices()
    rank, world = rt.rank_of(device), rt.world_size
    buf = iris_jax.zeros((N,), jnp.float32, device=device)
    flag = iris_jax.zeros((1,), jnp.int32, device=device)
    assert iris_jax.is_symmetric(buf) and iris_jax.is_symmetric(flag)
    iris_jax.barrier()  # every rank zeroed its flag before any peer bumps it

    send = jax.jit(lambda buf, flag: iris_jax.triton_call(
        buf, flag, kernel=send_to_next, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(1,),
        W=world, BLOCK=N, symmetric=(0, 1)))
    receive = jax.jit(lambda flag, buf: iris_jax.triton_call(
        flag, buf, kernel=wait_and_read, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), grid=(1,),
        W=world, BLOCK=N, symmetric=(0, 1)))

    assert int(send(buf, flag)[0]) == rank
    got = np.asarray(receive(flag, buf))
    prev = (rank - 1) % world
    expected = prev * 100 + np.arange(N, dtype=np.float32)
    np.testing.assert_array_equal(got, expected)
    # the heap itself holds the same values (read behind XLA's back)
    np.testing.assert_array_equal(rt.heap.host_view(rank, iris_jax.heap_offset(buf), (N,), np.float32), expected)
    print(f"rank {rank}/{world}: received from rank {prev} OK", flush=True)
    iris_jax.barrier()  # keep our heap mapped until every peer has read theirs


if __name__ == "__main__":
    main()
