"""GPU backend: one cudaMalloc per local device; peers reached by peer access or CUDA IPC.

* one process, several devices: every rank is local, peer access is enabled between
  all pairs and `heap_bases` are plain device pointers;
* one process per device: the local heap is exported with cudaIpcGetMemHandle, the
  64-byte handles go through a KeyValueStore, and peers' heaps are opened here.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import numpy as np

from iris_core.errors import IrisError, RankMismatchError
from iris_core.heap.rendezvous import KeyValueStore
from iris_core.heap.symmetric import SymmetricHeap


def _cudart():
    try:
        from cuda.bindings import runtime
    except ImportError as e:  # pragma: no cover - GPU machines have it
        raise IrisError(
            "the GPU heap needs the `cuda-bindings` package (pip install cuda-bindings)"
        ) from e
    return runtime


def _check(result, what: str):
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise IrisError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


class CudaHeap(SymmetricHeap):
    """Heaps in GPU memory.

    Args:
      world_size, heap_size: as for every SymmetricHeap.
      local_ranks: ranks whose heaps this process allocates.
      devices: the CUDA ordinal of each local rank.
      store, session: needed when some ranks live in other processes (CUDA IPC).
      reachable: the ranks whose heaps are mapped here (default: all); the others' bases stay
        0, e.g. ranks on other hosts, whose IPC handles are not valid here.
    """

    def __init__(self, world_size: int, heap_size: int, local_ranks: Sequence[int],
                 devices: Sequence[int], store: KeyValueStore | None = None,
                 session: str = "iris", timeout_s: float = 300.0, reachable: Sequence[int] | None = None):
        super().__init__(world_size, heap_size, local_ranks)
        if len(devices) != len(local_ranks):
            raise RankMismatchError(f"{len(local_ranks)} local ranks but {len(devices)} devices")
        remote = [r for r in range(world_size) if r not in local_ranks and (reachable is None or r in reachable)]
        if remote and len(local_ranks) != 1:
            raise RankMismatchError(
                "multi-process heaps need exactly one GPU per process "
                f"(got local ranks {list(local_ranks)}); start one process per GPU"
            )
        self.devices = dict(zip(local_ranks, devices))
        self._owned: list[tuple[int, int]] = []  # (device, pointer)
        self._opened: list[tuple[int, int]] = []
        rt = _cudart()
        bases = [0] * world_size
        try:
            for rank, dev in self.devices.items():
                _check(rt.cudaSetDevice(dev), f"cudaSetDevice({dev})")
                ptr = int(_check(rt.cudaMalloc(heap_size), f"cudaMalloc({heap_size}) on GPU {dev}"))
                self._owned.append((dev, ptr))
                _check(rt.cudaMemset(ptr, 0, heap_size), "cudaMemset")
                bases[rank] = ptr
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
            if remote:
                (rank, dev), = self.devices.items()
                _check(rt.cudaSetDevice(dev), "cudaSetDevice")
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
            _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        except BaseException:
            self._release()
            raise
        self.heap_bases = bases

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
        rt = _cudart()
        out = np.zeros(count, np.int64)
        _check(rt.cudaSetDevice(self.devices[rank]), "cudaSetDevice")
        _check(rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
        _check(rt.cudaMemcpy(out.ctypes.data, self.heap_bases[rank] + offset, out.nbytes,
                             rt.cudaMemcpyKind.cudaMemcpyDefault), "cudaMemcpy")
        return out

    def _zero_local(self, rank: int, offset: int, nbytes: int) -> None:
        rt = _cudart()
        _check(rt.cudaSetDevice(self.devices[rank]), "cudaSetDevice")
        _check(rt.cudaMemset(self.heap_bases[rank] + offset, 0, nbytes), "cudaMemset")
        _check(rt.cudaStreamSynchronize(0), "cudaStreamSynchronize")

    def _release(self) -> None:
        rt = _cudart()
        for dev, ptr in self._opened:
            rt.cudaSetDevice(dev)
            rt.cudaIpcCloseMemHandle(ptr)
        for dev, ptr in self._owned:
            rt.cudaSetDevice(dev)
            rt.cudaDeviceSynchronize()
            rt.cudaFree(ptr)
        self._opened.clear()
        self._owned.clear()


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
