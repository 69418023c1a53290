"""The simulator's access checks: refused accesses raise at once, and a checked mode.

Every guarded RMA op (iris_core.device.rma) calls `check_access` under the interpreter
before it touches memory. A lane that the heap guard refused (a pointer outside the
caller's heap, a rank outside [0, world_size)) raises NotOnHeapError naming the kernel,
the op, the ranks and the offset, where a GPU would mask the lane off and report it after
the call.

Checked mode (IRIS_SIM_CHECKED=1; on in the test suite) also holds every access to the
live allocation it falls in: each accessed lane must lie inside one allocation of the
heap that is live at the time (made by the heap's allocator, not freed; its requested
size, not the allocator's rounding), and all lanes of one access in the same one, so a
tile that runs past its array into the next one, or into freed memory, is caught. The
pointer's provenance is not tracked: an access that lands wholly inside another live
allocation passes.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from iris_core.errors import IrisError, NotOnHeapError
from iris_core.heap import status
from iris_core.heap.shared_memory import heap_at

CHECKED = os.environ.get("IRIS_SIM_CHECKED", "0") == "1"

_current = threading.local()


class running_kernel:
    """Names the kernel that runs in this thread (for the errors' messages)."""

    def __init__(self, name: str):
        self.name = name

    def __enter__(self):
        self.previous = getattr(_current, "kernel", None)
        _current.kernel = self.name

    def __exit__(self, *exc):
        _current.kernel = self.previous


def kernel_name() -> str | None:
    return getattr(_current, "kernel", None)


def _values(x) -> np.ndarray:
    """An interpreter tensor (or Python scalar) as a flat numpy array."""
    handle = getattr(x, "handle", None)
    data = handle.data if handle is not None else getattr(x, "value", x)
    return np.asarray(data).reshape(-1)


def check_access(bad, offset, rank, rank_ok, from_base, from_rank, heap_size, access, op, element) -> None:
    """Raises NotOnHeapError when a lane is refused (or, in checked mode, outside its
    allocation); returns when the access may go ahead."""
    op_name = status.OPS[int(_values(op)[0])]
    me = int(_values(from_rank)[0])
    size = int(_values(heap_size)[0])
    bad = _values(bad).astype(bool)
    if bad.any():
        lane = int(np.argmax(np.broadcast_to(bad, np.broadcast_shapes(bad.shape, _values(offset).shape))))
        ranks = np.broadcast_to(_values(rank), bad.shape if bad.size > 1 else _values(rank).shape)
        target = int(ranks[min(lane, ranks.size - 1)])
        offsets = _values(offset).astype(np.uint64).view(np.int64)
        where = int(offsets[min(lane, offsets.size - 1)])
        info = {"op": op_name, "rank": target, "offset": where, "rank_error": not bool(_values(rank_ok).all())}
        heap = heap_at(int(_values(from_base)[0]))
        raise NotOnHeapError(status.describe(info, me, size, kernel_name(), heap.heap_size if heap else None))
    if CHECKED:
        _check_allocation(offset, access, from_base, me, _values(rank), op_name, int(_values(element)[0]))


def check_world_size(stored, world_size) -> None:
    """Raises IrisError when a kernel decodes its context (Context.initialize) for another world
    size than the runtime's, before any heap base is read from the wrong word."""
    runtime_size = int(_values(stored)[0])
    given = _constant(world_size)
    if given != runtime_size:
        raise IrisError(
            f"kernel {kernel_name() or '?'}: Context.initialize(context_ptr, {given}) in a world of {runtime_size} "
            f"ranks. The context holds every rank's heap base; pass the runtime's world size "
            f"(iris_jax.runtime().world_size), whatever the mesh of the call, and give a ring over a smaller "
            "mesh its size as another constexpr. Nothing was accessed.")


def _world_size_clear_for_all(stored, world_size) -> bool:
    """check_world_size for several ranks at once (iris_core.sim.batched): True when each passes."""
    return bool((_values(stored) == _constant(world_size)).all())


def _constant(value) -> int:
    """A constexpr argument (or a plain int) as an int."""
    return int(getattr(value, "value", value))


check_world_size.clear_for_all = _world_size_clear_for_all


def _access_clear_for_all(bad, *rest) -> bool:
    """check_access for several ranks' lanes at once (iris_core.sim.batched): True when it would
    pass for each of them (no lane refused, and checked mode off)."""
    return not CHECKED and not _values(bad).any()


check_access.clear_for_all = _access_clear_for_all


def _check_allocation(offset, access, from_base, me, ranks, op_name, element) -> None:
    heap = heap_at(int(_values(from_base)[0]))
    if heap is None:
        return  # a context made up by hand: the bounds were checked, no allocations to check against
    starts, sizes = heap.allocation_table()
    if starts is None:
        return  # more allocations than the table holds
    offsets = _values(offset).astype(np.uint64).view(np.int64)
    lanes = np.broadcast_to(_values(access).astype(bool), offsets.shape) if access is not None else None
    if lanes is not None:
        offsets = offsets[lanes]
    if offsets.size == 0:
        return
    index = np.searchsorted(starts, offsets, side="right") - 1
    if starts.size:
        inside = (index >= 0) & (offsets + element <= starts[np.maximum(index, 0)] + sizes[np.maximum(index, 0)])
    else:  # nothing allocated
        inside = np.zeros(offsets.shape, bool)
    target = int(ranks[0]) if ranks.size == 1 else None
    who = f"kernel {kernel_name() or '?'} on rank {me}: {op_name}"
    to = f" to rank {target}" if target is not None else ""
    if not inside.all():
        lane = int(np.argmax(~inside))
        where = int(offsets[lane])
        i = int(index[lane])
        near = (f"; the nearest allocation below is [{int(starts[i])}, {int(starts[i] + sizes[i])})" if i >= 0
                else "")
        raise NotOnHeapError(
            f"checked mode: {who}{to} at heap offset {where} ({element}-byte element) is not inside a live "
            f"allocation{near}. The kernel reads or writes past an array (a missing or wrong mask?) or "
            "into memory that was freed.")
    if (index != index[0]).any():
        lane = int(np.argmax(index != index[0]))
        a, b = int(index[0]), int(index[lane])
        raise NotOnHeapError(
            f"checked mode: {who}{to} spans two allocations: offset {int(offsets[0])} in "
            f"[{int(starts[a])}, {int(starts[a] + sizes[a])}) and offset {int(offsets[lane])} in "
            f"[{int(starts[b])}, {int(starts[b] + sizes[b])}). One access must stay inside one array.")
