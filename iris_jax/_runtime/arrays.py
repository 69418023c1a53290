"""Arrays on the symmetric heap: ordinary jax.Arrays whose device buffers are heap memory.

Every shard of a heap array sits at the same heap offset on its device, so a kernel can
reach a peer's shard by translating its own pointer. Heap memory returns to the heap
when the array (all of its shards) is garbage-collected. A constructor fills only the calling
process's shards: with one process per rank, call `iris_jax.barrier()` before kernels write into
peers' copies (docs/concepts.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Sharding, SingleDeviceSharding

from iris_core.errors import NotOnHeapError
from iris_jax import _runtime as runtime_lib


class _Allocation:
    """Owns one heap offset; every shard's buffer keeps it alive."""

    def __init__(self, heap, offset: int):
        self.offset = offset
        heap.free_when_collected(self, offset)


def _sharding_for(sharding: Sharding | None, device: jax.Device | None) -> Sharding:
    if sharding is not None and device is not None:
        raise ValueError("pass either sharding= or device=, not both")
    if sharding is not None:
        return sharding
    return SingleDeviceSharding(device if device is not None else runtime_lib.runtime().devices[0])


def _computed_alike(values: jax.Array, sharding: Sharding) -> jax.Array:
    """`values`, which every process computed alike, with `sharding`: each process takes its own
    shards from its own copy (jax.device_put onto a multi-process sharding would first compare the
    copies across the processes, a collective per call)."""
    if sharding.is_fully_addressable:
        return jax.device_put(values, sharding)
    host = np.asarray(values)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def _checked_name(name) -> str | None:
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"name must be a non-empty str (what the simulator's race reports call the array) or "
                        f"None, got {name!r}")
    return name


def _place(values: jax.Array | None, shape, dtype, sharding: Sharding, name: str | None = None) -> jax.Array:
    """A heap array of `shape`/`dtype` with `sharding`, holding `values` (None: uninitialized),
    allocated under `name`."""
    name = _checked_name(name)
    rt = runtime_lib.runtime()
    dtype = np.dtype(dtype)
    shard_shape = sharding.shard_shape(tuple(shape))
    nbytes = int(np.prod(shard_shape, dtype=np.int64)) * dtype.itemsize
    devices = sorted(sharding.addressable_devices, key=lambda d: d.id)
    for d in devices:
        rt.rank_of(d)  # raises for devices without a heap, before anything is allocated
    if rt.fault_plan is not None:
        rt.fault_plan.before_allocation(nbytes)
    owner = _Allocation(rt.heap, rt.heap.allocate(nbytes, owner="arrays", name=name))
    source = {s.device: s.data for s in values.addressable_shards} if values is not None else {}
    buffers = [_wrap(rt, rt.rank_of(d), owner, shard_shape, dtype, d, source.get(d)) for d in devices]
    rt.backend.wait_for_devices(devices)
    return jax.make_array_from_single_device_arrays(tuple(shape), sharding, buffers)


def _wrap(rt, rank, owner, shape, dtype, device, value):
    """One shard's buffer, placed by the backend, checked to be the heap memory itself."""
    array = rt.backend.heap_array(rt.heap, rank, owner, shape, dtype, device, value)
    if array.size and array.unsafe_buffer_pointer() != rt.heap.address(rank, owner.offset):
        raise RuntimeError(f"heap placement was not zero-copy on {device} (internal error)")
    return array


# -- constructors ------------------------------------------------------------------------
def empty(shape, dtype=jnp.float32, *, sharding: Sharding | None = None, device=None,
          name: str | None = None) -> jax.Array:
    """An uninitialized heap array (contents are whatever the heap held).

    Args:
      shape: the global shape.
      dtype: the element type (default float32).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return _place(None, shape, dtype, _sharding_for(sharding, device), name)


def full(shape, fill_value, dtype=None, *, sharding: Sharding | None = None, device=None,
         name: str | None = None) -> jax.Array:
    """A heap array filled with `fill_value` (like `jnp.full`).

    Args:
      shape: the global shape.
      fill_value: the value of every element.
      dtype: the element type (default: `fill_value`'s).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    dtype = dtype or jnp.result_type(fill_value)
    s = _sharding_for(sharding, device)
    return _place(jnp.full(shape, fill_value, dtype, device=s), shape, dtype, s, name)


def zeros(shape, dtype=jnp.float32, *, sharding=None, device=None, name=None) -> jax.Array:
    """A heap array of zeros (like `jnp.zeros`).

    Args:
      shape: the global shape.
      dtype: the element type (default float32).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return full(shape, 0, dtype, sharding=sharding, device=device, name=name)


def ones(shape, dtype=jnp.float32, *, sharding=None, device=None, name=None) -> jax.Array:
    """A heap array of ones (like `jnp.ones`).

    Args:
      shape: the global shape.
      dtype: the element type (default float32).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return full(shape, 1, dtype, sharding=sharding, device=device, name=name)


def arange(start, stop=None, step=1, dtype=None, *, sharding=None, device=None, name=None) -> jax.Array:
    """Evenly spaced values on the heap (like `jnp.arange`).

    Args:
      start: the first value (the end, when `stop` is None).
      stop: the end (excluded).
      step: the spacing.
      dtype: the element type (default: inferred, as by `jnp.arange`).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    s = _sharding_for(sharding, device)
    return to_heap(_computed_alike(jnp.arange(start, stop, step, dtype=dtype), s), sharding=s, name=name)


def rand(key, shape, dtype=jnp.float32, *, sharding=None, device=None, name=None) -> jax.Array:
    """Uniform [0, 1) samples from `key`, on the heap.

    Args:
      key: a `jax.random` key.
      shape: the global shape.
      dtype: the element type (default float32).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    s = _sharding_for(sharding, device)
    return to_heap(_computed_alike(jax.random.uniform(key, shape, dtype), s), sharding=s, name=name)


def randn(key, shape, dtype=jnp.float32, *, sharding=None, device=None, name=None) -> jax.Array:
    """Standard normal samples from `key`, on the heap.

    Args:
      key: a `jax.random` key.
      shape: the global shape.
      dtype: the element type (default float32).
      sharding: how the array is laid out over the runtime's devices (each shard on its
        device's heap); default: `device`'s, or the first device of the runtime.
      device: one device, instead of `sharding`.
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` whose every shard lies at one common offset of its device's heap.

    Raises:
      ValueError: both `sharding` and `device` were given.
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    s = _sharding_for(sharding, device)
    return to_heap(_computed_alike(jax.random.normal(key, shape, dtype), s), sharding=s, name=name)


def empty_like(x, dtype=None, *, sharding=None, name=None) -> jax.Array:
    """An uninitialized heap array like `x`.

    Args:
      x: the array whose shape, dtype and sharding the result takes.
      dtype: the result's dtype (default: `x`'s).
      sharding: the result's sharding (default: `x`'s).
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` on the heap.

    Raises:
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return empty(x.shape, dtype or x.dtype, sharding=sharding or x.sharding, name=name)


def zeros_like(x, dtype=None, *, sharding=None, name=None) -> jax.Array:
    """A heap array of zeros like `x`.

    Args:
      x: the array whose shape, dtype and sharding the result takes.
      dtype: the result's dtype (default: `x`'s).
      sharding: the result's sharding (default: `x`'s).
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` on the heap.

    Raises:
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return zeros(x.shape, dtype or x.dtype, sharding=sharding or x.sharding, name=name)


def ones_like(x, dtype=None, *, sharding=None, name=None) -> jax.Array:
    """A heap array of ones like `x`.

    Args:
      x: the array whose shape, dtype and sharding the result takes.
      dtype: the result's dtype (default: `x`'s).
      sharding: the result's sharding (default: `x`'s).
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` on the heap.

    Raises:
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return ones(x.shape, dtype or x.dtype, sharding=sharding or x.sharding, name=name)


def full_like(x, fill_value, dtype=None, *, sharding=None, name=None) -> jax.Array:
    """A heap array like `x` filled with `fill_value`.

    Args:
      x: the array whose shape, dtype and sharding the result takes.
      fill_value: the value of every element.
      dtype: the result's dtype (default: `x`'s).
      sharding: the result's sharding (default: `x`'s).
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` on the heap.

    Raises:
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    return full(x.shape, fill_value, dtype or x.dtype, sharding=sharding or x.sharding, name=name)


def to_heap(x, *, sharding: Sharding | None = None, name: str | None = None) -> jax.Array:
    """A copy of `x` on the heap, with `x`'s sharding (or `sharding`).

    Args:
      x: an array (or anything `jnp.asarray` takes).
      sharding: the copy's sharding (default: `x`'s).
      name: what the simulator's race reports call the array (default: its heap offset).

    Returns:
      A `jax.Array` on the heap with `x`'s values.

    Raises:
      TypeError: `name` is not a str.
      HeapExhaustedError: the heap has no room for it.
    """
    x = jnp.asarray(x)
    sharding = sharding or x.sharding
    x = jax.device_put(x, sharding)
    return _place(x, x.shape, x.dtype, sharding, name)


# -- queries ------------------------------------------------------------------------------
def heap_offset(x: jax.Array) -> int | None:
    """The common heap offset of every shard of `x`, or None if `x` is not symmetric.

    Args:
      x: any value.

    Returns:
      The byte offset into every rank's heap, or None (not a heap array, or no runtime).
    """
    if not runtime_lib.is_initialized() or not isinstance(x, jax.Array):
        return None
    rt = runtime_lib.runtime()
    offsets = set()
    for shard in x.addressable_shards:
        try:
            rank = rt.rank_of(shard.device)
        except Exception:
            return None
        if shard.data.size == 0:
            continue
        where = rt.heap.locate(shard.data.unsafe_buffer_pointer())
        if where is None or where[0] != rank:
            return None
        offsets.add(where[1])
    return offsets.pop() if len(offsets) == 1 else None


def is_symmetric(x) -> bool:
    """True when every shard of `x` lies on its device's heap at one common offset.

    Args:
      x: any value.

    Returns:
      Whether a kernel may reach `x` on other ranks (a `symmetric=` operand).
    """
    return heap_offset(x) is not None


def require_symmetric(x, what: str = "array") -> None:
    """Raises NotOnHeapError unless `x` is a symmetric heap array."""
    if not is_symmetric(x):
        raise NotOnHeapError(
            f"{what} must be on the symmetric heap, got an ordinary array of shape {x.shape} "
            f"on {sorted(d.id for d in x.devices())}; create it with iris_jax.zeros/empty/... or "
            "copy it with iris_jax.to_heap(x)")
