"""The race detector on the tile-level collectives (iris_core.device.tile_collectives) across simulated
ranks: correct calls are not reported, and their results still match numpy."""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.sim import get_world, races
from iris_core.sim.interpreter import Pointer, pointer_to, run_kernel
from tests.core import tile_kernels as K
from tests.core.test_tile_collectives import BM, BN, M, _read, _run_op, _views, expected


def _launch_detected(state, session, offsets, op, N, npr, dst_shape):
    """Runs the tile collective on this rank with a race detector; returns the races it reported and
    how many heap accesses it checked."""
    heap = state.heap(session)
    W, me = state.world_size, state.rank
    views = _views(heap, me, offsets, N, dst_shape)
    detector = races.detector(session, W, heap.heap_size, heap.heap_bases, me)
    args = [pointer_to(heap.context(me)), *map(pointer_to, views), M, N, 1]
    found = run_kernel(K.tile_collective, (-(-M // BM), -(-N // BN)), args, dict(OP=op, W=W, BM=BM, BN=BN, NPR=npr),
                       detector=detector)
    return found, int(detector.vc[me])


@pytest.mark.parametrize("op", [K.ATOMIC, K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER, K.ALL_GATHER_ROWS,
                                K.GATHER, K.ALL_TO_ALL])
def test_tile_collectives_are_not_reported(sim_heap, op):
    W = 2
    world, heap = get_world(W), sim_heap(W, 1 << 16)
    offsets = [heap.allocate(4 * W * M * 16) for _ in range(3)] + [heap.allocate(256)]
    N, npr = (W * BN, BN) if op == K.ALL_TO_ALL else (7, BN)
    shapes = world.run(_run_op, heap.session, offsets, op, N)
    found, checked = zip(*world.run(_launch_detected, heap.session, offsets, op, N, npr, shapes[0]))
    assert found == ([],) * W, "\n".join(sum(found, []))
    assert min(checked) > 0  # it saw the heap accesses
    got = world.run(_read, heap.session, offsets, shapes[0])
    xs = [np.arange(M * N, dtype=np.float32).reshape(M, N) * (r + 1) + r / 10 for r in range(W)]
    for r in range(W):
        np.testing.assert_allclose(got[r], expected(op, xs, r, BM, BN, npr), rtol=1e-6)
    races.remove(heap.session)


def test_shadow_memory_too_large_is_a_clear_error():
    """Shadow memory is sized by the heaps' upper bound (sparse): a bound whose shadow does not fit the
    address space fails with what to lower, and leaves nothing mapped."""
    session = "p0-test-races-too-large"
    try:
        with pytest.raises(MemoryError, match="race detector: cannot map .* IRIS_HEAP_SIZE"):
            races.Shadow(session, 256, 1 << 44)
    finally:
        races.remove(session)


@triton.jit
def _gathered_flags(data_ptr, flags_ptr, out_ptr, BUG: tl.constexpr, BLOCK: tl.constexpr):
    """Programs 0..P-2 each store their element and release their own flag (gpu scope); the last
    program acquires all the flags in one tile atomic, reads every element and releases all the
    flags again in one atomic (a word each, released apart before). BUG: program 1 releases with
    scope="cta", which orders nothing between programs."""
    pid = tl.program_id(0)
    last = tl.num_programs(0) - 1
    offs = tl.arange(0, BLOCK)
    if pid < last:
        tl.store(data_ptr + pid, pid + 1.0)
        if BUG and pid == 1:
            tl.atomic_xchg(flags_ptr + pid, 1, sem="release", scope="cta")
        else:
            tl.atomic_xchg(flags_ptr + pid, 1, sem="release", scope="gpu")
    else:
        mask = offs < last
        tl.atomic_add(flags_ptr + offs, 0, mask=mask, sem="acquire", scope="gpu")
        tl.store(out_ptr + offs, tl.load(data_ptr + offs, mask=mask, other=0.0), mask=mask)
        tl.atomic_xchg(flags_ptr + offs, 2, mask=mask, sem="release", scope="gpu")


@pytest.mark.parametrize("bug", [False, True])
def test_programs_of_one_launch(bug):
    """One rank, the detector alone: programs of one launch ordered by gpu-scope release / acquire
    (many words released apart, acquired and released again in one atomic) are not reported; a flag
    at cta scope leaves its program's store unordered with the reader, which is reported."""
    programs, block = 16, 16
    heap = np.zeros(1024, np.float32)
    base = heap.ctypes.data
    session = f"p0-test-races-programs-{bug}"
    detector = races.Detector(session, 1, heap.nbytes, [base], 0)
    out = np.zeros(block, np.float32)
    args = [Pointer(base, np.float32), Pointer(base + 256, np.int32), Pointer(out.ctypes.data, np.float32)]
    try:
        found = run_kernel(_gathered_flags, (programs,), args, dict(BUG=bug, BLOCK=block), detector=detector)
    finally:
        races.remove(session)
    np.testing.assert_array_equal(out[:programs - 1], np.arange(1, programs))
    if not bug:
        assert found == [], "\n".join(found)
    else:
        assert len(found) == 1 and "store by rank 0, program 1: " in found[0], found
        assert "load by rank 0, program 15: " in found[0] and "its bytes" not in found[0], found[0]
        assert "bytes [4, 8) (heap offsets)" in found[0], found[0]
        assert "did read a flag the earlier one changed" in found[0] and "sem=acquire, scope=gpu" in found[0], found[0]


def test_forget_clears_a_new_block_in_every_plane():
    """An allocation's words start with no history (issue 56): every plane of every accessing rank, the
    byte planes and the mixed marks, over the block only (whole pages punched out, the ends zeroed)."""
    W, heap_size = 2, 1 << 20
    session = "p0-test-races-forget"
    try:
        shadow = races.Shadow(session, W, heap_size)
        bytes_ = shadow.byte_planes()
        shadow.planes[:] = 7
        bytes_[:] = 7
        shadow.mixed[:] = 1
        offset, nbytes = 256 * 3, 64 << 10  # not page-aligned: partial pages at both ends
        races.forget(session, W, heap_size, [1], offset, nbytes)
        words = slice(offset // 4, (offset + nbytes) // 4)
        assert not shadow.planes[:, :, 1, words].any() and not shadow.mixed[1, words].any()
        assert not bytes_[:, :, 1, offset:offset + nbytes].any()
        assert (shadow.planes[:, :, 1, words.start - 1] == 7).all() and (shadow.planes[:, :, 1, words.stop] == 7).all()
        assert (bytes_[:, :, 1, offset - 1] == 7).all() and (bytes_[:, :, 1, offset + nbytes] == 7).all()
        assert (shadow.planes[:, :, 0] == 7).all() and shadow.mixed[0].all()  # heap 0: not this owner's
    finally:
        races.remove(session)
        races._SHADOWS.pop(session, None)
