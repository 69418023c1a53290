"""The symmetric heap: one allocation per rank, all of them addressable from here."""

from __future__ import annotations

import abc
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from iris_core.errors import HeapExhaustedError
from iris_core.heap.allocator import ALIGNMENT, HeapAllocator, format_bytes
from iris_core.heap.context_layout import encode_context
from iris_core.heap.status import BOUND_OFFSET, RESERVED_BYTES, STATUS_OFFSET


class SymmetricHeap(abc.ABC):
    """World-wide view of the heaps as mapped in this process.

    A process owns the memory of its `local_ranks` (all ranks in single-process runs, one
    rank per process otherwise, none for a process that only attaches) and maps the other
    ranks' heaps. `heap_bases[r]` is rank
    r's heap as seen by this process; one allocator hands out offsets valid on every heap.

    Growth: every rank's heap is a range of `heap_size` bytes (its upper bound, reserved up
    front: the bases never change), of which the first `mapped_size` are memory. An
    allocation that does not fit maps more (`_map`, the heap type's own), on every rank at
    once, as collective as the allocation that asks for it: every process decides alike
    (their allocators made the same calls) and `agree` (the runtime's: a process barrier that
    shares each one's outcome) makes one rank's failure every rank's HeapExhaustedError.
    A live block never moves (its offset is its address on every rank). The device's heap guard
    refuses what lies past `mapped_size`: each heap holds that bound in its status line
    (`publish_bound`, at init and after each growth; iris_core.heap.status).
    """

    GROWTH_STEP = 64 << 20  # a growth maps at least this much more (and a multiple of it)

    def __init__(self, world_size: int, heap_size: int, local_ranks: Sequence[int], mapped_size: int | None = None):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        bad = [r for r in local_ranks if not 0 <= r < world_size]
        if bad:
            raise ValueError(f"local ranks {list(local_ranks)} invalid for world size {world_size}")
        self.world_size = world_size
        self.heap_size = heap_size  # the upper bound: every rank's reserved range
        self.mapped_size = min(mapped_size or heap_size, heap_size)
        self.local_ranks = tuple(local_ranks)
        self.allocator = HeapAllocator(self.mapped_size)
        self.allocator.allocate(RESERVED_BYTES)  # offset 0: the status line (iris_core.heap.status)
        self._requested: dict[int, int] = {}  # live allocations: offset -> bytes asked for
        self._owners: dict[int, str] = {0: "runtime"}  # live allocations: offset -> what holds it ("arrays", ...)
        self._names: dict[int, str] = {}  # live allocations that were given a name: offset -> it
        self._requested_lock = threading.Lock()
        self._grow_lock = threading.Lock()
        self.peak_used = self.allocator.used
        self.growths = 0
        # (failure or None) -> every process's failures; the runtime's shares them between processes
        self.agree = lambda failure: [failure] if failure else []
        # (offset, bytes) -> None, called at every allocation before it is returned (the simulator's race
        # detector: a new block has no history)
        self.on_allocate = None
        self.heap_bases: list[int] = []
        self._closed = False

    # -- memory ---------------------------------------------------------------
    def allocate(self, nbytes: int, zero: bool = False, owner: str = "runtime", name: str | None = None) -> int:
        """Reserves `nbytes` at one offset on every heap; returns the offset.

        Freed memory is reused as it is; with `zero=True` the block is zeroed on this
        process's heaps (flags and counters that kernels compare against need that; other
        processes zero their own heaps when they make the same allocation). Where the mapped
        memory has no room, the heap grows (see the class), up to `heap_size`.

        Args:
          nbytes: the block's size.
          zero: zero it on this process's heaps.
          owner: what holds it, as memory_stats() and HeapExhaustedError count it.
          name: what the simulator's race reports call it (a heap array's `name=`); None: its
            offset.

        Raises:
          HeapExhaustedError: it fits neither the mapped memory nor, grown, the upper bound
            (or a rank could not map more), with what holds the heap.
        """
        offset = None
        while offset is None:  # (another thread may take what a growth made room for: grow again)
            try:
                offset = self.allocator.allocate(nbytes)
            except HeapExhaustedError:
                pass  # (grown outside the handler: its error names the heap's holders, unchained)
            if offset is None:
                self._grow_for(nbytes)
        with self._requested_lock:
            self._requested[offset] = nbytes
            self._owners[offset] = owner
            if name is not None:
                self._names[offset] = name
            self.peak_used = max(self.peak_used, self.allocator.used)
            self._allocations_changed()
        if self.on_allocate is not None:
            self.on_allocate(offset, -(-max(nbytes, 1) // self.allocator.alignment) * self.allocator.alignment)
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

    @abc.abstractmethod
    def _store_word_local(self, rank: int, offset: int, value: int) -> None:
        """Writes the int64 `value` at `offset` of local rank's heap; returns when it is there."""

    def publish_bound(self) -> None:
        """Writes the guard's bound (`mapped_size`) into the status line of every heap this process
        owns; heap types call it at the end of init, `_grow_for` after each growth."""
        for rank in self.local_ranks:
            self._store_word_local(rank, BOUND_OFFSET, self.mapped_size)

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
            self._owners.pop(offset, None)
            self._names.pop(offset, None)
            self._allocations_changed()

    # -- growth ---------------------------------------------------------------
    def _grow_for(self, nbytes: int) -> None:
        """Maps enough more memory for a block of `nbytes` at the end of the range, on every
        rank; raises HeapExhaustedError (on every process alike) where it cannot."""
        with self._grow_lock:
            need = -(-max(nbytes, 1) // ALIGNMENT) * ALIGNMENT
            if self.allocator.largest_free_block >= need:
                return  # another thread grew it meanwhile
            old = self.mapped_size
            wanted = old + need - self.allocator.tail_free
            new = min(-(-wanted // self.GROWTH_STEP) * self.GROWTH_STEP, self.heap_size)
            if new < wanted:
                raise HeapExhaustedError(self.exhausted_message(nbytes, "it would pass the heap's upper bound"))
            # two rounds, each agreed on by every process before the next: map my ranks' new
            # bytes, then map (import) every peer's; a failure anywhere undoes both everywhere
            for step, undo in ((self._map, self._unmap), (self._map_peers, self._unmap_peers)):
                failure = None
                try:
                    step(old, new)
                except HeapExhaustedError as e:
                    failure = f"rank {', '.join(map(str, self.local_ranks)) or '-'}: {e}"
                failures = self.agree(failure)
                if failures:
                    if failure is None:
                        undo(old, new)
                    if step == self._map_peers:
                        self._unmap(old, new)
                    raise HeapExhaustedError(self.exhausted_message(
                        nbytes, f"growing the heap from {format_bytes(old)} to {format_bytes(new)} failed on "
                        f"{'; '.join(failures)}; nothing was changed"))
            self.allocator.grow(new)
            self.mapped_size = new
            self.growths += 1
            self.publish_bound()  # (every process mapped every rank's new bytes: kernels may reach them)

    def _map(self, old: int, new: int) -> None:
        """Makes bytes [old, new) of this process's ranks' ranges memory (the peers' follow in
        `_map_peers`); raises HeapExhaustedError where a rank has no memory for it, having
        mapped nothing. Heaps that cannot grow refuse."""
        raise HeapExhaustedError(f"{type(self).__name__} heaps do not grow (the whole heap is mapped at init)")

    def _unmap(self, old: int, new: int) -> None:  # noqa: B027  (heaps that map nothing undo nothing)
        """Undoes `_map(old, new)` (another rank failed to grow)."""

    def _map_peers(self, old: int, new: int) -> None:  # noqa: B027  (peers' ranges need nothing on most heaps)
        """After every process mapped its own ranks' bytes [old, new): makes the other processes'
        reachable here (GPU VMM heaps import each peer's new allocation); raises
        HeapExhaustedError where it cannot."""

    def _unmap_peers(self, old: int, new: int) -> None:  # noqa: B027
        """Undoes `_map_peers(old, new)`."""

    # -- statistics -----------------------------------------------------------
    def usage(self) -> dict[str, tuple[int, int]]:
        """Bytes in use and allocations per owner ("arrays", "workspaces", "runtime", ...)."""
        found: dict[str, list[int]] = {}
        with self._requested_lock:
            for offset, owner in self._owners.items():
                entry = found.setdefault(owner, [0, 0])
                entry[0] += self.allocator.size_of(offset)
                entry[1] += 1
        return {owner: (used, count) for owner, (used, count) in sorted(found.items())}

    def exhausted_message(self, nbytes: int, why: str) -> str:
        """HeapExhaustedError's message: what was asked, why it failed, what holds the heap."""
        held = ", ".join(f"{owner} {format_bytes(used)} ({count})" for owner, (used, count) in self.usage().items())
        return (f"symmetric heap exhausted: requested {format_bytes(nbytes)} ({nbytes} bytes): {why}. In use "
                f"{format_bytes(self.allocator.used)} of {format_bytes(self.mapped_size)} mapped (upper bound "
                f"{format_bytes(self.heap_size)}): {held or 'nothing'}; largest free block "
                f"{format_bytes(self.allocator.largest_free_block)}. Free arrays you no longer need, or raise the "
                "upper bound with init(heap_size=...) (environment: IRIS_HEAP_SIZE).")

    def allocations(self) -> list[tuple[int, int]]:
        """The live allocations as (offset, bytes requested), by offset."""
        with self._requested_lock:
            return sorted(self._requested.items())

    def allocation_names(self) -> dict[int, tuple[str, str]]:
        """The live allocations that were given a name: offset -> (owner, name)."""
        with self._requested_lock:
            return {offset: (self._owners[offset], name) for offset, name in self._names.items()}

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
        """(rank, offset) of an address inside the mapped part of one of the heaps, else None."""
        for rank, base in enumerate(self.heap_bases):
            if base <= address < base + self.mapped_size:
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
