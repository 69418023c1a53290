"""Host side of the context array that every kernel receives as its first argument.

Layout, in 64-bit words (see ../shared/reference/iris_device_api.md)::

    [rank, world_size, heap_size, heap_base_0 .. heap_base_{W-1},
     trace_enabled, max_events, trace_counter_ptr, op_index_counter_ptr,
     13 trace-buffer pointers, fault_page, own_base]

`world_size` and `heap_size` sit right before the bases, where the device's heap guard
finds them from the bases' pointer alone (iris_core.device.rma: heap_bases[-2], [-1]).

The tracing words are zero while tracing is off; when on, the counters and the 13
buffers are byte offsets into the rank's own heap, not addresses (iris_core.tracing.buffers).
`fault_page` is the address, as the device sees it, of the rank's fault page (iris_core.faults;
0: none, on the simulator and on bare heaps). `own_base` repeats the rank's own heap base at a word whose
index is known without the rank, so that a kernel reads it together with the rank, not after it: the heap
guard's bound lies behind it (iris_core.device.context.Context.initialize).

Words are stored as little-endian int32 pairs so that JAX without x64 can carry the
array; the kernel casts the pointer to int64 and reads whole words.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# Per-event trace buffers, in the order their pointers appear in the context.
TRACE_FIELDS = (
    "event_id", "pid", "pid_m", "pid_n", "cur_rank", "target_rank", "sm_id",
    "timestamp", "address", "duration", "op_index", "payload_size", "reserved",
)
HEADER_WORDS = 3
TRACE_WORDS = 4 + len(TRACE_FIELDS)


def context_words(world_size: int) -> int:
    """Number of 64-bit words in the context of a world of `world_size` ranks."""
    return own_base_offset(world_size) + 1


def own_base_offset(world_size: int) -> int:
    """Word index of `own_base` in the context (the last word)."""
    return HEADER_WORDS + world_size + TRACE_WORDS + 1


def trace_offset(world_size: int) -> int:
    """Word index of `trace_enabled` in the context."""
    return HEADER_WORDS + world_size


def encode_context(rank: int, heap_bases: Sequence[int], trace_words: Sequence[int] = (), *,
                   heap_size: int, fault_page: int = 0) -> np.ndarray:
    """Packs one rank's context into an int32 array of 2 * context_words(W) entries."""
    world_size = len(heap_bases)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} out of range for world size {world_size}")
    if heap_size <= 0:
        raise ValueError(f"heap_size must be positive, got {heap_size}")
    trace = list(trace_words) + [0] * (TRACE_WORDS - len(trace_words))
    if len(trace) != TRACE_WORDS:
        raise ValueError(f"expected at most {TRACE_WORDS} tracing words, got {len(trace_words)}")
    words = np.array([rank, world_size, heap_size, *heap_bases, *trace, fault_page, heap_bases[rank]],
                     dtype=np.uint64)
    return words.view(np.int32).copy()


def decode_context(array: np.ndarray) -> dict:
    """Inverse of encode_context (for tests and debugging)."""
    words = np.ascontiguousarray(array, dtype=np.int32).view(np.uint64)
    world_size = int(words[1])
    t = trace_offset(world_size)
    return {
        "rank": int(words[0]),
        "world_size": world_size,
        "heap_size": int(words[2]),
        "heap_bases": [int(w) for w in words[HEADER_WORDS:t]],
        "trace": [int(w) for w in words[t:t + TRACE_WORDS]],
        "fault_page": int(words[t + TRACE_WORDS]),
        "own_base": int(words[own_base_offset(world_size)]),
    }
