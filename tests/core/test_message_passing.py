"""Producer/consumer between ranks: payload stores, release flags, acquire spins.

Every message depends on the one before, so a stale read, a lost flag or a reordering
shows up in the log each receiver keeps; a deadlock fails the call at the timeout.
"""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.device import Context
from iris_core.sim import get_world, launch

BLOCK = 64
N = 37
MODULUS = 1_000_003
TIMEOUT_S = 120


@triton.jit
def _wait_at_least(ctx, flag_ptr, target):
    """Spins (acquire, system scope) until my flag reaches `target`."""
    while ctx.atomic_add(flag_ptr, 0, ctx.rank, sem="acquire", scope="sys") < target:
        pass


@triton.jit
def ping_pong_kernel(context_ptr, init_ptr, buf_ptr, flag_ptr, log_ptr, n, ROUNDS: tl.constexpr, W: tl.constexpr,
                     BLOCK: tl.constexpr, MODULUS: tl.constexpr):
    """Ranks 0 and 1 alternate 2 * ROUNDS messages; each sender transforms what it last received."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    if ctx.rank < 2:
        peer = 1 - ctx.rank
        for step in range(2 * ROUNDS):
            if step % 2 == ctx.rank:
                if step == 0:
                    value = tl.load(init_ptr + offs, mask=mask, other=0)
                else:
                    value = (tl.load(buf_ptr + offs, mask=mask, other=0) * 3 + step) % MODULUS
                ctx.store(buf_ptr + offs, value, peer, mask=mask)
                ctx.atomic_xchg(flag_ptr, step + 1, peer, sem="release", scope="sys")
            else:
                _wait_at_least(ctx, flag_ptr, step + 1)
                tl.store(log_ptr + step * BLOCK + offs, tl.load(buf_ptr + offs, mask=mask), mask=mask)


def ping_pong_rank(state, session, offsets, rounds):
    heap = state.heap(session)
    view = lambda name, shape: heap.host_view(state.rank, offsets[name], shape, np.int32)
    launch(ping_pong_kernel, (1,), heap.context(state.rank), view("init", (BLOCK,)), view("buf", (BLOCK,)),
           view("flag", (1,)), view("log", (2 * rounds, BLOCK)), N, ROUNDS=rounds, W=state.world_size,
           BLOCK=BLOCK, MODULUS=MODULUS)


def ping_pong_reference(init: np.ndarray, rounds: int) -> np.ndarray:
    """The message of every step (row step), as received by rank (step + 1) % 2."""
    messages = np.empty((2 * rounds, BLOCK), np.int64)
    messages[0] = init
    for step in range(1, 2 * rounds):
        messages[step] = (messages[step - 1] * 3 + step) % MODULUS
    return messages


@pytest.mark.parametrize("world_size", [2, 3])
def test_ping_pong_fifty_rounds(sim_heap, world_size):
    rounds = 50
    heap = sim_heap(world_size)
    shapes = {"init": (BLOCK,), "buf": (BLOCK,), "flag": (1,), "log": (2 * rounds, BLOCK)}
    offsets = {k: heap.allocate(int(np.prod(s)) * 4) for k, s in shapes.items()}
    init = np.arange(BLOCK, dtype=np.int32) * 1000 + 17
    for r in range(world_size):
        heap.host_view(r, offsets["init"], (BLOCK,), np.int32)[:] = init if r == 0 else -3
        heap.host_view(r, offsets["buf"], (BLOCK,), np.int32)[:] = -1
        heap.host_view(r, offsets["flag"], (1,), np.int32)[:] = 0
        heap.host_view(r, offsets["log"], shapes["log"], np.int32)[:] = -1

    get_world(world_size).run(ping_pong_rank, heap.session, offsets, rounds, timeout_s=TIMEOUT_S)

    messages = ping_pong_reference(init, rounds)
    for r in range(world_size):
        log = heap.host_view(r, offsets["log"], shapes["log"], np.int32)
        buf = heap.host_view(r, offsets["buf"], (BLOCK,), np.int32)
        expected_log = np.full(shapes["log"], -1, np.int64)
        expected_buf = np.full(BLOCK, -1, np.int64)
        if r < 2:
            received = [s for s in range(2 * rounds) if s % 2 != r]
            expected_log[received, :N] = messages[received, :N]
            expected_buf[:N] = messages[received[-1], :N]
            assert heap.host_view(r, offsets["flag"], (1,), np.int32)[0] == received[-1] + 1
        np.testing.assert_array_equal(log, expected_log, err_msg=f"rank {r} log")
        np.testing.assert_array_equal(buf, expected_buf, err_msg=f"rank {r} buffer")


@triton.jit
def ring_kernel(context_ptr, init_ptr, buf_ptr, flag_ptr, log_ptr, n, LAPS: tl.constexpr, W: tl.constexpr,
                BLOCK: tl.constexpr, MODULUS: tl.constexpr):
    """A token goes LAPS times around the ring; every hop the holder transforms and forwards it."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    next_rank = (ctx.rank + 1) % W
    for lap in range(LAPS):
        hop = lap * W + ctx.rank  # the hop this rank sends
        if hop == 0:
            value = tl.load(init_ptr + offs, mask=mask, other=0)
        else:
            _wait_at_least(ctx, flag_ptr, lap + (ctx.rank != 0))
            value = tl.load(buf_ptr + offs, mask=mask, other=0)
            tl.store(log_ptr + (hop - 1) * BLOCK + offs, value, mask=mask)
            value = (value * 2 + ctx.rank + hop) % MODULUS
        ctx.store(buf_ptr + offs, value, next_rank, mask=mask)
        ctx.atomic_add(flag_ptr, 1, next_rank, sem="release", scope="sys")
    if ctx.rank == 0:  # the token's last hop comes home
        _wait_at_least(ctx, flag_ptr, LAPS)
        tl.store(log_ptr + (LAPS * W - 1) * BLOCK + offs, tl.load(buf_ptr + offs, mask=mask), mask=mask)


def ring_rank(state, session, offsets, laps):
    heap = state.heap(session)
    view = lambda name, shape: heap.host_view(state.rank, offsets[name], shape, np.int32)
    launch(ring_kernel, (1,), heap.context(state.rank), view("init", (BLOCK,)), view("buf", (BLOCK,)),
           view("flag", (1,)), view("log", (laps * state.world_size, BLOCK)), N, LAPS=laps, W=state.world_size,
           BLOCK=BLOCK, MODULUS=MODULUS)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_token_ring(sim_heap, world_size):
    laps = 12
    hops = laps * world_size
    heap = sim_heap(world_size)
    shapes = {"init": (BLOCK,), "buf": (BLOCK,), "flag": (1,), "log": (hops, BLOCK)}
    offsets = {k: heap.allocate(int(np.prod(s)) * 4) for k, s in shapes.items()}
    init = (np.arange(BLOCK, dtype=np.int32) * 7919) % MODULUS
    for r in range(world_size):
        heap.host_view(r, offsets["init"], (BLOCK,), np.int32)[:] = init if r == 0 else -3
        heap.host_view(r, offsets["buf"], (BLOCK,), np.int32)[:] = -1
        heap.host_view(r, offsets["flag"], (1,), np.int32)[:] = 0
        heap.host_view(r, offsets["log"], shapes["log"], np.int32)[:] = -1

    get_world(world_size).run(ring_rank, heap.session, offsets, laps, timeout_s=TIMEOUT_S)

    # message of hop h (sent by rank h % W, received by (h + 1) % W)
    messages = np.empty((hops, BLOCK), np.int64)
    messages[0] = init
    for hop in range(1, hops):
        messages[hop] = (messages[hop - 1] * 2 + hop % world_size + hop) % MODULUS
    for r in range(world_size):
        received = [h for h in range(hops) if (h + 1) % world_size == r]
        expected = np.full(shapes["log"], -1, np.int64)
        expected[received, :N] = messages[received, :N]
        np.testing.assert_array_equal(heap.host_view(r, offsets["log"], shapes["log"], np.int32), expected,
                                      err_msg=f"rank {r} log")
        assert heap.host_view(r, offsets["flag"], (1,), np.int32)[0] == laps


@triton.jit
def gather_kernel(context_ptr, buf_ptr, ready_ptr, ack_ptr, out_ptr, n, ROUNDS: tl.constexpr, W: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Producers fill their own buffer and raise a ready flag on rank 0; rank 0 pulls every
    buffer with `get` and acknowledges, and only then may a producer refill its buffer."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    for rnd in range(ROUNDS):
        if ctx.rank == 0:
            for src in range(1, W):
                _wait_at_least(ctx, ready_ptr + src, rnd + 1)
                ctx.get(buf_ptr + offs, out_ptr + (rnd * W + src) * BLOCK + offs, src, mask=mask)
            for dst in range(1, W):
                ctx.atomic_add(ack_ptr, 1, dst, sem="release")
        else:
            _wait_at_least(ctx, ack_ptr, rnd)  # rank 0 has read the previous round
            tl.store(buf_ptr + offs, ctx.rank * 100_000 + rnd * 1000 + offs, mask=mask)
            ctx.atomic_add(ready_ptr + ctx.rank, 1, 0, sem="release")


def gather_rank(state, session, offsets, rounds):
    heap = state.heap(session)
    w = state.world_size
    view = lambda name, shape: heap.host_view(state.rank, offsets[name], shape, np.int32)
    launch(gather_kernel, (1,), heap.context(state.rank), view("buf", (BLOCK,)), view("ready", (w,)),
           view("ack", (1,)), view("out", (rounds, w, BLOCK)), N, ROUNDS=rounds, W=w, BLOCK=BLOCK)


@pytest.mark.parametrize("world_size", [3, 4])
def test_many_producers_one_consumer_pulls_with_get(sim_heap, world_size):
    rounds = 8
    heap = sim_heap(world_size)
    shapes = {"buf": (BLOCK,), "ready": (world_size,), "ack": (1,), "out": (rounds, world_size, BLOCK)}
    offsets = {k: heap.allocate(int(np.prod(s)) * 4) for k, s in shapes.items()}
    for r in range(world_size):
        for name, value in [("buf", -1), ("ready", 0), ("ack", 0), ("out", -1)]:
            heap.host_view(r, offsets[name], shapes[name], np.int32)[:] = value

    get_world(world_size).run(gather_rank, heap.session, offsets, rounds, timeout_s=TIMEOUT_S)

    expected = np.full(shapes["out"], -1, np.int64)
    rnd, src, lane = np.meshgrid(np.arange(rounds), np.arange(1, world_size), np.arange(N), indexing="ij")
    expected[rnd, src, lane] = src * 100_000 + rnd * 1000 + lane
    np.testing.assert_array_equal(heap.host_view(0, offsets["out"], shapes["out"], np.int32), expected)
    np.testing.assert_array_equal(heap.host_view(0, offsets["ready"], (world_size,), np.int32),
                                  [0] + [rounds] * (world_size - 1))
    for r in range(1, world_size):
        assert heap.host_view(r, offsets["ack"], (1,), np.int32)[0] == rounds
        np.testing.assert_array_equal(heap.host_view(r, offsets["out"], shapes["out"], np.int32), -1)
