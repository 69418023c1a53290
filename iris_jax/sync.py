"""Synchronization: `barrier()` on the host, `device_barrier(...)` inside jit.

The device barrier is one launch of iris_core.device.barrier's kernel over a small area of
every heap (its protocol is described there): bounded, it reports the rank that did not
arrive in its status. With tracing on (iris_jax.tracing) it records an EVENT_BARRIER span.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from iris_core import flag_protocol
from iris_core.device import barrier as device_barrier_lib
from iris_core.errors import PeerTimeoutError
from iris_core.heap.status import error_from_word
from iris_core.sim import races
from iris_jax import _runtime as runtime_lib
from iris_jax._runtime import faults
from iris_jax.calls.triton_call import triton_call


class _BarrierArea:
    def __init__(self, rt):
        self.offset = rt.allocate_shared(device_barrier_lib.area_bytes(rt.world_size),
                                         name="device_barrier's flags")


def device_barrier(*arrays, timeout_s: float = flag_protocol.DEFAULT_TIMEOUT_S):
    """Waits, on the devices, until every rank reached this point; returns `arrays` unchanged.

    Use inside `jax.jit(jax.shard_map(...))` between kernels. The barrier runs after the
    kernels that produced `arrays` (a data dependency). Later kernels run after it on the
    simulator (its kernel calls are chained in program order) and, on GPUs, in the stream's
    program order; XLA itself does not promise that order for independent operations, so
    to be certain, pass `status` into the later kernel as an (unused) argument.

    Args:
      *arrays: arrays whose producers the barrier waits for.
      timeout_s: how long to wait for a rank before giving up.

    Returns:
      `(status, *arrays)`: status is an int32 array holding -1. A rank that does not arrive
      within `timeout_s` (or that gave up on an earlier barrier) fails the program: reading its
      results raises PeerTimeoutError (PeerFailedError) naming that rank, and the group's later
      barriers fail at once until `shutdown()` and `init()`. With `fault_gate="off"` on GPUs the
      program completes instead and status holds the missing rank (`check_barrier` raises it).

    Raises:
      CrossDomainError: the ranks span several domains (the kernel signals every rank's heap).
    """
    rt = runtime_lib.runtime()
    rt.check_one_domain(range(rt.world_size), "iris_jax.device_barrier (it signals every rank; use iris_jax.barrier() "
                        "on the host)")
    area = rt.service("device_barrier", _BarrierArea)
    # `after` becomes available only once every input is computed: the barrier runs after them
    after, *arrays = jax.lax.optimization_barrier((jnp.zeros((1,), jnp.int32), *arrays))
    status = triton_call(after, kernel=device_barrier_lib.barrier_kernel,
                         out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(1,),
                         **device_barrier_lib.launch_constants(area_offset=area.offset,
                                                               timeout_ns=flag_protocol.timeout_ns(timeout_s),
                                                               world=rt.world_size, tracing=rt.tracing.enabled))
    return jax.lax.optimization_barrier((status, *arrays))


def check_barrier(status) -> None:
    """Raises PeerTimeoutError if a device barrier's status names a missing rank (as this
    process's ranks saw it).

    Args:
      status: the first result of `device_barrier`.

    Raises:
      PeerTimeoutError: a rank did not arrive (the message names it).
    """
    # this process's shards: with one process per rank the status spans devices it cannot read
    shards = getattr(status, "addressable_shards", None)
    blocks = [s.data for s in shards] if shards else [status]
    values = np.concatenate([np.asarray(b).reshape(-1) for b in blocks])
    missing = sorted({int(v) for v in values if v >= 0})
    if missing:
        raise PeerTimeoutError(f"device barrier timed out waiting for rank(s) {missing}")


def barrier() -> None:
    """Host barrier: waits for this process's device work, then for every process.

    Then raises the faults (`check_faults`) and refused accesses (`check_heap_errors`) of this
    process's kernels.

    Raises:
      PeerTimeoutError, PeerFailedError, RankMismatchError: a kernel of this process gave up.
      NotOnHeapError: a kernel of this process accessed memory outside a heap.
    """
    rt = runtime_lib.runtime()
    try:
        rt.backend.wait_for_devices(rt.devices)
        rt.backend.wait_for_executions()
    except Exception as e:  # a trapped kernel's CUDA error: the fault it stands for, if recorded
        rt.raise_faults(cause=e)
        raise
    rt.raise_faults()
    rt.sync_processes()
    if rt.detect_races and rt.sim_session is not None:  # every rank's launches are over: they precede what follows
        races.host_barrier(rt.sim_session, rt.world_size, rt.heap_size)
    check_heap_errors()


def check_faults() -> None:
    """Raises the oldest fault an iris kernel of this process recorded since the last check.

    Does not wait for the devices: see `block_until_ready` and `barrier`
    (iris_jax._runtime.faults).

    Raises:
      PeerTimeoutError, PeerFailedError, RankMismatchError: naming the op, the ranks, the group
        and the flag epoch; the other faults recorded follow in its message.
    """
    if runtime_lib.is_initialized():
        runtime_lib.runtime().raise_faults()


def block_until_ready(x):
    """`jax.block_until_ready(x)`, then `check_faults()`.

    Use it instead of `jax.block_until_ready` where a result must be known valid: it raises if
    an iris kernel of this process gave up (the one that made `x`, or another), so that a result
    of a failed call is not taken for a valid one.

    Args:
      x: an array or a pytree of arrays.

    Returns:
      `x`, once it is computed.

    Raises:
      PeerTimeoutError, PeerFailedError, RankMismatchError: a kernel of this process gave up
        (chained to JAX's error where the computation itself failed).
      NotOnHeapError: the heap guard refused an access of the computation (on GPUs the fault
        gate failed it; chained to JAX's error).
    """
    try:
        out = jax.block_until_ready(x)
    except Exception as e:
        _raise_named(e)
        raise
    check_faults()
    return out


def _raise_named(error: Exception) -> None:
    """The fault that `error` (a failed execution, a trapped kernel's CUDA error) stands for: a
    recorded one, or the iris error whose words the failed execution carries; else returns."""
    if runtime_lib.is_initialized():
        runtime_lib.runtime().raise_faults(cause=error)
    named = faults.carried(error)
    if named is not None:
        raise named from error


def guarded_call(fn, *args, **kwargs):
    """fn(*args, **kwargs) between fault checks: a fault recorded before raises before the call
    runs, and an error of the call (the CUDA error of a trapped kernel) is raised as the fault
    it stands for when one was recorded (chained)."""
    check_faults()
    try:
        return fn(*args, **kwargs)
    except Exception as e:
        _raise_named(e)
        raise


def check_heap_errors() -> None:
    """Raises NotOnHeapError if an iris kernel of this process refused an access since the last check.

    A refused access is a pointer outside the caller's heap or a rank outside the world,
    masked off by the heap guard (nothing was accessed). Waits for the devices' work first;
    clears the reports. On GPUs the guard reports here, after the call (the simulator raises
    at once, in the call).

    Raises:
      NotOnHeapError: naming the op, the ranks and the offset (one error for several).
    """
    rt = runtime_lib.runtime()
    rt.backend.wait_for_dispatch()  # take_errors then waits for the launched kernels
    rt.raise_faults()
    heap = rt.heap
    errors = [error_from_word(word, rank, heap.mapped_size, upper=heap.heap_size) for rank, word in heap.take_errors()]
    if errors:
        raise errors[0] if len(errors) == 1 else type(errors[0])("\n".join(str(e) for e in errors))
