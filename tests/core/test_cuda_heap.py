"""The GPU heap's growth (iris_core.heap.cuda: VMM heaps reserve their upper bound and map
allocations into it), with CUDA's runtime and the VMM driver calls stubbed: no GPU needed. What
is checked is the bookkeeping (where each allocation is mapped, in which process, in what order,
what a failure undoes), not the driver's behaviour; that needs the GPU suite."""

import ctypes
import itertools
import threading

import pytest

from iris_core.errors import HeapExhaustedError, IrisError
from iris_core.heap import cuda, status, vmm
from iris_core.heap.rendezvous import FileStore

MiB = 1 << 20
GRANULE = 2 * MiB


class FakeCuda:
    """The CUDA runtime calls CudaHeap makes, answered in host memory (the fault pages are real)."""

    class cudaError_t:  # noqa: N801 - CUDA's name
        cudaSuccess, cudaErrorPeerAccessAlreadyEnabled = 0, 704

    class cudaMemcpyKind:  # noqa: N801 - CUDA's name
        cudaMemcpyDefault, cudaMemcpyDeviceToHost = 4, 2

    def __init__(self, total=80 << 30):
        self.total, self.pages, self.memsets, self.words = total, [], [], []

    def __getattr__(self, name):  # the calls whose answer does not matter here
        return lambda *args: (0,)

    def cudaMemGetInfo(self):
        return 0, self.total // 2, self.total

    def cudaMemset(self, pointer, value, nbytes):
        self.memsets.append((pointer, nbytes))
        return (0,)

    def cudaMemcpy(self, destination, source, nbytes, kind):
        """Records an int64 written into a heap (the guard's bound): (address, value)."""
        assert nbytes == 8 and kind == self.cudaMemcpyKind.cudaMemcpyDefault, (nbytes, kind)
        self.words.append((destination, ctypes.c_int64.from_address(source).value))
        return (0,)

    def cudaDeviceCanAccessPeer(self, a, b):
        return 0, 1

    def cudaMalloc(self, nbytes):
        return 0, 1 << 36

    def cudaHostAlloc(self, nbytes, flags):
        page = ctypes.create_string_buffer(nbytes)
        self.pages.append(page)
        return 0, ctypes.addressof(page)


class FakeVmm:
    """vmm's calls over fake address ranges and a memory budget per GPU (past it cuMemCreate fails)."""

    def __init__(self, memory):
        self.memory, self.lock = dict(memory), threading.Lock()
        self.ranges, self.mapped, self.live = {}, [], {}  # live: device -> bytes created
        self.addresses = itertools.count(1 << 40, 1 << 38)
        self.handles = itertools.count(1)

    def install(self, monkeypatch):
        for name in ("reserve", "free_range", "create_at", "open_at", "unmap", "export", "rounded_size", "supports"):
            monkeypatch.setattr(vmm, name, getattr(self, name))

    def supports(self, device, kind):
        return True

    def rounded_size(self, device, kind, nbytes):
        return -(-nbytes // GRANULE) * GRANULE

    def reserve(self, size):
        with self.lock:
            pointer = next(self.addresses)
            self.ranges[pointer] = size
            return pointer

    def free_range(self, pointer, size):
        assert self.ranges.pop(pointer) == size

    def _check_inside(self, pointer, size):
        assert size % GRANULE == 0 and pointer % GRANULE == 0, (pointer, size)
        assert any(base <= pointer and pointer + size <= base + n for base, n in self.ranges.items()), pointer
        assert not any(m.pointer < pointer + size and pointer < m.pointer + m.size for m in self.mapped), pointer

    def create_at(self, device, pointer, size, kind, access_devices):
        with self.lock:
            if self.live.get(device, 0) + size > self.memory.get(device, 1 << 62):
                raise IrisError(f"cuMemCreate({size} bytes on GPU {device}, {kind} handles) failed: "
                                "CUDA_ERROR_OUT_OF_MEMORY (out of memory)")
            self._check_inside(pointer, size)
            self.live[device] = self.live.get(device, 0) + size
            mapping = vmm.Mapping(pointer, size, ("created", device, next(self.handles)))
            self.mapped.append(mapping)
            return mapping

    def export(self, mapping, kind):
        return repr(mapping.handle).encode().ljust(64)

    def open_at(self, shareable, pointer, size, kind, device):
        with self.lock:
            self._check_inside(pointer, size)
            mapping = vmm.Mapping(pointer, size, ("imported", bytes(shareable).strip()))
            self.mapped.append(mapping)
            return mapping

    def unmap(self, mapping):
        with self.lock:
            self.mapped.remove(mapping)
            if mapping.handle[0] == "created":
                self.live[mapping.handle[1]] -= mapping.size


@pytest.fixture
def fakes(monkeypatch):
    def install(memory=None, total=80 << 30):
        fake_cuda, fake_vmm = FakeCuda(total), FakeVmm(memory or {})
        monkeypatch.setattr(cuda, "_cudart", lambda: fake_cuda)
        fake_vmm.install(monkeypatch)
        return fake_cuda, fake_vmm
    return install


def test_a_vmm_heap_reserves_its_bound_and_maps_as_allocations_need(fakes):
    fake_cuda, fake_vmm = fakes()
    heap = cuda.CudaHeap(2, 4 << 30, [0, 1], [0, 1], heap_allocator="vmm")
    try:
        assert (heap.heap_size, heap.mapped_size) == (4 << 30, 1 << 30)
        assert sorted(fake_vmm.ranges.values()) == [4 << 30, 4 << 30]
        bases = list(heap.heap_bases)
        assert [m.pointer for m in fake_vmm.mapped] == bases  # the first GiB at each base
        bound = [(base + status.BOUND_OFFSET, 1 << 30) for base in bases]  # the guard's: what is mapped
        assert fake_cuda.words == bound
        first = heap.allocate(512 * MiB)
        big = heap.allocate(700 * MiB, owner="arrays")  # past 1 GiB: one growth, 256 MiB steps
        assert heap.growths == 1 and heap.mapped_size == 1280 * MiB  # the free end extended, to 256 MiB steps
        assert heap.heap_bases == bases and first < big
        grown = [(m.pointer - base, m.size) for m in fake_vmm.mapped for base in bases if m.pointer >= base
                 and m.pointer < base + heap.heap_size]
        assert grown.count((1 << 30, 256 * MiB)) == 2  # each rank's new allocation at base + 1 GiB
        assert (bases[1] + (1 << 30), 256 * MiB) in fake_cuda.memsets  # zeroed, as at init
        assert fake_cuda.words[2:] == [(base + status.BOUND_OFFSET, 1280 * MiB) for base in bases]  # then moved
    finally:
        heap.close()
    assert fake_vmm.mapped == [] and fake_vmm.ranges == {}


def test_a_gpu_out_of_memory_fails_the_growth_and_undoes_it(fakes):
    _, fake_vmm = fakes(memory={1: 1280 * MiB})  # GPU 1 has room for 1 GiB + 256 MiB
    heap = cuda.CudaHeap(2, 8 << 30, [0, 1], [0, 1], heap_allocator="vmm")
    try:
        heap.allocate(900 * MiB)
        with pytest.raises(HeapExhaustedError, match="GPU 1.*CUDA_ERROR_OUT_OF_MEMORY.*nothing was changed"):
            heap.allocate(600 * MiB)  # needs 1.5 GiB mapped
        assert heap.mapped_size == 1 << 30 and len(fake_vmm.mapped) == 2  # GPU 0's new allocation undone
        assert fake_vmm.live == {0: 1 << 30, 1: 1 << 30}
        heap.allocate(200 * MiB)  # 1.25 GiB still fits GPU 1
        assert heap.mapped_size == 1280 * MiB
    finally:
        heap.close()


def test_a_malloc_heap_keeps_its_size(fakes):
    fakes()
    heap = cuda.CudaHeap(1, 64 * MiB, [0], [0], heap_allocator="malloc")
    try:
        assert heap.mapped_size == heap.heap_size == 64 * MiB
        with pytest.raises(HeapExhaustedError, match="pass the heap's upper bound"):
            heap.allocate(100 * MiB)
    finally:
        heap.close()


def test_the_default_bound_is_the_devices_memory(fakes):
    fakes(total=141 << 30)
    heap = cuda.CudaHeap(1, None, [0], [0], heap_allocator="vmm")
    try:
        assert (heap.heap_size, heap.mapped_size) == (141 << 30, 1 << 30)
    finally:
        heap.close()


def _processes(tmp_path, fakes, memory=None, bounds=(4 << 30, 4 << 30)):
    """Two CudaHeaps, one per thread as if one per process (fabric handles through a FileStore),
    agreeing on growth through the store as the runtime does."""
    _, fake_vmm = fakes(memory)
    store = FileStore(str(tmp_path))
    heaps, errors = [None, None], []
    counters = [itertools.count(), itertools.count()]

    def agree(rank):
        def on_growth(failure):
            key = f"iris/test/grow/{next(counters[rank])}"
            store.set(f"{key}/{rank}", (failure or "").encode())
            return [f for f in (store.get(f"{key}/{r}", 10).decode() for r in (0, 1)) if f]
        return on_growth

    def start(rank):
        try:
            heaps[rank] = cuda.CudaHeap(2, bounds[rank], [rank], [rank], store=store, session="test", timeout_s=10,
                                        heap_allocator="fabric")
            heaps[rank].agree = agree(rank)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=start, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return heaps, fake_vmm


def _on_both(heaps, fn):
    results, threads = [None, None], []
    for rank in (0, 1):
        def run(rank=rank):
            try:
                results[rank] = fn(heaps[rank])
            except BaseException as e:  # noqa: BLE001 - returned to the test
                results[rank] = e
        threads.append(threading.Thread(target=run))
        threads[-1].start()
    for t in threads:
        t.join()
    return results


def test_processes_grow_together_and_map_each_others_new_memory(tmp_path, fakes):
    heaps, fake_vmm = _processes(tmp_path, fakes, bounds=(4 << 30, 3 << 30))
    try:
        assert [h.heap_size for h in heaps] == [3 << 30, 3 << 30]  # the least bound of the two
        offsets = _on_both(heaps, lambda h: h.allocate(1200 * MiB))
        assert offsets[0] == offsets[1] and all(h.mapped_size == 1280 * MiB for h in heaps)
        # each process: its own new allocation and the peer's, imported at the peer's range + 1 GiB
        for me, heap in enumerate(heaps):
            peer = 1 - me
            chunks = [(r, at) for r, at, _, _ in heap._chunks]
            assert chunks == [(me, 0), (peer, 0), (me, 1 << 30), (peer, 1 << 30)], chunks
            assert heap._chunks[3][3].pointer == heap.heap_bases[peer] + (1 << 30)
    finally:
        _on_both(heaps, lambda h: h.close())
    assert fake_vmm.mapped == []


def test_one_process_out_of_memory_fails_the_growth_in_both(tmp_path, fakes):
    heaps, fake_vmm = _processes(tmp_path, fakes, memory={1: 1100 * MiB})
    try:
        results = _on_both(heaps, lambda h: h.allocate(1200 * MiB))
        for result in results:
            assert isinstance(result, HeapExhaustedError), result
            assert "CUDA_ERROR_OUT_OF_MEMORY" in str(result) and "nothing was changed" in str(result), result
        assert all(h.mapped_size == 1 << 30 for h in heaps)
        assert len(fake_vmm.mapped) == 4  # the first GiB of each, here and imported; rank 0's new one undone
        offsets = _on_both(heaps, lambda h: h.allocate(64 * MiB))  # what fits still fits, alike
        assert offsets[0] == offsets[1]
    finally:
        _on_both(heaps, lambda h: h.close())
