"""Tile-level Context collectives across simulated ranks, against numpy."""

import time

import numpy as np
import pytest

from iris_core import faults, flag_protocol
from iris_core.sim import get_world, launch
from tests.core import tile_kernels as K

M, BM, BN = 5, 4, 4  # odd rows: partial tiles


def _run_op(state, session, offsets, op, N):
    heap = state.heap(session)
    W, me = state.world_size, state.rank
    x_off, src_off, dst_off, lock_off = offsets
    x = heap.host_view(me, x_off, (M, N), np.float32)
    x[...] = np.arange(M * N, dtype=np.float32).reshape(M, N) * (me + 1) + me / 10
    dst_shape = (W * M, N) if op == K.ALL_GATHER_ROWS else (M, W * N) if op == K.ALL_GATHER_COLS else (M, N)
    dst = heap.host_view(me, dst_off, dst_shape, np.float32)
    dst[...] = 0.0 if op in (K.ATOMIC, K.SPINLOCK) else -7.0
    heap.host_view(me, lock_off, (64,), np.int32)[...] = 0
    return dst_shape


def _views(heap, me, offsets, N, dst_shape):
    """This rank's x, src, dst and locks, viewed on its heap at `offsets`."""
    x_off, src_off, dst_off, lock_off = offsets
    return [heap.host_view(me, o, s, d) for o, s, d in
            [(x_off, (M, N), np.float32), (src_off, (M, N), np.float32), (dst_off, dst_shape, np.float32),
             (lock_off, (64,), np.int32)]]


def _launch_op(state, session, offsets, op, N, npr, dst_shape):
    heap = state.heap(session)
    W, me = state.world_size, state.rank
    views = _views(heap, me, offsets, N, dst_shape)
    launch(K.tile_collective, (-(-M // BM), -(-N // BN)), heap.context(me), *views, M, N, 1,
           OP=op, W=W, BM=BM, BN=BN, NPR=npr)


def _launch_alone(state, session, offsets, N, timeout_s):
    """Rank 0 runs a one-shot all-reduce that no other rank joins; returns (error, seconds)."""
    if state.rank != 0:
        return None
    heap = state.heap(session)
    views = [heap.host_view(0, o, (M, N), np.float32) for o in offsets[:3]] + [heap.host_view(0, offsets[3], (64,), np.int32)]
    start = time.monotonic()
    try:
        launch(K.tile_collective, (-(-M // BM), -(-N // BN)), heap.context(0), *views, M, N, 1, OP=K.ONE_SHOT,
               W=state.world_size, BM=BM, BN=BN, NPR=BN, TIMEOUT_NS=int(timeout_s * 1e9))
    except Exception as e:  # noqa: BLE001 - what the test checks
        return f"{type(e).__name__}: {e}", time.monotonic() - start
    return None, time.monotonic() - start


def test_a_tile_collective_gives_up_after_its_own_timeout(sim_heap):
    """TIMEOUT_NS per call: a rank whose peers never publish gives up after it, naming the peer."""
    world, heap = get_world(2), sim_heap(2, 1 << 16)
    offsets = [heap.allocate(4 * 2 * M * 16) for _ in range(3)] + [heap.allocate(256)]
    world.run(_run_op, heap.session, offsets, K.ONE_SHOT, 7)
    error, seconds = world.run(_launch_alone, heap.session, offsets, 7, 0.5)[0]
    assert error is not None and "PeerTimeoutError" in error and "rank 1" in error, error
    # its own 0.5 s, not the kernel's default: the one bound that tells them apart, 120 times the timeout
    assert seconds < flag_protocol.DEFAULT_TIMEOUT_S, seconds


def _launch_catching(state, session, offsets, ops, Ns, timeout_s=60.0):  # must fail at once: never times out
    """Rank r runs ops[r] over an M x Ns[r] input (None: it does not call); returns its error."""
    op, N = ops[state.rank], Ns[state.rank]
    if op is None:
        return None
    heap = state.heap(session)
    views = [heap.host_view(state.rank, o, (M, N), np.float32) for o in offsets[:3]]
    views.append(heap.host_view(state.rank, offsets[3], (64,), np.int32))
    try:
        launch(K.tile_collective, (-(-M // BM), -(-N // BN)), heap.context(state.rank), *views, M, N, 1, OP=op,
               W=state.world_size, BM=BM, BN=BN, NPR=BN, TIMEOUT_NS=int(timeout_s * 1e9))
    except Exception as e:  # noqa: BLE001 - what the tests check
        return f"{type(e).__name__}: {e}"
    return None


@pytest.mark.parametrize("ops, Ns, called", [
    ((K.TWO_SHOT, K.ONE_SHOT), (7, 7), ("tile all_reduce_two_shot of float32", "tile all_reduce_one_shot of float32")),
    ((K.ONE_SHOT, K.ONE_SHOT), (7, 6), ("tile all_reduce_one_shot of float32 (blocks and shape #",) * 2),
    ((K.REDUCE_SCATTER, K.ONE_SHOT), (7, 7), ("tile reduce_scatter of float32", "tile all_reduce_one_shot")),
])
def test_tile_collectives_that_differ_fail_naming_both_calls(sim_heap, ops, Ns, called):
    """Each ready flag carries its call's signature: ranks whose calls differ (the collective, or
    the view's shape) get RankMismatchError naming both, and sum nothing that does not pair."""
    world, heap = get_world(2), sim_heap(2, 1 << 16)
    offsets = [heap.allocate(4 * 2 * M * 16) for _ in range(3)] + [heap.allocate(256)]
    for op, N in set(zip(ops, Ns)):
        world.run(_run_op, heap.session, offsets, op, N)
    # (the simulator runs a rank's programs one after another: each rank's first program, tile 0,
    # publishes and then waits, where on GPUs every program publishes before any waits)
    errors = world.run(_launch_catching, heap.session, offsets, ops, Ns)
    for r in range(2):
        assert errors[r] is not None and errors[r].startswith("RankMismatchError"), errors
        assert all(c in errors[r] for c in called), errors[r]
        assert f"rank {1 - r} made a different call than rank {r}" in errors[r], errors[r]


def _poison_peer_then_launch(state, session, offsets):
    """Rank 1's flags read as given up (it writes them as rank 0 starts); rank 0 runs a one-shot
    all-reduce alone."""
    heap = state.heap(session)
    if state.rank == 1:
        heap.host_view(1, offsets[3], (64,), np.int32)[...] = faults.TILE_POISON
    return _launch_catching(state, session, offsets, (K.ONE_SHOT, None), (7, 7))


def test_a_flag_of_a_peer_that_gave_up_fails_at_once_and_poisons_mine(sim_heap):
    world, heap = get_world(2), sim_heap(2, 1 << 16)
    offsets = [heap.allocate(4 * 2 * M * 16) for _ in range(3)] + [heap.allocate(256)]
    world.run(_run_op, heap.session, offsets, K.ONE_SHOT, 7)
    error = world.run(_poison_peer_then_launch, heap.session, offsets)[0]
    # PeerFailedError, not PeerTimeoutError: at once, not after the 60 s timeout
    assert error is not None and error.startswith("PeerFailedError") and "rank 1 gave up" in error, error
    mine = world.run(_flags, heap.session, offsets)[0]
    assert mine[0] == faults.TILE_POISON, mine  # a rank that reads my flag later fails at once too


def _flags(state, session, offsets):
    return state.heap(session).host_view(state.rank, offsets[3], (4,), np.int32).copy()


def _read(state, session, offsets, dst_shape):
    heap = state.heap(session)
    return heap.host_view(state.rank, offsets[2], dst_shape, np.float32).copy()


@pytest.mark.parametrize("W", [2, 3])
@pytest.mark.parametrize("op", [K.ATOMIC, K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER,
                                K.ALL_GATHER_ROWS, K.ALL_GATHER_COLS, K.GATHER, K.ALL_TO_ALL])
def test_tile_collective(sim_heap, W, op):
    world, heap = get_world(W), sim_heap(W, 1 << 16)
    offsets = [heap.allocate(4 * W * M * 16) for _ in range(3)] + [heap.allocate(256)]
    # all_to_all sends column block j (N_PER_RANK = BN wide) to rank j: N = W * BN
    N, npr = (W * BN, BN) if op == K.ALL_TO_ALL else (7, BN)
    shapes = world.run(_run_op, heap.session, offsets, op, N)
    world.run(_launch_op, heap.session, offsets, op, N, npr, shapes[0])
    got = world.run(_read, heap.session, offsets, shapes[0])
    xs = [np.arange(M * N, dtype=np.float32).reshape(M, N) * (r + 1) + r / 10 for r in range(W)]
    for r in range(W):
        np.testing.assert_allclose(got[r], expected(op, xs, r, BM, BN, npr), rtol=1e-6)


def expected(op, xs, r, BM, BN, npr):
    """Rank r's dst after `op` on the ranks' inputs `xs` (M x N each; -7: untouched)."""
    W, (M, N) = len(xs), xs[0].shape
    total = sum(xs)
    if op in (K.ATOMIC, K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT):
        return total
    if op == K.REDUCE_SCATTER:
        tiles_m, tiles_n = -(-M // BM), -(-N // BN)
        per_rank = -(-(tiles_m * tiles_n) // W)
        result = np.full((M, N), -7.0, np.float32)
        for t in range(tiles_m * tiles_n):
            if t // per_rank == r:
                pm, pn = divmod(t, tiles_n)
                sl = np.s_[pm * BM:(pm + 1) * BM, pn * BN:(pn + 1) * BN]
                result[sl] = total[sl]
        return result
    if op == K.ALL_GATHER_ROWS:
        return np.concatenate(xs, axis=0)
    if op == K.ALL_GATHER_COLS:
        return np.concatenate(xs, axis=1)
    if op == K.GATHER:
        return xs[(r + 1) % W]
    return np.concatenate([xs[j][:, r * npr:(r + 1) * npr] for j in range(W)], axis=1)
