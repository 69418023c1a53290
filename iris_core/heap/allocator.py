"""First-fit allocator with coalescing over one offset range (the symmetric heap).

Offsets are shared by every rank's heap: an allocation made here is valid on all of
them, which is what lets a kernel reach a peer's copy by pointer translation.
"""

from __future__ import annotations

import bisect
import threading

from iris_core.errors import HeapExhaustedError

ALIGNMENT = 256


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def format_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError


class HeapAllocator:
    """Thread-safe first-fit allocator; freed blocks merge with free neighbours.

    Args:
      size: bytes managed, starting at offset 0.
      alignment: every offset and size is a multiple of this (at least 256).
    """

    def __init__(self, size: int, alignment: int = ALIGNMENT):
        if alignment < ALIGNMENT or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two >= {ALIGNMENT}, got {alignment}")
        if size <= 0 or size % alignment:
            raise ValueError(f"heap size must be a positive multiple of {alignment}, got {size}")
        self.size = size
        self.alignment = alignment
        self._lock = threading.Lock()
        self._free_offsets = [0]  # sorted starts of free blocks
        self._free_sizes = {0: size}
        self._used = {}  # offset -> size of live allocations

    def allocate(self, nbytes: int) -> int:
        """Returns the offset of a new block of at least `nbytes` (min one alignment unit)."""
        if nbytes < 0:
            raise ValueError(f"cannot allocate a negative number of bytes ({nbytes})")
        need = _round_up(max(nbytes, 1), self.alignment)
        with self._lock:
            for i, start in enumerate(self._free_offsets):
                block = self._free_sizes[start]
                if block >= need:
                    del self._free_sizes[start]
                    if block == need:
                        del self._free_offsets[i]
                    else:
                        self._free_offsets[i] = start + need
                        self._free_sizes[start + need] = block - need
                    self._used[start] = need
                    return start
            largest = max(self._free_sizes.values(), default=0)
            used = self.size - sum(self._free_sizes.values())
        raise HeapExhaustedError(
            f"symmetric heap exhausted: requested {format_bytes(need)} ({nbytes} bytes), "
            f"heap size {format_bytes(self.size)}, in use {format_bytes(used)}, largest free "
            f"block {format_bytes(largest)}. Free arrays you no longer need, or enlarge the "
            "heap with init(heap_size=...) (environment: IRIS_HEAP_SIZE)."
        )

    def grow(self, size: int) -> None:
        """Extends the managed range to `size` bytes (a multiple of the alignment); the new
        bytes join the free block that ends where the range did. Live blocks never move."""
        if size % self.alignment or size < self.size:
            raise ValueError(f"cannot grow a heap of {self.size} bytes to {size}")
        with self._lock:
            tail = self._tail_free_start()
            if tail is None:
                self._free_offsets.append(self.size)
                self._free_sizes[self.size] = size - self.size
            else:
                self._free_sizes[tail] += size - self.size
            self.size = size

    def _tail_free_start(self) -> int | None:
        """The start of the free block that ends the range, if one does (under the lock)."""
        if self._free_offsets:
            last = self._free_offsets[-1]
            if last + self._free_sizes[last] == self.size:
                return last
        return None

    @property
    def tail_free(self) -> int:
        """Bytes of the free block that ends the range (0: none): what growth extends."""
        with self._lock:
            tail = self._tail_free_start()
            return 0 if tail is None else self._free_sizes[tail]

    def free(self, offset: int) -> None:
        """Returns a block to the heap, merging it with adjacent free blocks."""
        with self._lock:
            size = self._used.pop(offset, None)
            if size is None:
                raise ValueError(f"offset {offset} is not a live allocation of this heap")
            i = bisect.bisect_left(self._free_offsets, offset)
            # merge with the next free block
            if i < len(self._free_offsets) and self._free_offsets[i] == offset + size:
                size += self._free_sizes.pop(self._free_offsets[i])
                del self._free_offsets[i]
            # merge with the previous free block
            if i > 0:
                prev = self._free_offsets[i - 1]
                if prev + self._free_sizes[prev] == offset:
                    self._free_sizes[prev] += size
                    return
            self._free_offsets.insert(i, offset)
            self._free_sizes[offset] = size

    def size_of(self, offset: int) -> int:
        with self._lock:
            return self._used[offset]

    @property
    def used(self) -> int:
        with self._lock:
            return sum(self._used.values())

    @property
    def free_bytes(self) -> int:
        return self.size - self.used

    @property
    def largest_free_block(self) -> int:
        with self._lock:
            return max(self._free_sizes.values(), default=0)

    @property
    def num_allocations(self) -> int:
        with self._lock:
            return len(self._used)
