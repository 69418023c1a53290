"""Context array: host encoding round trip, and the kernel's decoding of the same words."""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.device import Context
from iris_core.heap.context_layout import (
    HEADER_WORDS,
    TRACE_FIELDS,
    TRACE_WORDS,
    context_words,
    decode_context,
    encode_context,
    own_base_offset,
    trace_offset,
)
from iris_core.sim import get_world, launch

MAX_WORLD = 8
HEAP_SIZE = 1 << 30


def big_bases(world_size: int) -> list[int]:
    """Bases that use all 64 bits, including the top one, and distinct low words."""
    return [0xFFFF_8000_0000_0000 + r * 0x0000_0123_4567_8000 + r * 0x1_0000 - 0x100 * r * r
            for r in range(world_size)]


@pytest.mark.parametrize("world_size", range(1, MAX_WORLD + 1))
def test_encode_decode_round_trip(world_size):
    bases = big_bases(world_size)
    assert max(bases) >= 1 << 63
    for rank in range(world_size):
        trace = [1, 1000, 0xFFFF_FFFF_FFFF_FFF0, 3 << 40][: rank % (TRACE_WORDS + 1)]
        page = 0 if rank % 2 else 0x7F00_0000_1000 + rank
        array = encode_context(rank, bases, trace, heap_size=HEAP_SIZE, fault_page=page)
        assert array.dtype == np.int32
        assert array.shape == (2 * context_words(world_size),)
        decoded = decode_context(array)
        assert decoded == {
            "rank": rank,
            "world_size": world_size,
            "heap_size": HEAP_SIZE,
            "heap_bases": bases,
            "trace": trace + [0] * (TRACE_WORDS - len(trace)),
            "fault_page": page,
            "own_base": bases[rank],
        }


@pytest.mark.parametrize("world_size", [1, 3, 8])
def test_word_layout(world_size):
    bases = big_bases(world_size)
    array = encode_context(world_size - 1, bases, [7, 9], heap_size=HEAP_SIZE, fault_page=0xABC000)
    assert context_words(world_size) == HEADER_WORDS + world_size + 4 + len(TRACE_FIELDS) + 2
    assert trace_offset(world_size) == 3 + world_size
    # little-endian int32 pairs: low word first
    low, high = array[0::2].view(np.uint32), array[1::2].view(np.uint32)
    words = [int(lo) | int(hi) << 32 for lo, hi in zip(low, high, strict=True)]
    assert words[:3] == [world_size - 1, world_size, HEAP_SIZE]  # the guard reads these before the bases
    assert words[3:3 + world_size] == bases
    assert words[trace_offset(world_size):] == [7, 9] + [0] * (TRACE_WORDS - 2) + [0xABC000, bases[-1]]
    assert own_base_offset(world_size) == context_words(world_size) - 1  # the own base last, after the fault page


def test_decode_accepts_a_copy_in_another_layout():
    array = encode_context(2, big_bases(4), heap_size=HEAP_SIZE)
    as_list = [int(v) for v in array]  # e.g. a round trip through JSON or a jax array
    assert decode_context(np.array(as_list, dtype=np.int64)) == decode_context(array)


@pytest.mark.parametrize("rank, bases, trace, heap_size", [
    (-1, [0, 1], (), HEAP_SIZE),
    (2, [0, 1], (), HEAP_SIZE),
    (0, [], (), HEAP_SIZE),
    (0, [0], [0] * (TRACE_WORDS + 1), HEAP_SIZE),
    (0, [0], (), 0),
])
def test_encode_rejects_bad_arguments(rank, bases, trace, heap_size):
    with pytest.raises(ValueError):
        encode_context(rank, bases, trace, heap_size=heap_size)


HEADER = tl.constexpr(HEADER_WORDS)


@triton.jit
def decode_kernel(context_ptr, out_ptr, W: tl.constexpr, NUM_TRACE: tl.constexpr, REAL: tl.constexpr):
    """Writes [rank, world_size, heap_size, heap_bases..., tracing words...] as the kernel sees them:
    through Context.initialize for a real context; a synthetic one's bases point nowhere, so there
    the words are decoded as initialize decodes them, without its read of the guard's bound through
    the caller's heap base."""
    if REAL:
        ctx = Context.initialize(context_ptr, W)
        rank, heap_bases, trace = ctx.rank, ctx.heap_bases, ctx.tracing.words
    else:
        words = context_ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
        rank, heap_bases, trace = tl.load(words).to(tl.int32), words + HEADER, words + HEADER + W
    tl.store(out_ptr, rank.to(tl.int64))
    tl.store(out_ptr + 1, tl.full((), W, tl.int64))
    tl.store(out_ptr + 2, tl.load(heap_bases - 1).to(tl.int64, bitcast=True))
    for r in tl.static_range(W):
        tl.store(out_ptr + 3 + r, tl.load(heap_bases + r).to(tl.int64, bitcast=True))
    offs = tl.arange(0, NUM_TRACE)
    tl.store(out_ptr + 3 + W + offs, tl.load(trace + offs).to(tl.int64, bitcast=True))


def trace_pow2() -> int:
    return 1 << (TRACE_WORDS - 1).bit_length()


def decode_rank(state, session, synthetic_world, synthetic_trace):
    """Decodes this rank's real context, then a synthetic one with 64-bit-wide bases."""
    heap = state.heap(session)
    results = []
    for rank, bases, trace, real in [(state.rank, heap.heap_bases, [5, 6], True),
                                     (state.rank % synthetic_world, big_bases(synthetic_world), synthetic_trace, False)]:
        context = encode_context(rank, bases, trace, heap_size=heap.heap_size)
        world = len(bases)
        # room for the full (padded) arange over the tracing words; poisoned
        out = np.full(3 + world + trace_pow2(), -77, np.int64)
        padded = np.concatenate([context, np.zeros(2 * (trace_pow2() - TRACE_WORDS), np.int32)])
        launch(decode_kernel, (1,), padded, out, W=world, NUM_TRACE=trace_pow2(), REAL=real)
        results.append((context, out[:3 + world + TRACE_WORDS].copy(), list(heap.heap_bases)))
    return results


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_kernel_decodes_what_the_host_encoded(sim_heap, world_size):
    heap = sim_heap(world_size, 1 << 16)
    synthetic_trace = [1, 64, 0xDEAD_BEEF_0000, 0xFFFF_FFFF_FFFF_FFFF, 42]
    results = get_world(world_size).run(decode_rank, heap.session, MAX_WORLD, synthetic_trace)
    for rank, per_rank in enumerate(results):
        for context, seen, _ in per_rank:
            host = decode_context(context)
            expected = [host["rank"], host["world_size"], host["heap_size"], *host["heap_bases"], *host["trace"]]
            assert seen.view(np.uint64).tolist() == expected, f"rank {rank}"
        real = decode_context(per_rank[0][0])
        assert real["rank"] == rank and real["world_size"] == world_size
        assert real["heap_bases"] == per_rank[0][2]  # the worker's own mapping of every heap
        assert len(set(real["heap_bases"])) == world_size
        assert real["trace"][:2] == [5, 6]
