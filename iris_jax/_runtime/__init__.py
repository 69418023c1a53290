"""The iris runtime: one symmetric heap per participating device, in every execution model.

`init()` picks the model from what it finds, without the user choosing (iris_jax._runtime.backends
has one class per model, which sets up its heaps and ranks):

* launched by `python -m iris_core.sim`: a simulated rank; kernels run in this process
  under Triton's interpreter, heaps in shared memory; a script that joined the ranks with
  `jax.distributed.initialize()` sees every rank's device, as one process per GPU does;
* several JAX processes (`jax.distributed.initialize`) on GPUs: one heap per GPU, peers'
  heaps mapped through CUDA IPC or CUDA's virtual memory API (`heap_allocator`), handles
  exchanged through JAX's key-value store (file descriptors over Unix sockets);
* one process, GPUs: one heap per GPU, peer access between all pairs;
* one process, CPU devices only: the CPU simulator, one rank per CPU device (use
  XLA_FLAGS=--xla_force_host_platform_device_count=N for N ranks); each device's kernels
  run in a worker process of its rank.

Domains: the ranks whose heaps can map each other (one NVLink domain). One process: all its
devices; one process per GPU: the processes of one host; `init(domain_size=n)` (environment
IRIS_DOMAIN_SIZE) instead makes ranks r // n a domain, in every model (the simulator's way to
split its ranks). No kernel group spans two domains (operands.group_table checks);
collectives over axes that do are hierarchical (iris_jax.collectives.domains).
"""

from __future__ import annotations

import atexit
import itertools
import threading
from collections.abc import Sequence

import jax

from iris_core.errors import IrisError
from iris_core.sim import host_collectives, races
from iris_jax._runtime.heaps import Runtime, check_heap_allocator, stale_program_error

_runtime: Runtime | None = None
# part of jit's cache key: programs hold their runtime's heap bases as constants, so every
# function retraces for a new runtime instead of running against freed heaps
_generation = jax.make_user_context(default_value=0)
_generations = itertools.count(1)
_runtime_lock = threading.Lock()


def init(heap_size: int | None = None, devices: Sequence[jax.Device] | None = None,
         domain_size: int | None = None, heap_allocator: str | None = None, on_fault: str | None = None,
         fault_gate: str | None = None, detect_races: bool | str | None = None,
         sim_collectives: str | None = None) -> Runtime:
    """Sets up one symmetric heap per participating device and returns the runtime.

    Args:
      heap_size: the most bytes each device's heap may hold (environment IRIS_HEAP_SIZE); heaps
        map a part at init and grow as allocations need, up to it. Default: the host's memory
        divided by the ranks on the simulator (64 MiB mapped at start), the device's memory for
        GPU VMM heaps (1 GiB mapped at start), 1 GiB for cudaMalloc heaps (which do not grow).
        See docs/settings.md.
      devices: the devices that get a heap (default: every local device).
      domain_size: ranks r // domain_size form a domain (default: environment IRIS_DOMAIN_SIZE,
        else one domain per process or, with one process per GPU, per host).
      heap_allocator: how GPU heaps are allocated and shared (default: environment
        IRIS_HEAP_ALLOCATOR, else "auto"): "malloc" (cudaMalloc + CUDA IPC), "vmm" (CUDA
        virtual memory, POSIX-fd handles within a host), "fabric" (fabric handles, multi-node
        NVLink) or "auto" (see iris_core.heap.cuda). Every process must choose the same; the
        simulator ignores it.
      on_fault: what a GPU kernel does after it recorded why it gives up (iris_jax._runtime.faults;
        default: environment IRIS_ON_FAULT, else "exit"): "exit" ends the kernel and keeps the
        CUDA context (shutdown() and init() then work in the same process), "trap" fails the
        launch and the context with it. The simulator raises in the kernel either way.
      fault_gate: on GPUs, which of the host steps that fail a program whose iris kernel gave up
        wait for the kernels (iris_jax.calls.fault_gate; default: environment IRIS_FAULT_GATE,
        else "step"): "step" the last of each execution, "call" every one, "off" none is lowered
        (a failed call's outputs then read as numbers until an iris entry point raises). Programs
        are lowered with the setting of their first trace.
      detect_races: the simulator checks every heap access of every rank for races between ranks
        (docs/device-api.md, "Finding races"; default: environment IRIS_DETECT_RACES, else off):
        True or "raise" raises RaceError naming both accesses after the kernel that made the
        second, "warn" warns RaceWarning instead. A no-op on GPUs.
      sim_collectives: how the simulator runs iris's collectives when every rank is in this
        process (default: environment IRIS_SIM_COLLECTIVES, else "host"): "host" meets the ranks
        in this process and combines with numpy, as XLA:CPU's collectives do (the kernels'
        values and faults, bit for bit; iris_core.sim.host_collectives), "kernels" runs the
        collective kernels under Triton's interpreter, as GPUs run them. With detect_races or
        device tracing on, and for the ring, atomic and spinlock all-reduces, the kernels run
        whatever it says. A no-op on GPUs and with one process per rank.

    Raises:
      IrisError: when a runtime with different settings already exists (call shutdown()).
    """
    global _runtime
    if heap_allocator is not None:
        check_heap_allocator(heap_allocator)
    with _runtime_lock:
        if _runtime is not None:
            if heap_size is not None and heap_size != _runtime.heap_size:
                raise IrisError(
                    f"iris is already initialized with heap_size={_runtime.heap_size}; "
                    f"init(heap_size={heap_size}) conflicts. Call iris_jax.shutdown() first.")
            if devices is not None and [d.id for d in devices] != [d.id for d in _runtime.devices]:
                raise IrisError(
                    f"iris is already initialized on devices {_runtime.devices}; init(devices="
                    f"{list(devices)}) conflicts. Call iris_jax.shutdown() first.")
            if domain_size is not None and domain_size != _runtime.domain_size:
                raise IrisError(
                    f"iris is already initialized with domain_size={_runtime.domain_size}; init(domain_size="
                    f"{domain_size}) conflicts. Call iris_jax.shutdown() first.")
            if on_fault is not None and on_fault != _runtime.on_fault:
                raise IrisError(f"iris is already initialized with on_fault={_runtime.on_fault!r}; init(on_fault="
                                f"{on_fault!r}) conflicts. Call iris_jax.shutdown() first.")
            if fault_gate is not None and fault_gate != _runtime.fault_gate:
                raise IrisError(f"iris is already initialized with fault_gate={_runtime.fault_gate!r}; init("
                                f"fault_gate={fault_gate!r}) conflicts. Call iris_jax.shutdown() first.")
            if detect_races is not None and races.mode_of(detect_races) != _runtime.detect_races:
                raise IrisError(f"iris is already initialized with detect_races={_runtime.detect_races!r}; init("
                                f"detect_races={detect_races!r}) conflicts. Call iris_jax.shutdown() first.")
            if sim_collectives is not None and host_collectives.mode_of(sim_collectives) != _runtime.sim_collectives:
                raise IrisError(f"iris is already initialized with sim_collectives={_runtime.sim_collectives!r}; "
                                f"init(sim_collectives={sim_collectives!r}) conflicts. Call iris_jax.shutdown() first.")
            if heap_allocator not in (None, "auto", _runtime.heap_allocator) and _runtime.heap_allocator:
                raise IrisError(
                    f"iris is already initialized with heap_allocator={_runtime.heap_allocator!r}; init("
                    f"heap_allocator={heap_allocator!r}) conflicts. Call iris_jax.shutdown() first.")
            return _runtime
        _runtime = Runtime(heap_size, devices, domain_size, heap_allocator, on_fault, fault_gate, detect_races,
                           sim_collectives)
        _generation.set_global(next(_generations))
        return _runtime


def runtime() -> Runtime:
    """The current runtime, created with default settings on first use.

    Returns:
      The `Runtime` (`init()`'s, or a new one over every local device).
    """
    return _runtime if _runtime is not None else init()


def memory_stats(device: jax.Device | None = None) -> dict[str, int]:
    """The symmetric heap's use on `device`'s rank, in the spirit of `jax.Device.memory_stats()`.

    Every rank's heap holds the same allocations at the same offsets, so the numbers are the
    same on every rank of the runtime.

    Args:
      device: a device of the runtime (None: this process's first).

    Returns:
      Bytes (and counts): `bytes_limit` (the heap's upper bound: init(heap_size=...)),
      `bytes_mapped` (memory the heap holds now; it grows up to the limit as allocations need),
      `bytes_in_use`, `peak_bytes_in_use`, `largest_free_block_bytes` (inside the mapped
      bytes), `num_allocs`; of the bytes in use, `arrays_bytes_in_use` (heap arrays),
      `workspaces_bytes_in_use` (the collectives' and fused ops' workspaces,
      `num_workspaces` of them) and `runtime_bytes_in_use` (barriers, tracing, the status
      line); `num_growths`: how often the heap grew.
    """
    rt = runtime()
    return rt.memory_stats(None if device is None else rt.rank_of(device))


def is_initialized() -> bool:
    """Whether a runtime exists (`init()` ran, or a call created one, and no `shutdown()` since)."""
    return _runtime is not None


def current() -> Runtime | None:
    """The current runtime, or None (never creates one: for code on XLA's threads)."""
    return _runtime


@atexit.register
def shutdown() -> None:
    """Releases every heap and worker mapping; a later call re-initializes.

    Waits for the kernels still running first.
    """
    global _runtime
    if _runtime is not None:
        try:  # kernels still running (results nobody waited for) must finish before their heaps go
            jax.effects_barrier()
        except Exception:  # noqa: BLE001 - a failed call (its caller saw the error), or JAX torn down at exit
            _forget_failed_calls()
    with _runtime_lock:
        if _runtime is not None:
            rt, _runtime = _runtime, None
            rt.close()


def _forget_failed_calls() -> None:
    """Drops JAX's record of failed calls of this thread, which effects_barrier would raise
    again until each device ran another effectful program: they belonged to the old runtime."""
    try:
        from jax._src import dispatch

        dispatch.runtime_tokens.clear()
    except Exception:  # noqa: BLE001 - JAX internals moved or torn down: nothing to forget
        pass


__all__ = ["Runtime", "current", "init", "is_initialized", "memory_stats", "runtime", "shutdown", "stale_program_error"]
