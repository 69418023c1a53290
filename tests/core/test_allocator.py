"""HeapAllocator: first fit, coalescing, alignment, exhaustion, thread safety."""

import random
import sys
import threading

import numpy as np
import pytest

from iris_core.errors import HeapExhaustedError, IrisError
from iris_core.heap.allocator import ALIGNMENT, HeapAllocator, format_bytes

UNIT = ALIGNMENT


def check_totals(allocator: HeapAllocator, used: int, largest: int) -> None:
    assert allocator.used == used
    assert allocator.free_bytes == allocator.size - used
    assert allocator.largest_free_block == largest


def test_fresh_heap_is_one_free_block():
    a = HeapAllocator(64 * UNIT)
    check_totals(a, used=0, largest=64 * UNIT)
    assert a.num_allocations == 0


@pytest.mark.parametrize("nbytes, rounded", [(0, UNIT), (1, UNIT), (UNIT - 1, UNIT), (UNIT, UNIT),
                                             (UNIT + 1, 2 * UNIT), (1000, 4 * UNIT), (4 * UNIT, 4 * UNIT)])
def test_sizes_round_up_to_the_alignment(nbytes, rounded):
    a = HeapAllocator(16 * UNIT)
    off = a.allocate(nbytes)
    assert off == 0
    assert a.size_of(off) == rounded
    check_totals(a, used=rounded, largest=16 * UNIT - rounded)
    second = a.allocate(1)
    assert second == rounded  # first fit: right after the first block


def test_every_offset_is_aligned():
    rng = random.Random(1)
    a = HeapAllocator(4096 * UNIT)
    live = []
    for _ in range(600):
        if live and rng.random() < 0.4:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            off = a.allocate(rng.choice([1, 3, 17, 255, 256, 257, 1000, 4096, 5000]))
            assert off % 256 == 0 and off % a.alignment == 0
            live.append(off)


def test_larger_alignment():
    a = HeapAllocator(64 * 1024, alignment=1024)
    offsets = [a.allocate(n) for n in (1, 1024, 1025, 10)]
    assert offsets == [0, 1024, 2048, 4096]
    assert all(a.size_of(o) % 1024 == 0 for o in offsets)


@pytest.mark.parametrize("size, alignment", [(1000, 256), (0, 256), (-256, 256), (4096, 128), (4096, 384)])
def test_invalid_construction(size, alignment):
    with pytest.raises(ValueError):
        HeapAllocator(size, alignment)


def test_negative_request_raises():
    with pytest.raises(ValueError, match="negative"):
        HeapAllocator(4 * UNIT).allocate(-1)


def test_allocations_do_not_overlap_and_are_first_fit():
    a = HeapAllocator(32 * UNIT)
    sizes = [1, 2 * UNIT, 300, UNIT, 5 * UNIT]
    offsets = [a.allocate(n) for n in sizes]
    assert offsets == [0, UNIT, 3 * UNIT, 5 * UNIT, 6 * UNIT]
    check_totals(a, used=11 * UNIT, largest=21 * UNIT)
    assert a.num_allocations == 5


def test_reuse_after_free():
    a = HeapAllocator(8 * UNIT)
    first = a.allocate(2 * UNIT)
    a.allocate(UNIT)
    a.free(first)
    check_totals(a, used=UNIT, largest=5 * UNIT)
    assert a.allocate(UNIT) == first  # the hole at the front comes first
    assert a.allocate(UNIT) == first + UNIT
    assert a.allocate(UNIT) == 3 * UNIT  # the hole is full: after the live block


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2), (1, 2, 0), (0, 2, 1), (2, 0, 1)])
def test_coalescing_in_every_order(order):
    """Three neighbours freed in any order merge into one block the size of their span."""
    a = HeapAllocator(6 * UNIT)
    left = a.allocate(UNIT)
    blocks = [a.allocate(n * UNIT) for n in (1, 2, 1)]
    right = a.allocate(UNIT)
    check_totals(a, used=6 * UNIT, largest=0)
    for i in order:
        a.free(blocks[i])
    check_totals(a, used=2 * UNIT, largest=4 * UNIT)
    span = a.allocate(4 * UNIT)  # fits only if the three blocks merged
    assert span == blocks[0] == left + UNIT
    assert right == span + 4 * UNIT
    with pytest.raises(HeapExhaustedError):
        a.allocate(1)


def test_free_merges_with_the_trailing_free_space():
    a = HeapAllocator(16 * UNIT)
    x = a.allocate(UNIT)
    y = a.allocate(3 * UNIT)
    a.free(y)
    check_totals(a, used=UNIT, largest=15 * UNIT)
    a.free(x)
    check_totals(a, used=0, largest=16 * UNIT)
    assert a.allocate(16 * UNIT) == 0


def test_fragmentation_then_reuse():
    a = HeapAllocator(16 * UNIT)
    offsets = [a.allocate(UNIT) for _ in range(16)]
    with pytest.raises(HeapExhaustedError):
        a.allocate(1)
    for off in offsets[::2]:
        a.free(off)
    # half the heap is free, but only in single units
    check_totals(a, used=8 * UNIT, largest=UNIT)
    with pytest.raises(HeapExhaustedError):
        a.allocate(2 * UNIT)
    assert a.allocate(UNIT) == 0  # a single unit fits in the first hole
    a.free(0)
    a.free(offsets[5])  # joins holes 4 and 6 into three units
    check_totals(a, used=7 * UNIT, largest=3 * UNIT)
    assert a.allocate(3 * UNIT) == 4 * UNIT
    for off in offsets[1::2]:
        if off != offsets[5]:
            a.free(off)
    a.free(4 * UNIT)
    check_totals(a, used=0, largest=16 * UNIT)


def test_exhaustion_message_names_request_and_heap_size():
    a = HeapAllocator(4 * UNIT)
    a.allocate(3 * UNIT)
    with pytest.raises(HeapExhaustedError) as info:
        a.allocate(1000)
    message = str(info.value)
    assert "1000 bytes" in message  # the request as asked
    assert format_bytes(4 * UNIT) in message  # the heap size
    assert "heap_size" in message  # how to enlarge it
    assert format_bytes(UNIT) in message  # largest free block
    assert isinstance(info.value, MemoryError) and isinstance(info.value, IrisError)
    # the failed request changed nothing
    check_totals(a, used=3 * UNIT, largest=UNIT)
    assert a.allocate(UNIT) == 3 * UNIT


def test_exhaustion_of_a_large_heap_formats_sizes():
    a = HeapAllocator(1 << 30)
    with pytest.raises(HeapExhaustedError, match=r"heap size 1\.00 GiB") as info:
        a.allocate((1 << 30) + 1)
    assert str((1 << 30) + 1) in str(info.value)


def test_double_free_raises():
    a = HeapAllocator(8 * UNIT)
    x = a.allocate(UNIT)
    a.allocate(UNIT)
    a.free(x)
    with pytest.raises(ValueError, match="not a live allocation"):
        a.free(x)
    check_totals(a, used=UNIT, largest=6 * UNIT)  # x's unit stayed a separate free block
    assert a.allocate(UNIT) == x


@pytest.mark.parametrize("offset", [UNIT // 2, UNIT, 7 * UNIT, -UNIT])
def test_freeing_an_unknown_offset_raises(offset):
    a = HeapAllocator(8 * UNIT)
    a.allocate(4 * UNIT)  # offset UNIT is inside this block, not its start
    with pytest.raises(ValueError):
        a.free(offset)
    check_totals(a, used=4 * UNIT, largest=4 * UNIT)


def test_matches_a_bitmap_reference_under_random_traffic():
    """First fit over maximal free runs: the allocator must pick what a bitmap scan picks."""
    rng = random.Random(7)
    units = 200
    a = HeapAllocator(units * UNIT)
    taken = np.zeros(units, bool)
    live = {}
    for _ in range(3000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            a.free(off)
            taken[off // UNIT: off // UNIT + live.pop(off)] = False
        else:
            nbytes = rng.randint(0, 12 * UNIT)
            need = max(1, -(-nbytes // UNIT))
            free_runs = np.flatnonzero(np.convolve(~taken, np.ones(need, int), "valid") == need)
            if len(free_runs) == 0:
                with pytest.raises(HeapExhaustedError):
                    a.allocate(nbytes)
                continue
            off = a.allocate(nbytes)
            assert off == free_runs[0] * UNIT
            taken[free_runs[0]: free_runs[0] + need] = True
            live[off] = need
        runs = np.diff(np.flatnonzero(np.diff(np.concatenate([[1], taken, [1]]).astype(int))))[::2]
        check_totals(a, used=int(taken.sum()) * UNIT, largest=int(runs.max(initial=0)) * UNIT)
        assert a.num_allocations == len(live)


def test_thread_safety():
    threads_n, iterations = 8, 2000
    units = 4096
    a = HeapAllocator(units * UNIT)
    owner = np.full(units, -1, np.int64)  # which thread holds each unit
    errors = []

    def work(tid):
        rng = random.Random(tid)
        live = []
        try:
            for _ in range(iterations):
                if live and (rng.random() < 0.5 or len(live) > 20):
                    off, n = live.pop(rng.randrange(len(live)))
                    assert (owner[off // UNIT: off // UNIT + n] == tid).all()
                    owner[off // UNIT: off // UNIT + n] = -1  # released before the allocator frees it
                    a.free(off)
                else:
                    n = rng.randint(1, 8)
                    off = a.allocate(n * UNIT - rng.randint(0, UNIT - 1))
                    assert off % UNIT == 0
                    assert (owner[off // UNIT: off // UNIT + n] == -1).all(), "handed out twice"
                    owner[off // UNIT: off // UNIT + n] = tid
                    live.append((off, n))
            for off, n in live:
                owner[off // UNIT: off // UNIT + n] = -1
                a.free(off)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: interleave inside allocate/free
    try:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not errors, errors[0]
    check_totals(a, used=0, largest=a.size)
    assert a.num_allocations == 0
    assert a.allocate(a.size) == 0


def test_grow_extends_the_free_block_at_the_end():
    a = HeapAllocator(4 * UNIT)
    first = a.allocate(2 * UNIT)
    assert a.tail_free == 2 * UNIT
    a.grow(8 * UNIT)  # the tail block grows: one free block of 6 units
    assert (a.size, a.tail_free, a.largest_free_block) == (8 * UNIT, 6 * UNIT, 6 * UNIT)
    assert a.allocate(6 * UNIT) == 2 * UNIT and a.tail_free == 0
    a.grow(10 * UNIT)  # the range ended in a live block: a new free block
    assert a.tail_free == 2 * UNIT and a.allocate(2 * UNIT) == 8 * UNIT
    a.free(first)
    assert a.allocate(2 * UNIT) == first  # live blocks never moved; freed ones reused
    with pytest.raises(ValueError):
        a.grow(9 * UNIT)  # never shrinks
    with pytest.raises(ValueError):
        a.grow(10 * UNIT + 1)  # whole alignment units
