"""The symmetric heap: one allocation per rank, all of them addressable from here."""

from __future__ import annotations

import abc
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from iris_core.heap.allocator import HeapAllocator, format_bytes
from iris_core.heap.context_layout import encode_context
from iris_core.heap.status import RESERVED_BYTES, STATUS_OFFSET


class SymmetricHeap(abc.ABC):
    """World-wide view of the heaps as mapped in this process.

    A process owns the memory of its `local_ranks` (all ranks in single-process runs, one
    rank per process otherwise, none for a process that only attaches) and maps the other
    ranks' heaps. `heap_bases[r]` is rank
    r's heap as seen by this process; one allocator hands out offsets valid on every heap.
    """

    def __init__(self, world_size: int, heap_size: int, local_ranks: Sequence[int]):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        bad = [r for r in local_ranks if not 0 <= r < world_size]
        if bad:
            raise ValueError(f"local ranks {list(local_ranks)} invalid for world size {world_size}")
        self.world_size = world_size
        self.heap_size = heap_size
        self.local_ranks = tuple(local_ranks)
        self.allocator = HeapAllocator(heap_size)
        self.allocator.allocate(RESERVED_BYTES)  # offset 0: the status line (iris_core.heap.status)
        self._requested: dict[int, int] = {}  # live allocations: offset -> bytes asked for
        self._requested_lock = threading.Lock()
        self.heap_bases: list[int] = []
        self._closed = False

    # -- memory ---------------------------------------------------------------
    def allocate(self, nbytes: int, zero: bool = False) -> int:
        """Reserves `nbytes` at one offset on every heap; returns the offset.

        Freed memory is reused as it is; with `zero=True` the block is zeroed on this
        process's heaps (flags and counters that kernels compare against need that; other
        processes zero their own heaps when they make the same allocation).
        """
        offset = self.allocator.allocate(nbytes)
        with self._requested_lock:
            self._requested[offset] = nbytes
            self._allocations_changed()
        if zero:
            try:
                self.zero(offset, nbytes)
            except BaseException:
                self.free(offset)
                raise
        return offset

    def zero(self, offset: int, nbytes: int) -> None:
        """Zeroes `nbytes` at `offset` on every heap this process owns; returns when done."""
        for rank in self.local_ranks:
            self._zero_local(rank, offset, nbytes)

    @abc.abstractmethod
    def _zero_local(self, rank: int, offset: int, nbytes: int) -> None: ...

    def read_words(self, rank: int, offset: int, count: int) -> np.ndarray:
        """`count` int64 words of rank's heap at `offset`, copied to the host (after the
        device work that wrote them finished); a peer's heap too where this process maps it."""
        raise NotImplementedError

    def take_errors(self) -> list[tuple[int, int]]:
        """(rank, status word) of every local rank whose kernels reported a refused access
        (iris_core.heap.status); the words are cleared."""
        found = []
        for rank in self.local_ranks:
            word = int(self.read_words(rank, STATUS_OFFSET, 1)[0])
            if word:
                self._zero_local(rank, STATUS_OFFSET, 8)
                found.append((rank, word))
        return found

    def free(self, offset: int) -> None:
        self.allocator.free(offset)
        with self._requested_lock:
            self._requested.pop(offset, None)
            self._allocations_changed()

    def allocations(self) -> list[tuple[int, int]]:
        """The live allocations as (offset, bytes requested), by offset."""
        with self._requested_lock:
            return sorted(self._requested.items())

    def _allocations_changed(self) -> None:  # noqa: B027  (a hook: most heaps need nothing here)
        """Called (under the lock) after every allocation and free; the simulator's heaps
        publish the table to their workers (checked mode)."""

    def free_when_collected(self, owner: object, offset: int) -> None:
        """Frees `offset` once `owner` is garbage-collected."""
        weakref.finalize(owner, _free_if_open, weakref.ref(self), offset)

    def address(self, rank: int, offset: int = 0) -> int:
        """Address of `offset` in rank's heap, as mapped in this process."""
        return self.heap_bases[rank] + offset

    def locate(self, address: int) -> tuple[int, int] | None:
        """(rank, offset) of an address inside one of the heaps, else None."""
        for rank, base in enumerate(self.heap_bases):
            if base <= address < base + self.heap_size:
                return rank, address - base
        return None

    # -- context --------------------------------------------------------------
    def context(self, rank: int, trace_words: Sequence[int] = ()) -> np.ndarray:
        """The int32-packed context array of `rank` (see context_layout)."""
        return encode_context(rank, self.heap_bases, trace_words, heap_size=self.heap_size,
                              fault_page=self.fault_page(rank))

    def fault_page(self, rank: int) -> int:
        """The device address of local rank's fault page (iris_core.faults); 0: none (the
        simulator raises faults in the kernel instead)."""
        return 0

    def peek_status(self, rank: int) -> int:
        """Local rank's status word, read without waiting for its kernels (heaps with a fault page)."""
        return 0

    def clear_status(self, rank: int) -> None:
        """Zeroes local rank's status word (after peek_status found it set)."""
        self._zero_local(rank, STATUS_OFFSET, 8)

    def fault_words(self, rank: int) -> np.ndarray | None:
        """Local rank's fault page as int64 words that the host reads and writes without the
        device (pinned host memory); None: no page."""
        return None

    # -- usage ----------------------------------------------------------------
    @property
    def used(self) -> int:
        return self.allocator.used

    @property
    def free_bytes(self) -> int:
        return self.allocator.free_bytes

    @property
    def largest_free_block(self) -> int:
        return self.allocator.largest_free_block

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(world_size={self.world_size}, "
            f"heap_size={format_bytes(self.heap_size)}, local_ranks={self.local_ranks}, "
            f"used={format_bytes(self.used)})"
        )

    # -- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Releases this process's mappings and owned memory (idempotent)."""
        if not self._closed:
            self._closed = True
            self._release()

    @abc.abstractmethod
    def _release(self) -> None: ...

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _free_if_open(heap_ref, offset: int) -> None:
    heap = heap_ref()
    if heap is not None and not heap.closed:
        heap.free(offset)
