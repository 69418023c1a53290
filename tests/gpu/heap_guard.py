"""The heap guard on GPUs (issue 19, part 2): a scenario for both GPU execution models.

`heap_guard(world)` takes a tests/gpu/scenarios.World: it runs in the one-GPU multi-process
mode (scenarios.SCENARIOS["heap_guard"], test_gpu_shared.py), in one process over two or
more local GPUs (test_gpu_heap_guard.py) and on the simulator
(tests/jax/test_heap_guard.py). Inside jit, a kernel stores through an array that is not on the
heap (declared symmetric: on GPUs nothing checks it before the launch), and through a rank
outside the world: the guard masks both stores off and records them; the call raises
NotOnHeapError naming the op, the ranks and the offset (on GPUs through the fault gate, from
JAX's own read), once; every heap array stays poisoned, and the same program runs correctly
afterwards.
"""

from __future__ import annotations

import numpy as np
import triton
import triton.language as tl

from iris_core.device import Context

N = 4099  # a few tiles, not a multiple of anything
BLOCK = 1024
POISON = -7.0


@triton.jit
def store_to_rank(context_ptr, buf_ptr, x_ptr, n, peer_ptr, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """Stores x into rank peer_ptr[0]'s buf; out = x * 2 + rank."""
    ctx = Context.initialize(context_ptr, W)
    peer = tl.load(peer_ptr)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    x = tl.load(x_ptr + offs, mask=m)
    ctx.store(buf_ptr + offs, x, to_rank=peer, mask=m, hint=16)
    tl.store(out_ptr + offs, x * 2 + ctx.rank, mask=m)


def heap_guard(world) -> None:
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax.sync import check_heap_errors
    from tests.jax.kernels import read_local

    W = world.size
    xs = world.inputs(N, "float32", seed=19)
    poison = np.full((W, N), POISON, np.float32)
    on_heap = world.heap(poison)
    off_heap = world.put(poison)  # XLA's memory, not the heap
    x = world.put(xs)
    out_t = jax.ShapeDtypeStruct((N,), jnp.float32)
    grid = (-(-N // BLOCK),)

    def store(buf, x, shift):  # to rank + shift (shift W: outside the world)
        return world.smap(lambda b, x: iris_jax.triton_call(
            b, x, N, ((jax.lax.axis_index("i") + 1) % W + shift).reshape(1), kernel=store_to_rank, out_shape=out_t, grid=grid,
            W=W, BLOCK=BLOCK, symmetric=symmetric), (P("i"), P("i")), P("i"))(buf, x)

    read = world.smap(lambda b: iris_jax.triton_call(b, N, kernel=read_local, out_shape=out_t, grid=grid,
                                                     BLOCK=BLOCK), P("i"), P("i"))

    gpu = not world.runtime.backend.interprets_kernels
    # declared symmetric: on GPUs nothing checks that before the launch, the guard must catch
    # it; the simulator would refuse the launch, so there the guard is tested undeclared
    symmetric = (0,) if gpu else ()

    def refused(what, call, expected_message):
        """The call itself raises NotOnHeapError naming the op, the rank and the offset: on GPUs the
        fault gate fails its execution (with the gate off, the call runs with the refused lanes
        masked off and check_heap_errors raises after it), on the simulator the kernel raises (the
        first rank's error). Either way it is reported once."""
        try:
            out = jax.block_until_ready(call())
        except Exception as e:  # noqa: BLE001
            world.require(f"{what}: the error names it", any(expected_message(me) in str(e) for me in world.ranks)
                          and "NotOnHeapError" in str(e), str(e)[:600])
        else:
            world.require(f"{what}: the call raises (the fault gate is on)",
                          gpu and world.runtime.fault_gate == "off", "it returned")
            for me in world.ranks:  # the kernel ran: its local output is right
                world.expect(f"{what}: local output", world.shard(out, me), xs[me] * 2 + me, exact=True)
            try:
                check_heap_errors()
            except iris_jax.NotOnHeapError as e:
                for me in world.ranks:
                    world.require(f"{what}: the error names it", expected_message(me) in str(e), str(e)[:400])
            else:
                world.require(f"{what}: check_heap_errors raises NotOnHeapError", False, "it returned")
        world.require(f"{what}: reported once", _no_error(check_heap_errors), "a second check raised")
        got = read(on_heap)  # nothing landed on any heap array
        for me in world.ranks:
            world.expect(f"{what}: heap array untouched", world.shard(got, me), poison[me], exact=True)

    refused("store through an array off the heap", lambda: store(off_heap, x, 0),
            lambda me: f"on rank {me}: store to rank {(me + 1) % W} through a pointer at byte offset")
    refused("store to a rank outside the world", lambda: store(on_heap, x, W),
            lambda me: f"on rank {me}: store with rank {(me + 1) % W + W}, which is outside")
    out = store(on_heap, x, 0)  # the same program, on the heap: runs
    iris_jax.barrier()
    got = read(on_heap)
    for me in world.ranks:
        world.expect("store through a heap array", world.shard(out, me), xs[me] * 2 + me, exact=True)
        world.expect("store through a heap array landed", world.shard(got, me), xs[(me - 1) % W], exact=True)


def _no_error(check) -> bool:
    try:
        check()
    except Exception:  # noqa: BLE001
        return False
    return True
