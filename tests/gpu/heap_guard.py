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

    def untouched(what):  # nothing landed on any heap array
        got = read(on_heap)
        for me in world.ranks:
            world.expect(f"{what}: heap array untouched", world.shard(got, me), poison[me], exact=True)

    local = {me: xs[me] * 2 + me for me in world.ranks}
    refused(world, "store through an array off the heap", lambda: store(off_heap, x, 0),
            lambda me: f"on rank {me}: store to rank {(me + 1) % W} through a pointer at byte offset", local, untouched)
    refused(world, "store to a rank outside the world", lambda: store(on_heap, x, W),
            lambda me: f"on rank {me}: store with rank {(me + 1) % W + W}, which is outside", local, untouched)
    out = store(on_heap, x, 0)  # the same program, on the heap: runs
    iris_jax.barrier()
    got = read(on_heap)
    for me in world.ranks:
        world.expect("store through a heap array", world.shard(out, me), xs[me] * 2 + me, exact=True)
        world.expect("store through a heap array landed", world.shard(got, me), xs[(me - 1) % W], exact=True)


def refused(world, what: str, call, expected_message, local: dict, untouched) -> None:
    """The call itself raises NotOnHeapError naming the op, the rank and the offset: on GPUs the
    fault gate fails its execution (with the gate off, the call runs with the refused lanes
    masked off, its local output `local[rank]`, and check_heap_errors raises after it), on the
    simulator the kernel raises (the first rank's error). Either way it is reported once, and
    `untouched(what)` checks that nothing landed."""
    import jax

    import iris_jax
    from iris_jax.sync import check_heap_errors

    gpu = not world.runtime.backend.interprets_kernels
    try:
        out = jax.block_until_ready(call())
    except Exception as e:  # noqa: BLE001
        world.require(f"{what}: the error names it", any(expected_message(me) in str(e) for me in world.ranks)
                      and "NotOnHeapError" in str(e), str(e)[:600])
    else:
        world.require(f"{what}: the call raises (the fault gate is on)",
                      gpu and world.runtime.fault_gate == "off", "it returned")
        for me in world.ranks:  # the kernel ran: its local output is right
            world.expect(f"{what}: local output", world.shard(out, me), local[me], exact=True)
        try:
            check_heap_errors()
        except iris_jax.NotOnHeapError as e:
            for me in world.ranks:
                world.require(f"{what}: the error names it", expected_message(me) in str(e), str(e)[:400])
        else:
            world.require(f"{what}: check_heap_errors raises NotOnHeapError", False, "it returned")
    world.require(f"{what}: reported once", _no_error(check_heap_errors), "a second check raised")
    untouched(what)


@triton.jit
def store_at(context_ptr, buf_ptr, shift_ptr, peer_ptr, out_ptr, W: tl.constexpr):
    """Stores 1..16 (float32) at buf + shift elements on rank peer_ptr[0] (shift: an int64 as two
    int32 words, low then high); out = 16 x rank."""
    ctx = Context.initialize(context_ptr, W)
    shift = tl.load(shift_ptr).to(tl.uint32).to(tl.int64) | (tl.load(shift_ptr + 1).to(tl.int64) << 32)
    offs = tl.arange(0, 16)
    ctx.store(buf_ptr + shift + offs, offs.to(tl.float32) + 1, to_rank=tl.load(peer_ptr))
    tl.store(out_ptr + offs, tl.zeros((16,), tl.float32) + ctx.rank)


def heap_guard_bound(world) -> None:
    """The guard's bound is what is mapped, kept current as the heap grows (issue 66). One compiled
    program stores 16 floats at a byte offset from the heap base given as data, on the caller's own
    heap and on the next rank's: just past the mapped bytes, just below the upper bound and past it
    are refused and named, and nothing lands; after the heap grew (an array past its mapped
    bytes) the same program's store at the old bound lands in that array, and the new bound is
    refused. After each refusal the next call, into a heap array, works."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W, heap = world.size, world.runtime.heap
    poison = np.full((W, 64), POISON, np.float32)
    buf = world.heap(poison)
    base = iris_jax.heap_offset(buf)
    out_t = jax.ShapeDtypeStruct((16,), jnp.float32)
    program = world.smap(lambda b, shift, peer: iris_jax.triton_call(
        b, shift, peer, kernel=store_at, out_shape=out_t, grid=(1,), W=W, symmetric=(0,)),
        (P("i"), P("i"), P("i")), P("i"))
    local = {me: np.full(16, me, np.float32) for me in world.ranks}

    def store(at: int, step: int):
        """The program storing at byte `at` of the heap, each rank to rank + step."""
        shift = (at - base) // 4
        words = np.array([[shift & 0xFFFFFFFF, shift >> 32]] * W, np.uint32).view(np.int32)
        peers = np.array([[(r + step) % W] for r in range(W)], np.int32)
        return program(buf, world.put(words), world.put(peers))

    expected = {me: poison[me].copy() for me in world.ranks}  # buf's values: poison, then the last landed store

    def floats(me: int, at: int, count: int) -> np.ndarray:
        """count float32 of rank me's heap at byte `at`, read from the heap now (JAX keeps the host
        copy of an array it once read, and kernels write heap arrays in place)."""
        return np.asarray(heap.read_words(me, at, count // 2)).view(np.float32)

    def untouched(what):
        for me in world.ranks:
            world.expect(f"{what}: the heap array untouched", floats(me, base, 64), expected[me], exact=True)
        iris_jax.barrier()  # (processes: every rank checked before the next call stores into its peer)

    def works(what):
        """The next call, into the heap array at the next rank, lands."""
        out = store(base, 1)
        iris_jax.barrier()
        for me in world.ranks:
            expected[me][:16] = np.arange(1, 17)
            world.expect(f"after {what}: the next call's local output", world.shard(out, me), local[me], exact=True)
            world.expect(f"after {what}: the next call's store landed", floats(me, base, 64), expected[me], exact=True)
        iris_jax.barrier()

    def cases(bound: int, when: str):
        upper = heap.heap_size
        places = [(bound, f"past the heap's {bound} mapped bytes" if upper > bound else
                   f"past the heap's end ({bound} bytes)")]
        if upper > bound + (64 << 20):
            places.append((upper - 64, f"past the heap's {bound} mapped bytes (below its upper bound of {upper}"))
        places.append((upper + (1 << 30), f"past the heap's upper bound ({upper} bytes" if upper > bound else
                       f"past the heap's end ({bound} bytes)"))
        for at, where in places:
            for step, whose in ((0, "its own heap"), (1, "the next rank's heap")):
                what = f"{when}: a store at byte {at} on {whose}"
                refused(world, what, lambda at=at, step=step: store(at, step),
                        lambda me, at=at, step=step, where=where: (
                            f"on rank {me}: store to rank {(me + step) % W} through a pointer at byte offset {at} "
                            f"from the caller's heap base, {where}"), local, untouched)
                works(what)

    before = heap.mapped_size
    cases(before, "before a growth")
    if heap.heap_size - before < 2 * heap.GROWTH_STEP:
        world.say(f"the heap maps its whole upper bound ({before} bytes): no growth to test")
        return
    filler = iris_jax.empty((W * (before // 4),), jnp.float32, sharding=world.rows)  # cannot fit: the heap grows
    iris_jax.barrier()
    after, start = heap.mapped_size, iris_jax.heap_offset(filler)
    world.require("the heap grew", after > before and start <= before < start + before, (before, after, start))
    for step in (0, 1):  # the old bound is memory now, inside the filler: the same program's store lands
        out = store(before, step)
        iris_jax.barrier()
        for me in world.ranks:
            world.expect(f"after a growth: a store at the old bound ({before}) to rank +{step}: local output",
                         world.shard(out, me), local[me], exact=True)
            landed = floats(me, before, 16)
            world.expect(f"after a growth: the store at the old bound to rank +{step} landed", landed,
                         np.arange(1, 17, dtype=np.float32), exact=True)
        iris_jax.barrier()
    cases(after, "after a growth")
    del filler


def _no_error(check) -> bool:
    try:
        check()
    except Exception:  # noqa: BLE001
        return False
    return True
