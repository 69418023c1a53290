"""GPU heaps through CUDA's virtual memory API: exportable allocations, mapped by each process.

cuMemCreate makes the physical allocation; every process that uses it (its owner too)
maps it into an address range it reserved (cuMemMap) and grants its own devices read-write
access (cuMemSetAccess). Other processes get it from a shareable handle:

* "vmm": a POSIX file descriptor, valid within one host; it cannot travel through the
  key-value store, so it goes over a Unix socket (iris_core.heap.fd_exchange);
* "fabric": a 64-byte fabric handle, valid across the hosts of one NVLink domain (multi-node
  NVLink: the driver must offer it, and the processes need an IMEX channel); plain bytes.

A heap (iris_core.heap.cuda) reserves its whole range once per rank (`reserve`: the heap's
upper bound) and maps allocations into it one after another as it grows (`create_at`, `open_at`);
its base never changes.

cuda.bindings is imported on first use: importing this module needs neither it nor a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from iris_core.errors import IrisError

# kind: (its handle type, the device attribute that says the driver offers it)
KINDS = {
    "vmm": ("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR",
            "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED"),
    "fabric": ("CU_MEM_HANDLE_TYPE_FABRIC", "CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED"),
}


@dataclass
class Mapping:
    """An allocation mapped in this process: `size` bytes at `pointer`."""

    pointer: int
    size: int
    handle: object  # the CUmemGenericAllocationHandle (created here or imported)


def supports(device: int, kind: str) -> bool:
    """Whether GPU `device` offers VMM allocations exportable as `kind` handles."""
    d = _driver()
    dev = _call(d.cuDeviceGet(device), f"cuDeviceGet({device})")
    attributes = [d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, _attribute(kind)]
    return all(_call(d.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a.name})") for a in attributes)


def rounded_size(device: int, kind: str, nbytes: int) -> int:
    """`nbytes` rounded up to the device's allocation granularity for `kind` handles."""
    d = _driver()
    step = int(_call(d.cuMemGetAllocationGranularity(
        _properties(device, kind), d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
        f"cuMemGetAllocationGranularity(GPU {device})"))
    return -(-nbytes // step) * step


def export(mapping: Mapping, kind: str) -> int | bytes:
    """The shareable handle of an allocation made here: a file descriptor (the caller closes
    it) for "vmm", the handle's 64 bytes for "fabric"."""
    d = _driver()
    hint = ("; fabric handles need an IMEX channel (/dev/nvidia-caps-imex-channels); within one host use "
            "IRIS_HEAP_ALLOCATOR=vmm") if kind == "fabric" else ""
    shareable = _call(d.cuMemExportToShareableHandle(mapping.handle, _handle_type(kind), 0),
                      f"cuMemExportToShareableHandle({kind})", hint)
    return bytes(shareable.data) if kind == "fabric" else int(shareable)


def reserve(size: int) -> int:
    """A range of `size` bytes of this process's device address space, nothing mapped yet."""
    return int(_call(_driver().cuMemAddressReserve(size, 0, 0, 0), f"cuMemAddressReserve({size} bytes)"))


def free_range(pointer: int, size: int) -> None:
    """Returns a reserved range (its mappings unmapped first; teardown: errors ignored)."""
    _driver().cuMemAddressFree(pointer, size)


def create_at(device: int, pointer: int, size: int, kind: str, access_devices: Sequence[int]) -> Mapping:
    """A new allocation of `size` bytes (a multiple of the granularity) on GPU `device`,
    exportable as `kind`, mapped at `pointer` (inside a reserved range) with read-write access
    for `access_devices`."""
    d = _driver()
    handle = _call(d.cuMemCreate(size, _properties(device, kind), 0),
                   f"cuMemCreate({size} bytes on GPU {device}, {kind} handles)")
    try:
        return _map(handle, size, access_devices, pointer)
    except BaseException:
        d.cuMemRelease(handle)
        raise


def open_at(shareable: int | bytes, pointer: int, size: int, kind: str, device: int) -> Mapping:
    """Maps another process's allocation (its `export`ed handle; a descriptor stays open: the
    caller closes it) at `pointer` (inside a reserved range), read-write for GPU `device`."""
    handle = _import(shareable, kind)
    try:
        return _map(handle, size, [device], pointer)
    except BaseException:
        _driver().cuMemRelease(handle)
        raise


def unmap(mapping: Mapping) -> None:
    """Unmaps an allocation mapped into a reserved range and drops this process's reference;
    the range stays reserved (errors ignored: teardown, or undoing a growth)."""
    d = _driver()
    d.cuMemUnmap(mapping.pointer, mapping.size)
    d.cuMemRelease(mapping.handle)


def _import(shareable: int | bytes, kind: str):
    d = _driver()
    if kind == "fabric":
        fabric = d.CUmemFabricHandle()
        fabric.data = shareable
        os_handle = fabric.getPtr()  # the driver reads the handle's bytes from there
    else:
        os_handle = shareable  # the descriptor itself, as the pointer-sized value
    return _call(d.cuMemImportFromShareableHandle(os_handle, _handle_type(kind)),
                 f"cuMemImportFromShareableHandle({kind})")


def _map(handle, size: int, access_devices: Sequence[int], pointer: int) -> Mapping:
    """Maps `handle` at `pointer` with read-write access for `access_devices` (all or nothing)."""
    d = _driver()
    _call(d.cuMemMap(pointer, size, 0, handle, 0), "cuMemMap")
    try:
        access = [_read_write(dev) for dev in access_devices]
        _call(d.cuMemSetAccess(pointer, size, access, len(access)),
              f"cuMemSetAccess(read-write for GPUs {list(access_devices)})")
    except BaseException:
        d.cuMemUnmap(pointer, size)
        raise
    return Mapping(int(pointer), size, handle)


def _properties(device: int, kind: str):
    d = _driver()
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = _handle_type(kind)
    return prop


def _read_write(device: int):
    d = _driver()
    desc = d.CUmemAccessDesc()
    desc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    desc.location.id = device
    desc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return desc


def _handle_type(kind: str):
    return getattr(_driver().CUmemAllocationHandleType, _kind(kind)[0])


def _attribute(kind: str):
    return getattr(_driver().CUdevice_attribute, _kind(kind)[1])


def _kind(kind: str) -> tuple[str, str]:
    try:
        return KINDS[kind]
    except KeyError:
        raise ValueError(f"unknown VMM handle kind {kind!r}; choose one of {tuple(KINDS)}") from None


_initialized = False


def _driver():
    """cuda.bindings' driver module, initialized (cuInit) on first use."""
    global _initialized
    try:
        from cuda.bindings import driver
    except ImportError as e:  # pragma: no cover - GPU machines have it
        raise IrisError("the GPU heap needs the `cuda-bindings` package (pip install cuda-bindings)") from e
    if not _initialized:
        _call(driver.cuInit(0), "cuInit")
        _initialized = True
    return driver


def _call(result, what: str, hint: str = ""):
    """The value(s) of a driver call's result; IrisError naming the call and the error otherwise."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        from cuda.bindings import driver

        name = driver.cuGetErrorName(err)[1]
        text = driver.cuGetErrorString(err)[1]
        detail = f"{name.decode()} ({text.decode()})" if name and text else str(err)
        raise IrisError(f"{what} failed: {detail}{hint}")
    return values[0] if len(values) == 1 else values
