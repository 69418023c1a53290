"""GPU backend: one heap per local device; peers reached by peer access or shareable handles.

* one process, several devices: every rank is local, peer access is enabled between
  all pairs and `heap_bases` are plain device pointers;
* one process per device: the local heap is exported and peers' heaps are mapped here,
  through one of two allocators (`heap_allocator`, every process the same):
  "malloc": cudaMalloc, 64-byte cudaIpc handles through a KeyValueStore (one host);
  "vmm" / "fabric": CUDA's virtual memory API (iris_core.heap.vmm), handles as POSIX file
  descriptors over a Unix socket (one host) or as fabric handles through the store (the
  hosts of a multi-node NVLink domain). "auto" takes "vmm" where the GPU offers POSIX-fd
  handles (and "fabric" for a domain that spans hosts), else "malloc"; one process alone
  takes "malloc".
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import struct
from collections.abc import Sequence

import numpy as np

from iris_core import faults
from iris_core.errors import HeapExhaustedError, IrisError, RankMismatchError
from iris_core.heap import fd_exchange, vmm
from iris_core.heap.rendezvous import KeyValueStore
from iris_core.heap.status import STATUS_OFFSET, error_from_word
from iris_core.heap.symmetric import SymmetricHeap


def _cudart():
    try:
        from cuda.bindings import runtime
    except ImportError as e:  # pragma: no cover - GPU machines have it
        raise IrisError(
            "the GPU heap needs the `cuda-bindings` package (pip install cuda-bindings)"
        ) from e
    return runtime


HEAP_ALLOCATORS = ("auto", "malloc", "vmm", "fabric")


@functools.cache
def _driver():
    """The CUDA driver library (ctypes: the fault gate calls it on XLA's thread, per execution)."""
    return ctypes.CDLL("libcuda.so.1")


def gpu_count() -> int:
    """GPUs visible to this process, counted through the CUDA driver without creating a context (so no
    framework's memory preallocation happens); 0 where there is no driver."""
    try:
        driver = _driver()
        count = ctypes.c_int(0)
        if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0:
            return 0
        return count.value
    except OSError:  # no libcuda: no GPU
        return 0


def _check_driver(status: int, what: str) -> None:
    if status != 0:
        raise IrisError(f"{what} failed: CUresult {status}")



def _check(result, what: str):
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise IrisError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


DEFAULT_HEAP_BYTES = 1 << 30  # a cudaMalloc heap's size, and what a VMM heap maps at init, unless told


class CudaHeap(SymmetricHeap):
    """Heaps in GPU memory.

    A "malloc" heap is one cudaMalloc of `heap_size` (default DEFAULT_HEAP_BYTES) and cannot grow.
    A VMM heap ("vmm", "fabric") reserves `heap_size` bytes of address space per rank in every
    process (default: the device's memory, so that only the device's free memory bounds it),
    maps min(heap_size, DEFAULT_HEAP_BYTES) at init and grows by allocations of GROWTH_STEP
    bytes and more (SymmetricHeap's growth): each process creates and maps its ranks' new
    allocation at `base + old` (`_map`), then, once every process did, imports every peer's
    into its reserved range for that peer (`_map_peers`), all before the allocation that asked
    returns, so no kernel can address a range that a process has not mapped.

    Args:
      world_size: as for every SymmetricHeap.
      heap_size: the heap's size ("malloc") or upper bound (VMM); None: the defaults above.
      local_ranks: ranks whose heaps this process allocates.
      devices: the CUDA ordinal of each local rank.
      store, session: needed when some ranks live in other processes.
      reachable: the ranks whose heaps are mapped here (default: all); the others' bases stay
        0, e.g. ranks outside this rank's domain, whose handles are not valid here.
      heap_allocator: one of HEAP_ALLOCATORS (see the module docstring); `self.heap_allocator`
        is the one chosen.
      across_hosts: the reachable ranks span several hosts (only fabric handles reach them).

    Raises:
      RankMismatchError: the processes chose different allocators.
      IrisError: the chosen allocator is not available, or a CUDA call failed (named).
    """

    ALLOCATORS = HEAP_ALLOCATORS  # what `heap_allocator` may name
    GROWTH_STEP = 256 << 20  # a VMM heap grows by at least this much (a multiple of the granularity)

    def __init__(self, world_size: int, heap_size: int | None, local_ranks: Sequence[int],
                 devices: Sequence[int], store: KeyValueStore | None = None,
                 session: str = "iris", timeout_s: float = 300.0, reachable: Sequence[int] | None = None,
                 heap_allocator: str = "auto", across_hosts: bool = False):
        if len(devices) != len(local_ranks):
            raise RankMismatchError(f"{len(local_ranks)} local ranks but {len(devices)} devices")
        remote = [r for r in range(world_size) if r not in local_ranks and (reachable is None or r in reachable)]
        if remote and len(local_ranks) != 1:
            raise RankMismatchError(
                "multi-process heaps need exactly one GPU per process "
                f"(got local ranks {list(local_ranks)}); start one process per GPU"
            )
        chosen = choose_allocator(heap_allocator, devices, exporting=bool(remote), across_hosts=across_hosts)
        rt = _cudart()
        bound, mapped = _sizes(rt, chosen, devices, heap_size)
        if remote:  # every process must decide its growth alike: the least of each size
            bound, mapped = _least_sizes(store, session, local_ranks[0], remote, bound, mapped, timeout_s)
        super().__init__(world_size, bound, local_ranks, mapped)
        self.heap_allocator = chosen
        self.devices = dict(zip(local_ranks, devices))
        self._owned: list[tuple[int, int]] = []  # (device, pointer) of cudaMalloc
        self._opened: list[tuple[int, int]] = []  # (device, pointer) of cudaIpcOpenMemHandle
        self._ranges: dict[int, int] = {}  # rank -> its reserved range here (VMM): own and peers'
        self._chunks: list[tuple[int, int, int, vmm.Mapping]] = []  # (rank, offset, device, mapping), in order
        self._pages: dict[int, tuple[int, np.ndarray]] = {}  # local rank -> (pinned pointer, its words)
        self._peek_streams: dict[int, object] = {}  # local rank -> the stream peek_status copies on
        self._store, self._session, self._timeout_s, self._remote = store, session, timeout_s, remote
        self._peer_mappings = 0  # growths whose peers' memory was mapped here (keys their exchange)
        bases = [0] * world_size
        try:
            if remote:
                _agree(store, session, local_ranks[0], remote, self.heap_allocator, heap_allocator, timeout_s)
            _enable_peer_access(rt, devices)
            for rank, dev in self.devices.items():
                _check(rt.cudaSetDevice(dev), f"cudaSetDevice({dev})")
                bases[rank] = self._allocate(rank, dev, devices)
            self.heap_bases = bases  # (the VMM mappings below are made at these bases)
            if self.heap_allocator != "malloc":
                self._map_local(0, self.mapped_size)
            for rank, dev in self.devices.items():
                _check(rt.cudaSetDevice(dev), f"cudaSetDevice({dev})")
                _check(rt.cudaMemset(bases[rank], 0, self.mapped_size), "cudaMemset")
            if remote:
                _check(rt.cudaSetDevice(devices[0]), "cudaSetDevice")
                if self.heap_allocator == "malloc":
                    self._exchange_ipc(bases, local_ranks[0], remote, store, session, timeout_s)
                else:
                    self._map_peer_chunks(0, self.mapped_size, session)
            _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
            self.publish_bound()
            for rank in self.local_ranks:
                self._pages[rank] = _fault_page(rt)
        except BaseException:
            self._release()
            raise
        self.heap_bases = bases

    def fault_page(self, rank: int) -> int:
        return self._pages[rank][0] if rank in self._pages else 0  # pinned and mapped: one address (UVA)

    def fault_words(self, rank: int) -> np.ndarray | None:
        return self._pages[rank][1] if rank in self._pages else None

    def peek_status(self, rank: int) -> int:
        """Local rank's status word (iris_core.heap.status), copied through its fault page on a
        stream of its own: without waiting for the kernels that run (0 once the device cannot
        be read, e.g. after a trap)."""
        rt = _cudart()
        page, words = self._pages[rank]
        try:
            _check(rt.cudaSetDevice(self.devices[rank]), "cudaSetDevice")
            if rank not in self._peek_streams:
                self._peek_streams[rank] = _check(rt.cudaStreamCreateWithFlags(0x1), "cudaStreamCreateWithFlags")
            stream = self._peek_streams[rank]  # non-blocking: no wait behind the legacy stream's work
            _check(rt.cudaMemcpyAsync(page + 8 * faults.STATUS_COPY, self.heap_bases[rank] + STATUS_OFFSET, 8,
                                      rt.cudaMemcpyKind.cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync")
            _check(rt.cudaStreamSynchronize(stream), "cudaStreamSynchronize")
        except IrisError:
            return 0
        return int(words[faults.STATUS_COPY])

    def outcome(self, stream: int | None) -> Exception | None:
        """What the kernels enqueued so far on `stream` (a CUDA stream of the current device; None:
        every stream of its context) left behind, once they finished: the oldest fault its rank
        recorded, or the access the heap guard refused, as the error it stands for; None when there
        is none.

        Waits for the stream (one copy of the status word onto the fault page, then one
        synchronize); reads host memory after that. Records stay for check_faults() to take; a
        refused access alone is reported once, here (its status word is cleared), as the
        simulator's call raises it. The fault gate calls it from XLA's thread
        (iris_jax.calls.fault_gate; fault_gate.c does the same).
        """
        driver = _driver()
        if stream is None:
            _check_driver(driver.cuCtxSynchronize(), "cuCtxSynchronize")
            stream = 0
        device = ctypes.c_int()
        _check_driver(driver.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
        rank = next((r for r, d in self.devices.items() if d == device.value), None)
        if rank not in self._pages:
            return None
        page = self._pages[rank][0]
        _check_driver(driver.cuMemcpyDtoHAsync_v2(ctypes.c_void_p(page + 8 * faults.STATUS_COPY),
                                                  ctypes.c_uint64(self.status_address(rank)),
                                                  ctypes.c_size_t(8), ctypes.c_void_p(stream)), "cuMemcpyDtoHAsync")
        _check_driver(driver.cuStreamSynchronize(ctypes.c_void_p(stream)), "cuStreamSynchronize")
        error, words = self.recorded(rank), self._pages[rank][1]
        if words[faults.STATUS_COPY] and not faults.has_records(words):
            _check_driver(driver.cuMemsetD32Async(ctypes.c_uint64(self.status_address(rank)), ctypes.c_uint(0),
                                                  ctypes.c_size_t(2), ctypes.c_void_p(stream)), "cuMemsetD32Async")
            _check_driver(driver.cuStreamSynchronize(ctypes.c_void_p(stream)), "cuStreamSynchronize")
            words[faults.STATUS_COPY] = 0
        return error

    def recorded(self, rank: int) -> Exception | None:
        """The oldest fault local `rank` recorded, or the refused access last copied onto its page, as
        the error it stands for (None: neither); reads host memory only."""
        words = self._pages[rank][1]
        if faults.has_records(words):
            return faults.read_records(words)[0].error(rank)
        return error_from_word(int(words[faults.STATUS_COPY]), rank, self.mapped_size, upper=self.heap_size)

    def status_address(self, rank: int) -> int:
        """The device address of local rank's status word (iris_core.heap.status)."""
        return self.heap_bases[rank] + STATUS_OFFSET

    def clear_status(self, rank: int) -> None:
        """Zeroes local rank's status word on peek_status's stream."""
        rt = _cudart()
        if rank in self._peek_streams:
            rt.cudaSetDevice(self.devices[rank])
            rt.cudaMemsetAsync(self.heap_bases[rank] + STATUS_OFFSET, 0, 8, self._peek_streams[rank])
            rt.cudaStreamSynchronize(self._peek_streams[rank])

    def _allocate(self, rank: int, dev: int, devices: Sequence[int]) -> int:
        """The base of local `rank`'s heap on GPU `dev` (current): a cudaMalloc every local device
        may access, or (VMM) its reserved range, mapped by `_map_local`."""
        if self.heap_allocator == "malloc":
            ptr = int(_check(_cudart().cudaMalloc(self.heap_size), f"cudaMalloc({self.heap_size}) on GPU {dev}"))
            self._owned.append((dev, ptr))
            return ptr
        self._ranges[rank] = vmm.reserve(self.heap_size)
        return self._ranges[rank]

    # -- growth (VMM heaps; SymmetricHeap._grow_for calls these) -------------------------------
    def _map(self, old: int, new: int) -> None:
        if self.heap_allocator == "malloc":
            super()._map(old, new)  # refuses
        rt = _cudart()
        try:
            self._map_local(old, new)
            for rank, dev in self.devices.items():  # zeroed, as the heap is at init
                _check(rt.cudaSetDevice(dev), "cudaSetDevice")
                _check(rt.cudaMemset(self.heap_bases[rank] + old, 0, new - old), "cudaMemset")
            _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        except IrisError as e:  # out of memory, or any failed call: the growth fails on every rank
            self._drop_chunks(old, self.local_ranks)
            raise HeapExhaustedError(str(e)) from None

    def _unmap(self, old: int, new: int) -> None:
        self._drop_chunks(old, self.local_ranks)

    def _map_peers(self, old: int, new: int) -> None:
        if not self._remote:
            return
        try:
            self._peer_mappings += 1  # (every process counts alike: this runs where every process grew its own)
            self._map_peer_chunks(old, new, f"{self._session}/grow/{self._peer_mappings}")
        except (IrisError, OSError) as e:
            raise HeapExhaustedError(f"mapping the peers' new memory failed: {e}") from None

    def _unmap_peers(self, old: int, new: int) -> None:
        self._drop_chunks(old, self._remote)

    def _map_local(self, old: int, new: int) -> None:
        """Creates bytes [old, new) of every local rank's heap on its GPU and maps them at its
        base (read-write for every local GPU); all or none."""
        access = list(self.devices.values())
        with self._all_or_none():
            for rank, dev in self.devices.items():
                mapping = vmm.create_at(dev, self.heap_bases[rank] + old, new - old, self.heap_allocator, access)
                self._chunks.append((rank, old, dev, mapping))

    @contextlib.contextmanager
    def _all_or_none(self):
        """The chunks mapped inside are unmapped again (newest first) when it fails."""
        made = len(self._chunks)
        try:
            yield
        except BaseException:
            for _, _, _, mapping in reversed(self._chunks[made:]):
                vmm.unmap(mapping)
            del self._chunks[made:]
            raise

    def _map_peer_chunks(self, old: int, new: int, session: str) -> None:
        """Publishes this process's allocation of bytes [old, new) (its size, and for fabric its
        handle, in the store; "vmm": file descriptors over sockets) and maps every peer's at
        `old` of the peer's range here, reserving that range the first time."""
        (rank,) = self.local_ranks
        kind, dev, store, timeout_s = self.heap_allocator, self.devices[rank], self._store, self._timeout_s
        mine = next(m for r, at, _, m in self._chunks if r == rank and at == old)
        shareable = vmm.export(mine, kind)
        fds: dict[int, int] = {}
        try:
            with self._all_or_none():
                handle = shareable if kind == "fabric" else b""
                store.set(f"iris/{session}/vmm/{rank}", _SIZE.pack(mine.size) + handle)
                if kind == "vmm":
                    fds = fd_exchange.exchange_fds(shareable, rank, self._remote, store, session, timeout_s)
                for peer in self._remote:
                    record = store.get(f"iris/{session}/vmm/{peer}", timeout_s)
                    size, = _SIZE.unpack_from(record)
                    if size != new - old:
                        raise RankMismatchError(f"rank {peer} mapped {size} bytes at heap offset {old}, rank {rank} "
                                                f"{new - old}: the processes' heaps differ")
                    if peer not in self._ranges:
                        self._ranges[peer] = vmm.reserve(self.heap_size)
                        self.heap_bases[peer] = self._ranges[peer]
                    mapping = vmm.open_at(fds.get(peer, record[_SIZE.size:]), self._ranges[peer] + old, size, kind, dev)
                    self._chunks.append((peer, old, dev, mapping))
        finally:  # imported allocations hold their own references: no descriptor outlives the exchange
            for fd in fds.values():
                os.close(fd)
            if kind == "vmm":
                os.close(shareable)

    def _drop_chunks(self, offset: int, ranks) -> None:
        """Unmaps the allocations of `ranks` made at `offset` (a growth undone)."""
        keep = []
        for chunk in self._chunks:
            if chunk[0] in ranks and chunk[1] == offset:
                vmm.unmap(chunk[3])
            else:
                keep.append(chunk)
        self._chunks = keep

    def _exchange_ipc(self, bases, rank, remote, store, session, timeout_s) -> None:
        """Publishes the heap's cudaIpc handle in the store and opens every peer's here."""
        rt, dev = _cudart(), self.devices[rank]
        handle = _check(rt.cudaIpcGetMemHandle(bases[rank]), "cudaIpcGetMemHandle")
        store.set(f"iris/{session}/ipc/{rank}", _handle_bytes(handle))
        for peer in remote:
            data = store.get(f"iris/{session}/ipc/{peer}", timeout_s)
            peer_handle = rt.cudaIpcMemHandle_t()
            ctypes.memmove(peer_handle.getPtr(), data, 64)
            ptr = int(_check(rt.cudaIpcOpenMemHandle(
                peer_handle, rt.cudaIpcMemLazyEnablePeerAccess), "cudaIpcOpenMemHandle"))
            self._opened.append((dev, ptr))
            bases[peer] = ptr

    def torch_tensor(self, rank: int, offset: int, shape, dtype, owner: object = None):
        """A torch tensor over rank's heap at `offset` (rank must be local); the tensor's
        storage, and every view of it, keeps `owner` alive."""
        import torch

        if rank not in self.devices:
            raise RankMismatchError(f"rank {rank} is not local to this process")
        nbytes = torch.empty((), dtype=dtype).element_size()
        for s in shape:
            nbytes *= s
        holder = _CudaBytes(self.heap_bases[rank] + offset, nbytes, owner)
        raw = torch.as_tensor(holder, device=f"cuda:{self.devices[rank]}")
        return raw.view(dtype).view(tuple(shape))

    def read_words(self, rank: int, offset: int, count: int) -> np.ndarray:
        # a peer's heap (mapped here) through a local GPU: unified addressing finds it
        rt = _cudart()
        out = np.zeros(count, np.int64)
        _check(rt.cudaSetDevice(self.devices.get(rank, next(iter(self.devices.values())))), "cudaSetDevice")
        _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        _check(rt.cudaMemcpy(out.ctypes.data, self.heap_bases[rank] + offset, out.nbytes,
                             rt.cudaMemcpyKind.cudaMemcpyDefault), "cudaMemcpy")
        return out

    def _zero_local(self, rank: int, offset: int, nbytes: int) -> None:
        rt = _cudart()
        _check(rt.cudaSetDevice(self.devices[rank]), "cudaSetDevice")
        _check(rt.cudaMemset(self.heap_bases[rank] + offset, 0, nbytes), "cudaMemset")
        _check(rt.cudaStreamSynchronize(0), "cudaStreamSynchronize")

    def _store_word_local(self, rank: int, offset: int, value: int) -> None:
        rt = _cudart()
        word = np.array([value], np.int64)  # (one aligned 8-byte copy: a kernel reads the old or the new bound)
        _check(rt.cudaSetDevice(self.devices[rank]), "cudaSetDevice")
        _check(rt.cudaMemcpy(self.heap_bases[rank] + offset, word.ctypes.data, 8,
                             rt.cudaMemcpyKind.cudaMemcpyDefault), "cudaMemcpy")
        _check(rt.cudaStreamSynchronize(0), "cudaStreamSynchronize")  # (there before the next launch)

    def _release(self) -> None:
        rt = _cudart()
        for dev in {dev for dev, _ in self._owned} | {dev for _, _, dev, _ in self._chunks}:  # no kernel may
            rt.cudaSetDevice(dev)                                                            # still use a heap
            rt.cudaDeviceSynchronize()
        for dev, ptr in self._opened:
            rt.cudaSetDevice(dev)
            rt.cudaIpcCloseMemHandle(ptr)
        for _, _, dev, mapping in reversed(self._chunks):  # the latest first, peers' before this process's
            rt.cudaSetDevice(dev)
            vmm.unmap(mapping)
        for pointer in self._ranges.values():
            vmm.free_range(pointer, self.heap_size)
        for dev, ptr in self._owned:
            rt.cudaSetDevice(dev)
            rt.cudaFree(ptr)
        for stream in self._peek_streams.values():
            rt.cudaStreamDestroy(stream)
        for ptr, _ in self._pages.values():
            rt.cudaFreeHost(ptr)
        self._opened.clear()
        self._chunks.clear()
        self._ranges.clear()
        self._owned.clear()
        self._pages.clear()
        self._peek_streams.clear()


def _sizes(rt, allocator: str, devices: Sequence[int], heap_size: int | None) -> tuple[int, int]:
    """(upper bound, bytes mapped at init) of a heap: "malloc" maps `heap_size` (default
    DEFAULT_HEAP_BYTES), fixed; VMM reserves `heap_size` (default: the smallest local device's
    memory) and maps up to DEFAULT_HEAP_BYTES of it, both rounded to the allocation granularity."""
    if allocator == "malloc":
        return (heap_size or DEFAULT_HEAP_BYTES,) * 2
    if heap_size is None:
        totals = []
        for dev in devices:
            _check(rt.cudaSetDevice(dev), f"cudaSetDevice({dev})")
            totals.append(int(_check(rt.cudaMemGetInfo(), "cudaMemGetInfo")[1]))
        heap_size = min(totals)
    bound = max(vmm.rounded_size(dev, allocator, heap_size) for dev in devices)
    return bound, max(vmm.rounded_size(dev, allocator, min(bound, DEFAULT_HEAP_BYTES)) for dev in devices)


def _least_sizes(store: KeyValueStore, session: str, rank: int, peers: Sequence[int], bound: int, mapped: int,
                 timeout_s: float) -> tuple[int, int]:
    """The least upper bound and initial mapping of this process's and its peers' (GPUs with less
    memory bound them all)."""
    store.set(f"iris/{session}/heap-sizes/{rank}", _SIZE.pack(bound) + _SIZE.pack(mapped))
    for peer in peers:
        record = store.get(f"iris/{session}/heap-sizes/{peer}", timeout_s)
        bound = min(bound, _SIZE.unpack_from(record)[0])
        mapped = min(mapped, _SIZE.unpack_from(record, _SIZE.size)[0])
    return bound, mapped


def _fault_page(rt) -> tuple[int, np.ndarray]:
    """A zeroed fault page (iris_core.faults) in pinned host memory that every device maps at
    the same address: (address, its int64 words)."""
    flags = 0x1 | 0x2  # cudaHostAllocPortable | cudaHostAllocMapped
    ptr = _check(rt.cudaHostAlloc(faults.PAGE_BYTES, flags), "cudaHostAlloc (the fault page)")
    words = np.ctypeslib.as_array((ctypes.c_int64 * (faults.PAGE_BYTES // 8)).from_address(ptr))
    words[:] = 0
    return ptr, words


def choose_allocator(requested: str, devices: Sequence[int], exporting: bool, across_hosts: bool = False) -> str:
    """The allocator that `requested` (one of HEAP_ALLOCATORS) means on these GPUs.

    Args:
      exporting: other processes map this process's heap (one process per GPU).
      across_hosts: some of them run on other hosts (only fabric handles reach them).

    Raises:
      ValueError: an unknown name. IrisError: the allocator cannot serve these processes.
    """
    if requested not in HEAP_ALLOCATORS:
        raise ValueError(f"unknown heap allocator {requested!r}; choose one of {HEAP_ALLOCATORS} "
                         "(IRIS_HEAP_ALLOCATOR or init(heap_allocator=...))")
    if requested == "auto":
        if not exporting:
            return "malloc"
        if across_hosts:  # only fabric handles reach another host
            requested = "fabric"
        else:
            return "vmm" if all(vmm.supports(dev, "vmm") for dev in devices) else "malloc"
    if requested != "malloc":
        missing = [dev for dev in devices if not vmm.supports(dev, requested)]
        if missing:
            handle_type, attribute = vmm.KINDS[requested]
            raise IrisError(
                f"heap allocator {requested!r}: GPU {missing[0]} does not offer {handle_type} allocations "
                f"({attribute} or virtual memory management is not supported); "
                + ("this rank's domain spans several hosts, which only fabric handles reach: make each host a "
                   "domain (leave IRIS_DOMAIN_SIZE unset, or set it to the GPUs per host)" if across_hosts and
                   exporting else "use IRIS_HEAP_ALLOCATOR=malloc (cudaMalloc + CUDA IPC)"))
    if exporting and across_hosts and requested != "fabric":
        raise IrisError(
            f"heap allocator {requested!r} reaches the processes of one host only, but this rank's domain spans "
            "several hosts: use 'fabric' on a multi-node NVLink system that offers it, or make each host a "
            "domain (leave IRIS_DOMAIN_SIZE unset, or set it to the GPUs per host)")
    return requested


def _agree(store: KeyValueStore, session: str, rank: int, peers: Sequence[int], chosen: str, requested: str,
           timeout_s: float) -> None:
    """Raises RankMismatchError unless every peer chose the same allocator (before any allocates)."""
    store.set(f"iris/{session}/heap-allocator/{rank}", chosen.encode())
    for peer in peers:
        theirs = store.get(f"iris/{session}/heap-allocator/{peer}", timeout_s).decode()
        if theirs != chosen:
            raise RankMismatchError(
                f"rank {rank} chose heap allocator {chosen!r} (asked for {requested!r}) but rank {peer} chose "
                f"{theirs!r}; every process must use the same one: set IRIS_HEAP_ALLOCATOR (or "
                "init(heap_allocator=...)) alike in all of them, e.g. to 'malloc'")


def _enable_peer_access(rt, devices: Sequence[int]) -> None:
    """Peer access between every pair of this process's GPUs (one process, several devices)."""
    for a in devices:
        for b in devices:
            if a != b:
                _check(rt.cudaSetDevice(a), "cudaSetDevice")
                can = _check(rt.cudaDeviceCanAccessPeer(a, b), "cudaDeviceCanAccessPeer")
                if not can:
                    raise IrisError(f"GPU {a} cannot access GPU {b} (no NVLink/P2P path)")
                err = rt.cudaDeviceEnablePeerAccess(b, 0)[0]
                if err not in (rt.cudaError_t.cudaSuccess,
                               rt.cudaError_t.cudaErrorPeerAccessAlreadyEnabled):
                    raise IrisError(f"cudaDeviceEnablePeerAccess({a}->{b}) failed: {err}")
                rt.cudaGetLastError()


_SIZE = struct.Struct("<Q")  # a VMM heap's mapped size, in the store before its fabric handle


def _handle_bytes(handle) -> bytes:
    return ctypes.string_at(handle.getPtr(), 64)


class _CudaBytes:
    """Exposes `nbytes` of device memory through __cuda_array_interface__ (zero-copy)."""

    def __init__(self, ptr: int, nbytes: int, owner: object = None):
        self.owner = owner  # torch keeps this object (so the owner) alive with the storage
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
            "strides": None,
        }
