"""Simulator backend: each rank's heap is a file in shared memory, mapped by every process.

Segments are named `iris-<session>-r<rank>` under /dev/shm (or the temp directory where
there is none). The owner unlinks its segment on close, once every peer has mapped it
(ranks announce that in the store; a mapping outlives the unlink); `remove_session_segments`
lets a launcher clean up after ranks that crashed. Sessions made by `new_session` start with
the creating process's id, so `remove_stale_segments` can free what a killed run left.
"""

from __future__ import annotations

import glob
import itertools
import json
import mmap
import os
import tempfile
import time
import uuid
import warnings
import weakref
from collections.abc import Sequence

import numpy as np

from iris_core.errors import HeapExhaustedError, PeerTimeoutError
from iris_core.heap.allocator import format_bytes
from iris_core.heap.rendezvous import KeyValueStore
from iris_core.heap.symmetric import SymmetricHeap

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def segment_path(session: str, rank: int) -> str:
    return os.path.join(SHM_DIR, f"iris-{session}-r{rank}")


def allocations_path(session: str) -> str:
    """The session's table of live allocations (checked mode; named so that the segment
    clean-ups below remove it too)."""
    return os.path.join(SHM_DIR, f"iris-{session}-r-allocations")


def names_path(session: str) -> str:
    """The session's names of its named allocations (the race detector's reports)."""
    return os.path.join(SHM_DIR, f"iris-{session}-r-names")


TABLE_ENTRIES = 1 << 15  # (offset, bytes) pairs the allocation table holds; beyond: unchecked
_TABLE_BYTES = 16 + 16 * TABLE_ENTRIES
_OPEN: weakref.WeakSet = weakref.WeakSet()  # the heaps mapped in this process
# heaps made so far per (session, local ranks): the owners of one run make theirs in the same
# order, so the count keys each heap's rendezvous (a re-made heap never reads its predecessor's)
_GENERATIONS: dict[tuple, itertools.count] = {}


def open_heaps() -> list[SharedMemoryHeap]:
    """The heaps this process has open."""
    return [heap for heap in list(_OPEN) if not heap.closed]


def heap_at(address: int) -> SharedMemoryHeap | None:
    """The open heap of this process that has a rank's heap base at `address`."""
    for heap in list(_OPEN):
        if not heap.closed and address in heap.heap_bases:
            return heap
    return None


def new_session(tag: str = "") -> str:
    """A fresh session name that records this process as its creator."""
    return f"p{os.getpid()}-{tag + '-' if tag else ''}{uuid.uuid4().hex[:8]}"


def remove_stale_segments() -> list[str]:
    """Unlinks the shared-memory files whose creating process is gone (a run that was killed
    before it could clean up); returns the paths removed.

    The creator's pid is in the name: `iris-p<pid>-...` for sessions of `new_session` (a
    launched rank's segments carry the launcher's, and ranks die with their launcher),
    `iris-staging-<pid>-...` for iris_jax's staging areas.
    """
    def stale(path):
        name = os.path.basename(path)
        creator = name.removeprefix("iris-staging-" if name.startswith("iris-staging-") else "iris-p")
        creator = creator.split("-", 1)[0]
        return creator.isdigit() and not _alive(int(creator))

    paths = glob.glob(os.path.join(SHM_DIR, "iris-p*-r*")) + glob.glob(os.path.join(SHM_DIR, "iris-staging-*"))
    return _unlink([p for p in paths if stale(p)])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


def remove_session_segments(session: str) -> list[str]:
    """Unlinks every segment of `session` and of its worlds of survivors (`session`-NAME); returns
    the paths removed."""
    return _unlink(glob.glob(os.path.join(SHM_DIR, f"iris-{session}-r*"))
                   + glob.glob(os.path.join(SHM_DIR, f"iris-{session}-iris-jax-*-r*")))


def _unlink(paths) -> list[str]:
    """Unlinks `paths`; returns those that were still there."""
    removed = []
    for path in paths:
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


class SharedMemoryHeap(SymmetricHeap):
    """Heaps in named shared host memory (the CPU simulator's backend).

    Each segment is a sparse file of `heap_size` bytes (the upper bound), mapped whole by every
    process: the host gives it memory only where it is written, so growing (`_map`) allocates
    nothing here; it moves the allocator's end, collectively as on GPUs, and fails where a
    rank's `device_memory` would be passed.

    Args:
      world_size, heap_size: as for every SymmetricHeap.
      mapped_size: the bytes the allocator starts with (None: `heap_size`); it grows from
        there.
      device_memory: rank -> bytes its simulated device has: growth past it fails on that rank
        (as a GPU out of memory would); ranks not named have no limit.
      local_ranks: ranks whose segment this process creates and owns (may be empty for
        a process that only attaches, such as a simulator worker).
      session: names the segments; every process of one run passes the same value.
      store: where owners announce that a segment is ready and, once they mapped every
        peer's, that they attached; an owner unlinks its segment only after every other
        owner attached (close waits for it, up to `timeout_s`).
      timeout_s: how long to wait for a peer, at the rendezvous and on close.
    """

    def __init__(self, world_size: int, heap_size: int, local_ranks: Sequence[int],
                 session: str, store: KeyValueStore | None = None, timeout_s: float = 120.0,
                 mapped_size: int | None = None, device_memory: dict[int, int] | None = None):
        self.session = session
        self._store, self._timeout_s = store, timeout_s
        self._maps: dict[int, mmap.mmap] = {}
        self._arrays: dict[int, np.ndarray] = {}
        self.device_memory = dict(device_memory or {})
        super().__init__(world_size, heap_size, local_ranks, mapped_size)
        generation = next(_GENERATIONS.setdefault((session, self.local_ranks), itertools.count()))
        self._keys = f"iris/{session}/{generation}"
        try:
            for rank in self.local_ranks:
                path = segment_path(session, rank)
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                try:
                    os.ftruncate(fd, heap_size)
                    self._maps[rank] = mmap.mmap(fd, heap_size)
                finally:
                    os.close(fd)
                if store is not None:
                    store.set(f"{self._keys}/heap/{rank}", path.encode())
            for rank in range(world_size):
                if rank not in self._maps:
                    path = segment_path(session, rank)
                    if store is not None:
                        path = self._peer_segment(rank)
                    fd = os.open(path, os.O_RDWR)
                    try:
                        self._maps[rank] = mmap.mmap(fd, heap_size)
                    finally:
                        os.close(fd)
            for rank in range(world_size):
                self._arrays[rank] = np.frombuffer(self._maps[rank], dtype=np.uint8)
            self.heap_bases = [int(self._arrays[r].ctypes.data) for r in range(world_size)]
            self._table = None  # the allocation table: written by rank 0's owner, read by the others
            self._table_cache = (-1, None, None)
            self._published_names: dict[int, str] = {}
            if 0 in self.local_ranks:
                self._table = _map_table(allocations_path(session), create=True)
                self._allocations_changed()
            self.publish_bound()
            _OPEN.add(self)
        except BaseException:
            self._release()
            raise
        if store is not None:
            for rank in self.local_ranks:
                store.set(f"{self._keys}/attached/{rank}", b"1")

    def _peer_segment(self, rank: int) -> str:
        """The path that `rank`'s owner announced for its segment (the rendezvous at init)."""
        try:
            return self._store.get(f"{self._keys}/heap/{rank}", self._timeout_s).decode()
        except PeerTimeoutError as e:
            me = ", ".join(map(str, self.local_ranks)) or "an attaching process"
            raise PeerTimeoutError(
                f"iris heap {self.session} (init): rank {me} waited {self._timeout_s:g} s for rank {rank}'s "
                f"heap: {e}") from None

    def close(self) -> None:
        """Waits until every peer mapped this process's segments, then releases (idempotent)."""
        if not self.closed and self._store is not None and self.local_ranks:
            self._wait_for_peers_to_attach()
        super().close()

    def _wait_for_peers_to_attach(self) -> None:
        deadline = time.monotonic() + self._timeout_s
        for rank in range(self.world_size):
            if rank in self.local_ranks:
                continue
            try:
                self._store.get(f"{self._keys}/attached/{rank}", max(deadline - time.monotonic(), 0.0))
            except PeerTimeoutError:
                warnings.warn(
                    f"iris heap {self.session}: rank {rank} did not map this process's heap within "
                    f"{self._timeout_s:g} s (it hangs or died while initializing); removing the heap "
                    "anyway, so that rank fails if it still tries", RuntimeWarning, stacklevel=3)
                return

    def _map(self, old: int, new: int) -> None:
        short = [r for r in self.local_ranks if new > self.device_memory.get(r, new)]
        if short:
            raise HeapExhaustedError(", ".join(
                f"rank {r}'s simulated device has {format_bytes(self.device_memory[r])}" for r in short))

    def host_view(self, rank: int, offset: int, shape, dtype) -> np.ndarray:
        """A numpy view of rank's heap at `offset` (shared: writes are seen by all ranks)."""
        dtype = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64))
        flat = self._arrays[rank][offset:offset + count * dtype.itemsize].view(dtype)
        return flat.reshape(shape)

    def _zero_local(self, rank: int, offset: int, nbytes: int) -> None:
        self._arrays[rank][offset:offset + nbytes] = 0

    def _store_word_local(self, rank: int, offset: int, value: int) -> None:
        self._arrays[rank][offset:offset + 8].view(np.int64)[0] = value

    def read_words(self, rank: int, offset: int, count: int) -> np.ndarray:
        return self.host_view(rank, offset, (count,), np.int64).copy()

    # -- the allocation table (iris_core.sim.checks) ------------------------------
    def _allocations_changed(self) -> None:
        table = getattr(self, "_table", None)
        if table is None:
            return
        live = sorted(self._requested.items())
        table[0] += 1  # odd: being written (a seqlock; readers retry)
        if len(live) > TABLE_ENTRIES:
            table[1] = -1
        else:
            table[2:2 + 2 * len(live)] = np.asarray(live, np.int64).reshape(-1)
            table[1] = len(live)
        table[0] += 1
        if self._names != self._published_names:  # unnamed allocations write nothing here
            self._published_names = dict(self._names)
            named = {str(offset): [self._owners[offset], name] for offset, name in self._names.items()}
            temporary = names_path(self.session) + f".{os.getpid()}"
            with open(temporary, "w") as f:
                json.dump(named, f)
            os.replace(temporary, names_path(self.session))  # a reader sees the old file or the new

    def allocation_names(self) -> dict[int, tuple[str, str]]:
        """The live allocations that were given a name: offset -> (owner, name). A process that
        allocates reads its own; the simulator's workers read what rank 0's owner publishes."""
        if self.local_ranks:
            return super().allocation_names()
        try:
            with open(names_path(self.session)) as f:
                named = json.load(f)
        except FileNotFoundError:
            return {}
        return {int(offset): (owner, name) for offset, (owner, name) in named.items()}

    def allocation_table(self) -> tuple[np.ndarray | None, np.ndarray | None]:
        """(starts, sizes) of the live allocations, by offset; (None, None) when there are
        more than the table holds. A process that allocates reads its own; the simulator's
        workers read the table that rank 0's owner publishes."""
        if self.local_ranks:
            live = self.allocations()
            if not live:
                return np.zeros(0, np.int64), np.zeros(0, np.int64)
            pairs = np.asarray(live, np.int64)
            return pairs[:, 0], pairs[:, 1]
        if self._table is None:
            try:
                self._table = _map_table(allocations_path(self.session), create=False)
            except FileNotFoundError:  # no owner publishes one (heaps made by hand)
                return None, None
        table = self._table
        while True:
            version = int(table[0])
            if version == self._table_cache[0]:
                return self._table_cache[1], self._table_cache[2]
            if version % 2:
                continue
            count = int(table[1])
            pairs = table[2:2 + 2 * max(count, 0)].copy().reshape(-1, 2)
            if int(table[0]) != version:
                continue
            starts, sizes = (None, None) if count < 0 else (pairs[:, 0], pairs[:, 1])
            self._table_cache = (version, starts, sizes)
            return starts, sizes

    def _release(self) -> None:
        _OPEN.discard(self)
        self._table = None
        if 0 in self.local_ranks:
            _unlink([allocations_path(self.session), names_path(self.session)])
        self._arrays.clear()
        for rank, m in self._maps.items():
            try:
                m.close()
            except BufferError:
                pass  # a view is still alive; the mapping goes away with it
            if rank in self.local_ranks:
                try:
                    os.unlink(segment_path(self.session, rank))
                except FileNotFoundError:
                    pass
        self._maps.clear()


def _map_table(path: str, create: bool) -> np.ndarray:
    fd = os.open(path, os.O_CREAT | os.O_RDWR if create else os.O_RDWR, 0o600)
    try:
        if create:
            os.ftruncate(fd, _TABLE_BYTES)
        mapping = mmap.mmap(fd, _TABLE_BYTES)
    finally:
        os.close(fd)
    return np.frombuffer(mapping, np.int64)
