"""Run by test_launched.py as `python -m iris_core.sim -n 2 launched_growth.py` with
IRIS_SIM_DEVICE_MEMORY=1:167772160 (rank 1's simulated device holds 160 MiB).

Each rank (one process) has a heap of upper bound 512 MiB that maps 64 MiB at start. An array
of 16 MiB fits; one of 96 MiB grows the heap to 128 MiB on both ranks together (the processes
agree through the store before either returns). A kernel then stores into the next rank's copy
of the new array's last elements, and each rank reads its own. An array of 128 MiB would need
256 MiB mapped, more than rank 1's device has: HeapExhaustedError on both ranks, nothing
changed; an 8 MiB array still fits.
"""

import jax
import jax.numpy as jnp
import numpy as np
import triton
import triton.language as tl

import iris_jax
from iris_jax import Context

MiB = 1 << 20
N = 64


@triton.jit
def store_to_next(context_ptr, buf_ptr, at, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    ctx.store(buf_ptr + at + offs, (ctx.rank * 100 + offs).to(tl.float32), to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr, ctx.rank)


def main():
    rt = iris_jax.init(heap_size=512 * MiB)
    (device,) = jax.devices()
    rank, world = rt.rank_of(device), rt.world_size
    assert iris_jax.memory_stats()["bytes_mapped"] == 64 * MiB
    first = iris_jax.zeros((4 * MiB,), jnp.float32, device=device)
    big = iris_jax.zeros((24 * MiB,), jnp.float32, device=device)  # 96 MiB: grows
    stats = iris_jax.memory_stats()
    assert (stats["bytes_mapped"], stats["num_growths"]) == (128 * MiB, 1), stats
    assert stats["arrays_bytes_in_use"] == 112 * MiB, stats
    at = big.shape[0] - N
    send = jax.jit(lambda buf: iris_jax.triton_call(
        buf, at, kernel=store_to_next, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(1,), W=world,
        BLOCK=N, symmetric=(0,)))
    iris_jax.barrier()
    assert int(send(big)[0]) == rank
    iris_jax.barrier()  # every rank stored into its peer's copy
    prev = (rank - 1) % world
    got = rt.heap.host_view(rank, iris_jax.heap_offset(big) + 4 * at, (N,), np.float32)
    np.testing.assert_array_equal(got, prev * 100 + np.arange(N, dtype=np.float32))
    print(f"rank {rank}: grew to 128 MiB, received from rank {prev} in the new range OK", flush=True)

    before = iris_jax.memory_stats()
    try:
        iris_jax.zeros((32 * MiB,), jnp.float32, device=device)  # 128 MiB more: 256 MiB mapped
    except iris_jax.HeapExhaustedError as e:
        assert "rank 1's simulated device has 160.00 MiB" in str(e), e
        assert "arrays 112.00 MiB (2)" in str(e), e
        print(f"rank {rank}: HeapExhaustedError naming rank 1's device", flush=True)
    else:
        raise AssertionError("the growth past rank 1's device memory did not fail")
    after = iris_jax.memory_stats()
    assert after == before, (before, after)
    iris_jax.zeros((2 * MiB,), jnp.float32, device=device)  # 8 MiB still fits the mapped 128 MiB
    np.testing.assert_array_equal(np.asarray(first[:4]), np.zeros(4, np.float32))
    print(f"rank {rank}: nothing changed, smaller arrays still fit", flush=True)
    iris_jax.barrier()


if __name__ == "__main__":
    main()
