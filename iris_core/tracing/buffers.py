"""Trace buffers on the symmetric heap, and reading them back.

One allocation at the same offset on every rank's heap (the trace area)::

    [counter, op-index counter]  one 128-byte line each
    13 buffers of max_events int64, in the order of context_layout.TRACE_FIELDS

Each rank's kernels record into the area on their own heap. The context's tracing words
hold `[1, max_events, offset of the counter, offset of the op-index counter, offsets of
the 13 buffers]`: heap offsets, not addresses, so the same words are valid in every
process (the simulator's workers map the heaps at other addresses than the host) and the
device adds its own heap base (see iris_core.device.tracing).

Any process can read every rank's area: simulated heaps are shared memory, and GPU heaps
are device memory reachable from here (peers' mapped); the heap copies it (read_words).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from iris_core.errors import HeapExhaustedError
from iris_core.heap.context_layout import TRACE_FIELDS

LINE = 128
HEADER_BYTES = 2 * LINE
EVENT_FIELDS = tuple(f for f in TRACE_FIELDS if f != "reserved")  # the fields kernels record
EVENT_DTYPE = np.dtype([(f, np.int64) for f in EVENT_FIELDS])
DEFAULT_MAX_EVENTS = 1 << 14


@dataclass
class RankTrace:
    """One rank's events as read from its heap.

    Attributes:
      rank: the rank that recorded them.
      events: structured array (EVENT_DTYPE) of the recorded events, in slot order.
      attempted: events the rank tried to record (the device counter).
      max_events: capacity of the buffers.
    """

    rank: int
    events: np.ndarray
    attempted: int
    max_events: int

    @property
    def dropped(self) -> int:
        """Events beyond max_events: counted, not written."""
        return max(0, self.attempted - self.max_events)

    def __len__(self) -> int:
        return len(self.events)


class TraceBuffers:
    """The trace area of `max_events` events on every heap of `heap`."""

    def __init__(self, heap, max_events: int = DEFAULT_MAX_EVENTS):
        if isinstance(max_events, bool) or not isinstance(max_events, (int, np.integer)) or max_events < 1:
            raise ValueError(f"max_events must be a positive integer, got {max_events!r}")
        self.heap = heap
        self.max_events = int(max_events)
        self.nbytes = HEADER_BYTES + len(TRACE_FIELDS) * self.max_events * 8
        try:
            self.offset = heap.allocate(self.nbytes)
        except HeapExhaustedError as e:
            raise HeapExhaustedError(
                f"tracing {self.max_events} events needs {self.nbytes} bytes on every heap: {e}. "
                "Pass a smaller max_events or a larger heap") from e
        self.freed = False

    def field_offset(self, field: str) -> int:
        return self.offset + HEADER_BYTES + TRACE_FIELDS.index(field) * self.max_events * 8

    @property
    def words(self) -> tuple[int, ...]:
        """The context's tracing words (see the module docstring)."""
        return (1, self.max_events, self.offset, self.offset + LINE,
                *(self.field_offset(f) for f in TRACE_FIELDS))

    def clear(self) -> None:
        """Zeroes the counters and the buffers of this process's ranks."""
        self.heap.zero(self.offset, self.nbytes)

    def reset(self) -> None:
        """Zeroes the counters of this process's ranks: their next events go to slot 0."""
        self.heap.zero(self.offset, HEADER_BYTES)

    def read(self, rank: int) -> RankTrace:
        """Rank's recorded events and counter (call once its kernels finished)."""
        attempted = int(_read(self.heap, rank, self.offset, 1)[0])
        count = min(attempted, self.max_events)
        events = np.zeros(count, EVENT_DTYPE)
        for field in EVENT_FIELDS:
            events[field] = _read(self.heap, rank, self.field_offset(field), count)
        return RankTrace(rank, events, attempted, self.max_events)

    def free(self) -> None:
        if not self.freed and not self.heap.closed:
            self.heap.free(self.offset)
        self.freed = True


def _read(heap, rank: int, offset: int, count: int) -> np.ndarray:
    """`count` words of rank's heap at `offset` (the heap copies them: shared memory or device memory)."""
    return heap.read_words(rank, offset, count) if count else np.zeros(0, np.int64)
