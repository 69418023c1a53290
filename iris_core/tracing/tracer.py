"""`Tracer`: turns device tracing on and off for one symmetric heap, reads and exports events.

    tracer = Tracer(heap)
    tracer.enable(max_events=4096)
    ctx = tracer.context(rank)        # the context array, carrying the tracing words
    ...                               # kernels compiled with tracing=True record events
    tracer.export("trace.json")       # Chrome / Perfetto trace-event JSON, every rank

The trace area stays allocated after disable(): events recorded so far can still be read
and exported, and a kernel built while tracing was on (its context carries the words)
never writes into memory that was handed to something else. enable() with another
max_events moves to a new area; old areas return to the heap on close().
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Sequence

import numpy as np

from iris_core.errors import IrisError
from iris_core.tracing.buffers import DEFAULT_MAX_EVENTS, RankTrace, TraceBuffers
from iris_core.tracing.export import write_chrome_trace


class Tracer:
    """Device tracing of the ranks of one SymmetricHeap.

    Counters are cleared on this process's ranks (`heap.local_ranks`); events are read
    from any rank (every heap is mapped here).
    """

    def __init__(self, heap):
        self.heap = heap
        self.buffers: TraceBuffers | None = None
        self.enabled = False
        self._retired: list[TraceBuffers] = []

    # -- state ---------------------------------------------------------------------
    def enable(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        """Starts tracing with room for `max_events` events per rank (cleared)."""
        if self.buffers is None or self.buffers.max_events != max_events:
            buffers = TraceBuffers(self.heap, max_events)  # validates max_events first
            if self.buffers is not None:
                self._retired.append(self.buffers)
            self.buffers = buffers
        self.buffers.clear()
        self.enabled = True

    def disable(self) -> None:
        """Stops tracing for contexts built from now on; recorded events stay readable."""
        self.enabled = False

    def reset(self) -> None:
        """Forgets the recorded events (zeroes the counters of this process's ranks)."""
        self._require_buffers().reset()

    @property
    def max_events(self) -> int | None:
        return self.buffers.max_events if self.buffers is not None else None

    def words(self) -> tuple[int, ...]:
        """The tracing words of the context: () (all zero) while tracing is off."""
        return self.buffers.words if self.enabled else ()

    def context(self, rank: int) -> np.ndarray:
        """Rank's context array with the current tracing words."""
        return self.heap.context(rank, self.words())

    # -- results -------------------------------------------------------------------
    def read(self, ranks: Iterable[int] | None = None) -> list[RankTrace]:
        """Each rank's events (default: every rank); call after its kernels finished."""
        buffers = self._require_buffers()
        ranks = range(self.heap.world_size) if ranks is None else ranks
        return [buffers.read(r) for r in ranks]

    def export(self, path: str, merge: bool = True, ranks: Sequence[int] | None = None, **options) -> list[str]:
        """Writes Chrome/Perfetto trace-event JSON; returns the paths written.

        merge=True: one file at `path` with every rank (one process per rank);
        merge=False: one file per rank, `path` with `.rank<r>` before its extension.
        `options` go to `chrome_trace` (names, track, align). Warns when a rank dropped
        events (more than max_events).
        """
        traces = self.read(ranks)
        _warn_dropped(traces)
        if merge:
            write_chrome_trace(traces, path, **options)
            return [path]
        stem, ext = os.path.splitext(path)
        paths = []
        for trace in traces:
            paths.append(f"{stem}.rank{trace.rank}{ext or '.json'}")
            write_chrome_trace([trace], paths[-1], **options)
        return paths

    # -- lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Returns every trace area to the heap; tracing is off afterwards."""
        for buffers in [*self._retired, *([self.buffers] if self.buffers else [])]:
            buffers.free()
        self._retired.clear()
        self.buffers = None
        self.enabled = False

    def _require_buffers(self) -> TraceBuffers:
        if self.buffers is None:
            raise IrisError("tracing was never enabled: call tracing.enable(max_events=...) before "
                            "running the kernels to trace")
        return self.buffers

    def __repr__(self) -> str:
        state = f"enabled, max_events={self.max_events}" if self.enabled else "disabled"
        return f"Tracer({state}, world_size={self.heap.world_size})"


def _warn_dropped(traces: Sequence[RankTrace]) -> None:
    dropped = {t.rank: t.dropped for t in traces if t.dropped}
    if dropped:
        warnings.warn(f"trace buffers overflowed, events dropped per rank: {dropped} (capacity "
                      f"{traces[0].max_events}); enable tracing with a larger max_events", stacklevel=3)
