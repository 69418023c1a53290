"""What differs between iris's execution models: one backend class per model (`runtime().backend`).

`select` picks the model from what the process finds; the backend's `start` creates the heaps
(CUDA allocations mapped between GPUs, or host shared memory), numbers the ranks, forms the
domains and meets the other processes. GPU backends run kernels on the GPUs and wrap heap
memory as device buffers through torch and DLPack; simulator backends run them under Triton's
interpreter on host memory. Each family also carries the launch, workspace and heap defaults
that suit it. Per model, the backends differ in whether each process holds one rank and where
a host-executed kernel runs. The call sites ask the backend, never the model's name (`mode`,
kept for display).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iris_core.collectives.workspace import MAX_PROGRAMS
from iris_core.errors import IrisError, PeerTimeoutError, RankMismatchError
from iris_core.heap.rendezvous import FileStore
from iris_core.launch import GemmConfig
from iris_core.platform import GPU, SIMULATOR
from iris_core.sim import call_table
from iris_core.sim.env import launched_rank
from iris_core.sim.world import get_world

SIM_LAUNCHED = "sim-launched"
SIM_WORKERS = "sim-workers"
GPU_SINGLE = "gpu-single-process"
GPU_MULTI = "gpu-multi-process"

# the collective kernel's elements per tile: on GPUs the best of benchmarks/tune_collectives.py;
# the interpreter runs a tile as numpy operations, so a few large tiles cost far less than many
# small ones (each tile operation has a fixed interpreter cost): there the largest that a workspace slot holds
GPU_BLOCK, SIM_BLOCK = 8192, 1 << 18
FALLBACK_SMS = 132  # an H200's, for devices that do not report their SM count
SIM_SMS = 2  # what a simulated device counts as
# the GEMM core's settings on GPUs: float32 (full-precision dots), and 16-bit, the best of
# benchmarks/tune_gemm.py's configurations on H200 (on par with XLA's dot)
GPU_GEMM_FLOAT32 = GemmConfig(BM=128, BN=128, BK=32, GROUP_M=8, PREC="ieee", num_warps=8, num_stages=3)
GPU_GEMM_16BIT = GemmConfig(BM=128, BN=256, BK=64, GROUP_M=8, PREC="tf32", num_warps=8, num_stages=3)
# the simulator's, for every dtype: the interpreter's time grows with the tile, and tests' matrices are small
SIM_GEMM = GemmConfig(BM=16, BN=16, BK=16, GROUP_M=2, PREC="ieee", num_warps=4, num_stages=1)
# seconds to wait for the other processes at a rendezvous (environment IRIS_RENDEZVOUS_TIMEOUT)
RENDEZVOUS_TIMEOUT_S = float(os.environ.get("IRIS_RENDEZVOUS_TIMEOUT", 120))


@dataclasses.dataclass
class Started:
    """What `Backend.start` set up for a runtime.

    Attributes:
      world_size: ranks in total (all processes).
      domains: the ranks of each domain (ranks that can map each other's heaps), in order.
      heap: the SymmetricHeap (every rank's base as mapped in this process).
      device_ranks: this process's devices that own a heap, and their ranks, in rank order.
      store: the key-value store of a run of one process per rank (None in one process).
      session: this runtime's key prefix in that store.
      call_table: the simulator's record of each group's calls (iris_core.sim.call_table).
      sim_world: the simulator's rank workers (one process).
      bases_seen_by: one process per rank: every rank's heap bases as each rank's process maps them.
      pages_seen_by: with bases_seen_by, each rank's fault page as its process maps it.
      members: one process per rank: every rank's device, in rank order.
    """

    world_size: int
    domains: tuple[tuple[int, ...], ...]
    heap: object
    device_ranks: dict
    store: object = None
    session: str | None = None
    call_table: object = None
    sim_world: object = None
    bases_seen_by: list[list[int]] | None = None
    pages_seen_by: list[int] | None = None
    members: list | None = None


def select(devices: Sequence[jax.Device] | None) -> Backend:
    """The backend of this process's execution model, from what it finds (module docstring
    of iris_jax._runtime)."""
    if launched_rank() is not None:
        return SimulatorLaunched()
    if jax.process_count() > 1:
        return GpuMultiProcess()
    platforms = {d.platform for d in _local(devices)}
    if len(platforms) != 1:
        raise RankMismatchError(f"devices span several platforms {platforms}; pass devices of one kind")
    return SimulatorWorkers() if platforms == {SIMULATOR.jax_platform} else GpuSingleProcess()


class Backend:
    """The parts of a runtime that depend on its execution model.

    Attributes:
      mode: the model's name (Runtime.mode; for display and tests).
      process_per_rank: each process holds one rank (host barriers go through the key-value store).
      interprets_kernels: kernels run in Triton's and Pallas's interpreters on the host.
      speed_guides_auto: `impl="auto"` of the fused ops may choose by measured speed (GPUs).
      collective_block: the collective kernel's default elements per tile.
      tile_fits_data: tiles no larger than the data (the power of two above it) where the
        data is smaller than a tile.
      workspace_bytes, fused_workspace_bytes, fused_flags: default workspace sizes per
        partition (iris_jax._runtime.workspace).
      large_heap_bytes, large_workspace_bytes: heaps of at least large_heap_bytes get
        collective workspace buffers of large_workspace_bytes (None: no such heaps).
      fused_comm_programs, fused_reduce_programs, fused_poll_ns: defaults of FusedSettings.
    """

    mode: str
    process_per_rank: bool
    interprets_kernels: bool
    # where a kernel call lowered for the host runs (iris_jax.calls.cpu_execution): "worker" (the
    # rank's worker process), "here" (this process); None: kernels run on GPUs, never on the host
    host_kernels: str | None = None
    speed_guides_auto: bool
    collective_block: int
    tile_fits_data: bool = False
    workspace_bytes: int
    large_heap_bytes: int | None = None
    large_workspace_bytes: int | None = None
    fused_workspace_bytes: int
    fused_flags: int
    fused_comm_programs: int
    fused_reduce_programs: int
    fused_poll_ns: int
    default_heap_size: int | None

    def start(self, heap_size: int | None, devices: Sequence[jax.Device] | None, domain_size: int | None,
              heap_allocator: str) -> Started:
        """Creates this process's heaps (`heap_size` bytes each; None: the default) on
        `devices` (None: every local one), maps the peers' and meets the other processes."""
        raise NotImplementedError

    def sm_count(self, devices: Sequence[jax.Device]) -> int:
        """SMs per device, for grids of co-resident programs."""
        raise NotImplementedError

    def collective_warps(self, warps: int) -> int:
        """Warps per program of the collective kernel, given the configured `warps`."""
        return warps

    def fused_programs(self, devices: Sequence[jax.Device]) -> int:
        """The grid of every fused kernel: all programs co-resident (at most the SMs)."""
        return min(self.sm_count(devices), MAX_PROGRAMS)

    def gemm_config(self, dtype, tile: tuple[int, ...] | None = None) -> GemmConfig:
        """The GEMM core's settings for `dtype` (the fused ops, iris_jax.ops.matmul); `tile`:
        CollectiveConfig.gemm_config, (BM, BN, BK, GROUP_M, num_warps, num_stages) for 16-bit
        inputs."""
        raise NotImplementedError

    def wait_for_devices(self, devices: Sequence[jax.Device]) -> None:
        """Waits for the device work of this process on `devices` (kernels, copies); the
        simulator's is done once XLA's call returned."""

    def wait_for_dispatch(self) -> None:
        """Before heap errors are read: until every dispatched kernel was launched (the
        simulator raised them in the call already, and its barrier would raise them again)."""

    def wait_for_executions(self) -> None:
        """`jax.effects_barrier()` that does not raise a failed execution's error again (its outputs
        raise it when read: the fault gate's error is reported once)."""
        try:
            jax.effects_barrier()
        except jax.errors.JaxRuntimeError:  # it stopped at the failed execution: wait for the rest
            self.wait_for_devices(jax.local_devices())

    def heap_array(self, heap, rank: int, owner, shape: tuple, dtype: np.dtype, device: jax.Device,
                   value: jax.Array | None) -> jax.Array:
        """A jax.Array on `device` whose buffer is `shape`/`dtype` at `owner.offset` of rank's
        heap, holding `value` (None: as it is); the buffer keeps `owner` alive."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


# -- GPUs ---------------------------------------------------------------------------------
class _GpuBackend(Backend):
    """Kernels on the GPUs, heap memory wrapped through torch and DLPack."""

    interprets_kernels = False
    speed_guides_auto = True
    collective_block = GPU_BLOCK
    workspace_bytes, fused_workspace_bytes, fused_flags = 16 << 20, 128 << 20, 1 << 16
    fused_comm_programs, fused_reduce_programs, fused_poll_ns = 8, 16, 500
    # IRIS_HEAP_SIZE, else None: the heap's own default (iris_core.heap.cuda: a cudaMalloc heap of
    # 1 GiB; a VMM heap bounded by the device's memory, 1 GiB mapped at init)
    default_heap_size = int(os.environ["IRIS_HEAP_SIZE"]) if os.environ.get("IRIS_HEAP_SIZE") else None

    def sm_count(self, devices):
        return int(getattr(devices[0], "core_count", None) or FALLBACK_SMS)

    def gemm_config(self, dtype, tile=None):
        if jnp.dtype(dtype) == jnp.dtype(jnp.float32):
            return GPU_GEMM_FLOAT32
        if tile is not None:
            BM, BN, BK, GROUP_M, warps, stages = tile
            return GemmConfig(BM, BN, BK, GROUP_M, GPU_GEMM_16BIT.PREC, warps, stages)
        return GPU_GEMM_16BIT

    def wait_for_devices(self, devices):
        import torch

        for d in devices:
            torch.cuda.synchronize(d.local_hardware_id)

    def wait_for_dispatch(self):
        self.wait_for_executions()

    def heap_array(self, heap, rank, owner, shape, dtype, device, value):
        import torch

        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # the storage owns `owner`: the block is freed once JAX's buffer (which holds the
        # exported tensor) and every torch view are gone; an attribute on the Python tensor
        # object would not survive that object
        tensor = heap.torch_tensor(rank, owner.offset, (max(nbytes, 1),), torch.uint8, owner)[:nbytes]
        if value is not None and nbytes:
            value.block_until_ready()
            tensor.copy_(torch.from_dlpack(value).reshape(-1).view(torch.uint8))
        if nbytes == 0:
            return jnp.zeros(shape, dtype, device=device)
        with torch.cuda.device(tensor.device):
            return jax.dlpack.from_dlpack(tensor.view(_torch_dtype(dtype)).view(shape))


class GpuSingleProcess(_GpuBackend):
    """One process, every local GPU a rank; peer access between all pairs."""

    mode, process_per_rank = GPU_SINGLE, False

    def start(self, heap_size, devices, domain_size, heap_allocator):
        local = _local(devices)
        domains = _domains(len(local), domain_size)
        heap = GPU.heap_class()(len(local), heap_size or self.default_heap_size, list(range(len(local))),
                                [d.local_hardware_id for d in local], heap_allocator=heap_allocator)
        return Started(len(local), domains, heap, {d: r for r, d in enumerate(local)})


class GpuMultiProcess(_GpuBackend):
    """One process per GPU (jax.distributed); peers' heaps mapped through CUDA IPC or VMM."""

    mode, process_per_rank = GPU_MULTI, True

    def start(self, heap_size, devices, domain_size, heap_allocator):
        from jax._src import distributed

        local, everyone = _local(devices), members(devices)
        if len(local) != 1:
            raise RankMismatchError(
                f"one process per GPU is required for multi-process runs; this process has {len(local)}")
        rank, world_size = everyone.index(local[0]), len(everyone)
        client = distributed.global_state.client
        if client is None:
            raise IrisError("jax.process_count() > 1 but no distributed client; call jax.distributed.initialize()")
        store, session = _DistributedStore(client), next_session()
        hosts = _exchange(store, f"iris/{session}/host", rank, world_size, socket.gethostname().encode())
        domains = _domains(world_size, domain_size) if domain_size else _domains_by_host(hosts)
        # a heap's handles are valid in its domain only: map the peers of this rank's domain
        domain = next(d for d in domains if rank in d)
        heap = GPU.heap_class()(world_size, heap_size or self.default_heap_size, [rank], [local[0].local_hardware_id],
                                store=store, session=session, timeout_s=RENDEZVOUS_TIMEOUT_S, reachable=domain,
                                heap_allocator=heap_allocator, across_hosts=len({hosts[r] for r in domain}) > 1)
        return Started(world_size, domains, heap, {local[0]: rank}, store, session,
                       members=everyone, **_seen_by(store, session, rank, world_size, heap))


def _torch_dtype(dtype):
    import torch

    return {np.dtype(jnp.bfloat16): torch.bfloat16}.get(dtype) or getattr(torch, dtype.name)


# -- the simulator ------------------------------------------------------------------------
class _SimulatorBackend(Backend):
    """Kernels under Triton's interpreter, heap memory in host shared memory."""

    interprets_kernels = True
    speed_guides_auto = False  # no speed to choose by: `auto` runs the fused kernels, which then get exercised
    collective_block = SIM_BLOCK
    tile_fits_data = True  # the interpreter computes every lane of a tile, masked or not
    workspace_bytes, fused_workspace_bytes, fused_flags = 256 << 10, 512 << 10, 1 << 12
    # the default 64 MiB heap affords 4 x larger buffers (a partition's workspace 3 -> 6 MiB) and
    # so 4 x fewer chunk rounds; the tests' 16 MiB heaps keep the small ones
    large_heap_bytes, large_workspace_bytes = 64 << 20, 1 << 20
    fused_comm_programs, fused_reduce_programs, fused_poll_ns = 1, 1, 0
    # the heap's upper bound (IRIS_HEAP_SIZE; None: the ranks' share of the host's memory): a
    # sparse file per rank, memory only where written; it maps min(bound, initial_heap_bytes) at
    # start and grows from there
    default_heap_size = int(os.environ["IRIS_HEAP_SIZE"]) if os.environ.get("IRIS_HEAP_SIZE") else None
    initial_heap_bytes = 64 << 20

    def heap_bound(self, heap_size: int | None, ranks: int) -> int:
        """The upper bound of each of `ranks` heaps: `heap_size`, IRIS_HEAP_SIZE, or the host's
        memory shared by its ranks (at least initial_heap_bytes, in its multiples)."""
        if heap_size or self.default_heap_size:
            return heap_size or self.default_heap_size
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return max(host // ranks // self.initial_heap_bytes, 1) * self.initial_heap_bytes

    def heap_options(self, bound: int) -> dict:
        """SharedMemoryHeap's growth settings for a heap of upper bound `bound`."""
        return dict(mapped_size=min(bound, self.initial_heap_bytes),
                    device_memory=sim_device_memory(os.environ.get("IRIS_SIM_DEVICE_MEMORY", "")))

    def sm_count(self, devices):
        return SIM_SMS

    def collective_warps(self, warps):
        return 4

    def fused_programs(self, devices):
        return 3

    def gemm_config(self, dtype, tile=None):
        return SIM_GEMM  # every dtype, whatever `tile` says

    def heap_array(self, heap, rank, owner, shape, dtype, device, value):
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        # the view exports the heap's mapping, which then outlives heap.close() (shutdown) as
        # long as this array does; a bare address would dangle once the heap is unmapped
        mapped = heap.host_view(rank, owner.offset, (max(nbytes, 1),), np.uint8)
        address = heap.address(rank, owner.offset)
        raw = np.asarray(_HostBytes(address, max(nbytes, 1), (owner, mapped)))[:nbytes]
        host = raw.view(dtype).reshape(shape)
        if value is not None:
            host[...] = np.asarray(value)
        return jax.device_put(host, device)


class SimulatorWorkers(_SimulatorBackend):
    """One process, one simulated rank per CPU device; each rank's kernels run in its worker."""

    mode, process_per_rank, host_kernels = SIM_WORKERS, False, "worker"

    def start(self, heap_size, devices, domain_size, heap_allocator):
        local = _local(devices)
        domains = _domains(len(local), domain_size)
        world = get_world(len(local))
        bound = self.heap_bound(heap_size, len(local))
        heap = world.create_heaps(bound, **self.heap_options(bound))
        return Started(len(local), domains, heap, {d: r for r, d in enumerate(local)},
                       call_table=_call_table(heap), sim_world=world)



class SimulatorLaunched(_SimulatorBackend):
    """A rank launched by `python -m iris_core.sim`: kernels run in this process, heaps in shared memory."""

    mode, process_per_rank, host_kernels = SIM_LAUNCHED, True, "here"

    def start(self, heap_size, devices, domain_size, heap_allocator):
        launched = launched_rank()
        local = _local(devices)
        if len(local) != 1:
            raise RankMismatchError(
                f"a launched simulated rank owns exactly one device, got {len(local)}; do not set "
                "xla_force_host_platform_device_count under `python -m iris_core.sim`")
        rank, world_size = launched.rank, launched.world_size
        joined = jax.process_count() > 1  # the script called jax.distributed.initialize: ranks are its processes
        everyone = members(devices) if joined else None
        if joined:
            rank, world_size = everyone.index(local[0]), len(everyone)
            if devices is None and world_size != launched.world_size:
                raise RankMismatchError(
                    f"jax.distributed.initialize joined {world_size} processes, but the simulator "
                    f"launched {launched.world_size}; call it without arguments under `python -m iris_core.sim` "
                    "(the launcher's environment names the run)")
        domains = _domains(world_size, domain_size)
        store = FileStore(launched.store_path)
        session = next_session()
        # a world of fewer ranks (the survivors of a dead process) maps heaps of its own: its ranks'
        # numbers may be a dead process's, whose segments the launcher removes only at the end
        heap_session = launched.session if world_size == launched.world_size else f"{launched.session}-{session}"
        bound = self.heap_bound(heap_size, launched.world_size)  # (the launcher's ranks share this host)
        heap = SIMULATOR.heap_class()(world_size, bound, [rank], heap_session, store, timeout_s=RENDEZVOUS_TIMEOUT_S,
                                      **self.heap_options(bound))
        seen = _seen_by(store, session, rank, world_size, heap) if joined else {}
        return Started(world_size, domains, heap, {local[0]: rank}, store, session, call_table=_call_table(heap),
                       members=everyone, **seen)



def sim_device_memory(setting: str) -> dict[int, int]:
    """IRIS_SIM_DEVICE_MEMORY: "RANK:BYTES,..." (each named rank's simulated device memory, past
    which its heap cannot grow); "" none."""
    found = {}
    for item in filter(None, (part.strip() for part in setting.split(","))):
        rank, sep, nbytes = item.partition(":")
        if not sep or not rank.strip().isdigit() or not nbytes.strip().isdigit():
            raise ValueError(f"IRIS_SIM_DEVICE_MEMORY={setting!r}: expected RANK:BYTES items separated by commas")
        found[int(rank)] = int(nbytes)
    return found


class _HostBytes:
    """`nbytes` of host memory as a numpy-compatible object that keeps `owner` alive."""

    def __init__(self, address: int, nbytes: int, owner):
        self.owner = owner
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                    "version": 3}


# -- ranks, domains and rendezvous ----------------------------------------------------------
_sessions = itertools.count()


def next_session() -> str:
    """Key prefix of one runtime in the shared key-value store: processes of one run init and
    shut down alike, so they count the same; keys of an earlier runtime are never reused."""
    return f"iris-jax-{next(_sessions)}"


def _local(devices: Sequence[jax.Device] | None) -> list[jax.Device]:
    """This process's devices among `devices` (default: all of them)."""
    if devices is None:
        return jax.local_devices()
    return [d for d in devices if d.process_index == jax.process_index()]


def members(devices: Sequence[jax.Device] | None) -> list[jax.Device]:
    """One process per rank: the devices of the world, in rank order (device id order, as JAX
    numbers them by process): `devices` (e.g. the live ones after a process died), else every
    process's."""
    return sorted(devices if devices is not None else jax.devices(), key=lambda d: d.id)




def _domains(world_size: int, domain_size: int | None) -> tuple[tuple[int, ...], ...]:
    """Ranks r // domain_size form a domain; None: one domain of every rank."""
    size = world_size if domain_size is None else domain_size
    if size < 1 or world_size % size:
        raise RankMismatchError(f"domain_size={domain_size} must be >= 1 and divide the world size "
                                f"{world_size}; pass a divisor (or None for one domain)")
    return tuple(tuple(range(start, start + size)) for start in range(0, world_size, size))


def _domains_by_host(hosts: Sequence[bytes]) -> tuple[tuple[int, ...], ...]:
    """The ranks of each host, in order of their first rank."""
    return tuple(tuple(r for r, host in enumerate(hosts) if host == h) for h in dict.fromkeys(hosts))


def _call_table(heap):
    """The simulator's call records, the first allocation of every heap (so at one offset everywhere)."""
    return call_table.CallTable(heap, heap.allocate(call_table.NBYTES, zero=True))


def _exchange(store, key: str, rank: int, world_size: int, value: bytes) -> list[bytes]:
    """Publishes this rank's `value` under `key` and returns every rank's, in rank order."""
    store.set(f"{key}/{rank}", value)
    return [store.get(f"{key}/{r}", RENDEZVOUS_TIMEOUT_S) for r in range(world_size)]


def _seen_by(store, session: str, rank: int, world_size: int, heap) -> dict:
    """One process per rank: every process's view of the heap bases, and the address of its
    rank's fault page, once this process's heap is up (Started's bases_seen_by, pages_seen_by).

    Every process maps the heaps at its own addresses. Each rank's context must hold the
    bases (and its fault page) as its own process sees them, and the context table compiled
    into a program must be the same in every process (XLA's multi-process compilation waits
    forever on programs whose fingerprints differ), so the processes exchange their views.
    """
    mine = np.asarray([*heap.heap_bases, heap.fault_page(rank)], np.uint64).tobytes()
    views = [[int(w) for w in np.frombuffer(view, np.uint64)]
             for view in _exchange(store, f"iris/{session}/bases", rank, world_size, mine)]
    return {"bases_seen_by": [view[:-1] for view in views], "pages_seen_by": [view[-1] for view in views]}


class _DistributedStore:
    """KeyValueStore over JAX's distributed client."""

    def __init__(self, client):
        self.client = client

    def set(self, key: str, value: bytes) -> None:
        self.client.key_value_set(key, value.hex())

    def get(self, key: str, timeout_s: float) -> bytes:
        try:
            return bytes.fromhex(self.client.blocking_key_value_get(key, int(timeout_s * 1000)))
        except Exception as e:  # noqa: BLE001 - JAX's runtime error type moved between versions
            if "DEADLINE_EXCEEDED" not in str(e):
                raise
            raise PeerTimeoutError(  # the kind of error every KeyValueStore raises (rendezvous.py)
                f"rendezvous key {key!r} not published within {timeout_s:g} s: a peer process did not "
                "start, or did not get this far") from e
