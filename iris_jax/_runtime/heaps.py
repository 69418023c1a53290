"""Runtime: the heaps, ranks, domains, contexts and services of the participating devices."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator, Sequence

import jax
import numpy as np

from iris_core.errors import CrossDomainError, IrisError, RankMismatchError
from iris_core.heap.allocator import format_bytes
from iris_core.heap.context_layout import encode_context
from iris_core.heap.rendezvous import store_barrier
from iris_core.platform import GPU
from iris_core.sim import host_collectives, races
from iris_jax._runtime import backends, faults
from iris_jax._runtime.backends import RENDEZVOUS_TIMEOUT_S
from iris_jax._runtime.injected import FaultPlan
from iris_jax._runtime.tracer import RuntimeTracer

# ranks r // n form a domain (environment IRIS_DOMAIN_SIZE; unset: by process and host, see Runtime)
DEFAULT_DOMAIN_SIZE = int(os.environ["IRIS_DOMAIN_SIZE"]) if os.environ.get("IRIS_DOMAIN_SIZE") else None
# how GPU heaps are allocated and shared: auto | malloc | vmm | fabric (iris_core.heap.cuda; IRIS_HEAP_ALLOCATOR)
DEFAULT_HEAP_ALLOCATOR = os.environ.get("IRIS_HEAP_ALLOCATOR") or "auto"


class Runtime:
    """Heaps, ranks and contexts of the participating devices.

    Attributes:
      backend: what depends on the execution model (iris_jax._runtime.backends).
      mode: the model's name (`backend.mode`), for display.
      devices: the JAX devices of this process that own a heap, in rank order.
      world_size: ranks in total (all processes).
      heap: the SymmetricHeap (bases of every rank as mapped in this process).
      domains: the ranks of each domain (ranks that can map each other's heaps), in order.
      domain_size: the explicit setting the domains came from (None: the default).
      heap_allocator: GPUs: how the heaps were allocated ("malloc", "vmm" or "fabric", as
        chosen from the setting; iris_core.heap.cuda); the simulator: None.
    """

    def __init__(self, heap_size: int | None = None, devices: Sequence[jax.Device] | None = None,
                 domain_size: int | None = None, heap_allocator: str | None = None, on_fault: str | None = None,
                 fault_gate: str | None = None, detect_races: bool | str | None = None,
                 sim_collectives: str | None = None):
        # the simulator's race detector (iris_core.sim.races): "raise", "warn" or None; GPUs ignore it
        self.detect_races = races.env_mode() if detect_races is None else races.mode_of(detect_races)
        self.sim_collectives = host_collectives.mode_of(sim_collectives)  # the simulator's: "host" or "kernels"
        self.on_fault = on_fault or faults.DEFAULT_ON_FAULT
        faults.check_mode(self.on_fault)
        self.fault_gate = fault_gate or faults.DEFAULT_FAULT_GATE
        faults.check_gate(self.fault_gate)
        self.domain_size = domain_size if domain_size is not None else DEFAULT_DOMAIN_SIZE
        allocator = heap_allocator or DEFAULT_HEAP_ALLOCATOR
        check_heap_allocator(allocator)
        self.backend = backends.select(devices)
        started = self.backend.start(heap_size, devices, self.domain_size, allocator)
        self.world_size, self.domains, self.heap = started.world_size, started.domains, started.heap
        self.store, self._session = started.store, started.session
        self.call_table = started.call_table  # the simulator's check that a group's ranks make the same calls
        self.sim_world = started.sim_world
        self._device_ranks = started.device_ranks
        self._bases_seen_by = started.bases_seen_by
        self._pages_seen_by = started.pages_seen_by
        self.heap_size = self.heap.heap_size
        self.heap_allocator = getattr(self.heap, "heap_allocator", None)
        self.tracing = RuntimeTracer(self)  # device event tracing (iris_jax.tracing)
        self._rank_of = {d.id: r for d, r in self._device_ranks.items()}
        if started.members is not None:  # every process's device, for the context tables of global meshes
            self._rank_of = {d.id: r for r, d in enumerate(started.members)}
        self._lock = threading.Lock()
        self._services: dict[str, object] = {}
        self.fault_plan: FaultPlan | None = None  # faults injected on purpose (iris_jax._runtime.injected)
        self._syncs = itertools.count(1)
        self._calls = threading.Condition()  # host-executed kernel calls in flight (the simulator)
        self._running = 0
        self.closed = False
        self._faults = self.service("faults", lambda rt: faults.FaultWatch(rt, self.on_fault))  # the watchdog
        self._growths = itertools.count(1)
        if self.backend.process_per_rank:
            self.heap.agree = self._agree_on_growth  # one rank's failed growth fails it on every rank
        if self.detect_races and self.sim_session is not None:
            self.heap.on_allocate = self._forget_races

    # -- ranks and contexts ------------------------------------------------------
    @property
    def mode(self) -> str:
        """The execution model's name: "gpu-single-process", "gpu-multi-process", "sim-workers"
        or "sim-launched"."""
        return self.backend.mode

    @property
    def devices(self) -> list[jax.Device]:
        """The JAX devices of this process that own a heap, in rank order."""
        return list(self._device_ranks)

    def domain_of(self, rank: int) -> int:
        """The index in `domains` of rank's domain.

        Args:
          rank: a rank of the world.

        Returns:
          The domain's index.

        Raises:
          RankMismatchError: the rank is not in this runtime's world.
        """
        for i, members in enumerate(self.domains):
            if rank in members:
                return i
        raise RankMismatchError(f"rank {rank} is not in this runtime's world of {self.world_size} ranks")

    def check_one_domain(self, ranks: Sequence[int], what: str) -> None:
        """Raises CrossDomainError unless `ranks` share a domain (before any kernel over them runs).

        Args:
          ranks: the members of a kernel's group.
          what: the call, as the error names it.

        Raises:
          CrossDomainError: two of the ranks lie in different domains.
        """
        found = {r: self.domain_of(r) for r in ranks}
        if len(set(found.values())) > 1:
            a = ranks[0]
            b = next(r for r in ranks if found[r] != found[a])
            raise CrossDomainError(
                f"{what} spans domains: ranks {a} and {b} lie in domains {found[a]} and {found[b]} "
                f"(domains {list(map(list, self.domains))}), and an iris kernel reaches only the heaps of its "
                "own domain. Run it over mesh axes inside one domain, use the iris collectives (which compose "
                "iris inside domains with XLA across them), or jax.lax")

    def rank_of(self, device: jax.Device) -> int:
        """The rank of `device`.

        Args:
          device: a JAX device of the runtime (of any process).

        Returns:
          Its rank.

        Raises:
          RankMismatchError: the device has no iris heap.
        """
        try:
            return self._rank_of[device.id]
        except KeyError:
            raise RankMismatchError(
                f"device {device} has no iris heap; the runtime covers {self.devices}. Run on those "
                "devices or call iris_jax.init(devices=...) with the devices you use") from None

    def context(self, rank: int) -> np.ndarray:
        """Rank's context array, with the heap bases as seen by rank's own process.

        Args:
          rank: a rank of the world.

        Returns:
          The int32-packed 64-bit words a kernel receives first (iris_core.heap.context_layout).
        """
        if self._bases_seen_by is not None:
            return encode_context(rank, self._bases_seen_by[rank], self.trace_words(), heap_size=self.heap.heap_size,
                                  fault_page=self._pages_seen_by[rank])
        return self.heap.context(rank, self.trace_words())

    def context_table(self, devices: Sequence[jax.Device]) -> np.ndarray:
        """One context row per device, in the given order (e.g. a mesh's flat order).

        Args:
          devices: devices of the runtime.

        Returns:
          A [len(devices), words] int32 array.
        """
        return np.stack([self.context(self.rank_of(d)) for d in devices])

    def trace_words(self) -> Sequence[int]:
        """The context's tracing words: () while tracing is off (see iris_jax.tracing)."""
        return self.tracing.words()

    def allocate_shared(self, nbytes: int, owner: str = "runtime", name: str | None = None) -> int:
        """A zeroed block at one offset on every heap, for state that the kernels of all ranks
        compare against (flags, epochs, counters); lives as long as the runtime.

        Every process must make the same calls in the same order (SPMD tracing does): with
        one process per rank, each zeroes its own heap and the call returns once all did, so
        no peer's early signal can be wiped by a late zeroing.

        Args:
          nbytes: the block's size.
          owner: what holds it, as memory_stats counts it.
          name: what the simulator's race reports call it (None: its offset).

        Returns:
          Its offset in every heap.

        Raises:
          HeapExhaustedError: the heap has no room for it.
        """
        offset = self.heap.allocate(nbytes, zero=True, owner=owner, name=name)
        self.sync_processes()
        return offset

    @property
    def sim_session(self) -> str | None:
        """The shared-memory session of the simulator's heaps (None on GPUs)."""
        return getattr(self.heap, "session", None) if self.backend.host_kernels is not None else None

    def sync_processes(self) -> None:
        """Host barrier between the processes of a multi-process run; no-op in one process."""
        if self.backend.process_per_rank:
            store_barrier(self.store, f"iris/{self._session}/sync/{next(self._syncs)}",
                          self.rank_of(self.devices[0]), self.world_size, RENDEZVOUS_TIMEOUT_S)

    def _forget_races(self, offset: int, nbytes: int) -> None:
        """A new heap block has no history for the race detector: cleared here, by its owner, before
        the block is returned, so before any kernel can be given it (docs/architecture.md)."""
        races.forget(self.sim_session, self.world_size, self.heap_size, self.heap.local_ranks, offset, nbytes)

    def _agree_on_growth(self, failure: str | None) -> list[str]:
        """Every process's failure to grow the heap (theirs and ours), through the store: the
        heap grows only where none failed, and before any kernel can address the new bytes."""
        key = f"iris/{self._session}/grow/{next(self._growths)}"
        rank = self.rank_of(self.devices[0])
        self.store.set(f"{key}/{rank}", (failure or "").encode())
        found = [self.store.get(f"{key}/{r}", RENDEZVOUS_TIMEOUT_S).decode() for r in range(self.world_size)]
        return [f for f in found if f]

    def memory_stats(self, rank: int | None = None) -> dict[str, int]:
        """The heap's use on `rank` (None: this process's first), as iris_jax.memory_stats gives it."""
        rank = self.rank_of(self.devices[0]) if rank is None else rank
        if not 0 <= rank < self.world_size:
            raise RankMismatchError(f"rank {rank} is not in this runtime's world of {self.world_size} ranks")
        heap = self.heap
        usage = heap.usage()
        return {
            "bytes_limit": heap.heap_size,
            "bytes_mapped": heap.mapped_size,
            "bytes_in_use": heap.used,
            "peak_bytes_in_use": heap.peak_used,
            "largest_free_block_bytes": heap.largest_free_block,
            "num_allocs": sum(count for _, count in usage.values()),
            "arrays_bytes_in_use": usage.get("arrays", (0, 0))[0],
            "workspaces_bytes_in_use": usage.get("workspaces", (0, 0))[0],
            "runtime_bytes_in_use": sum(used for owner, (used, _) in usage.items()
                                        if owner not in ("arrays", "workspaces")),
            "num_workspaces": usage.get("workspaces", (0, 0))[1],
            "num_growths": heap.growths,
        }

    def service(self, name: str, factory):
        """Per-runtime singleton (workspaces, barrier state), created on first use.

        Args:
          name: the service's name.
          factory: called with the runtime to create it.

        Returns:
          The service.
        """
        service = self._services.get(name)  # (created once: most calls need no lock)
        if service is not None:
            return service
        with self._lock:
            if name not in self._services:
                self._services[name] = factory(self)
            return self._services[name]

    def raise_faults(self, cause: BaseException | None = None) -> None:
        """Raises the faults this process's kernels recorded since the last call (iris_jax._runtime.faults),
        chained to `cause`."""
        faults.raise_first(self._faults.take(), cause)

    # -- lifetime -----------------------------------------------------------------
    @contextlib.contextmanager
    def running_call(self, what: str) -> Iterator[None]:
        """Brackets a kernel call that the host executes (the simulator's): `close` waits for
        it, so no heap or staging area goes away under a running kernel.

        Raises:
          IrisError: the runtime was shut down (a program compiled for it ran afterwards).
        """
        with self._calls:
            if self.closed:
                raise stale_program_error(what)
            self._running += 1
        try:
            yield
        finally:
            with self._calls:
                self._running -= 1
                self._calls.notify_all()

    def _wait_for_calls(self) -> None:
        """Waits for the calls in flight (results nobody waited for, peers of a failed call):
        they end within the simulator's timeout; past it, the workers are restarted."""
        patience = (self.sim_world.timeout_s if self.sim_world is not None else RENDEZVOUS_TIMEOUT_S) + 10
        deadline = time.monotonic() + patience
        with self._calls:
            while self._running and time.monotonic() < deadline:
                self._calls.wait(deadline - time.monotonic())
            stuck = self._running
        if stuck and self.sim_world is not None:
            self.sim_world.restart()  # a call still waiting on its rank's worker fails now
            with self._calls:
                self._calls.wait_for(lambda: not self._running, timeout=10)

    def close(self) -> None:
        """Waits for the calls in flight, then releases the services, the tracer and the heaps
        (`iris_jax.shutdown()` calls it)."""
        with self._calls:
            self.closed = True
        self._wait_for_calls()
        for service in self._services.values():
            close = getattr(service, "close", None)
            if close is not None:
                close()
        self._services.clear()
        self.tracing.close()
        self.heap.close()
        if self.detect_races and self.sim_session is not None and self.heap.local_ranks:
            races.remove(self.sim_session)

    def __repr__(self) -> str:
        allocator = f"heap_allocator={self.heap_allocator!r}, " if self.heap_allocator else ""
        return (f"Runtime(mode={self.mode!r}, world_size={self.world_size}, "
                f"heap_size={format_bytes(self.heap_size)}, {allocator}domains={len(self.domains)}, "
                f"devices={self.devices})")


def stale_program_error(what: str) -> IrisError:
    """The error of a program that outlived its runtime (it holds the old heaps' addresses)."""
    return IrisError(f"{what} belongs to an iris runtime that was shut down; call the jitted function again "
                     "(it retraces for the current runtime)")


def check_heap_allocator(name: str) -> None:
    """A misspelt setting fails in every model, also where it does not apply (the simulator)."""
    allocators = GPU.heap_class().ALLOCATORS
    if name not in allocators:
        raise ValueError(f"unknown heap allocator {name!r} (init(heap_allocator=...) or IRIS_HEAP_ALLOCATOR); "
                         f"choose one of {allocators}")
