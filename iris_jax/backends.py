"""What differs between iris's execution models: one backend class per model (`runtime().backend`).

GPU backends run kernels on the GPUs and wrap heap memory as device buffers through torch and
DLPack; simulator backends run them under Triton's interpreter on host memory. Each family
also carries the launch and workspace defaults that suit it. Per model, the backends differ in
whether each process holds one rank and where a host-executed kernel runs. The call sites ask
the backend, never the model's name (`mode`, kept for display).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from iris_core.errors import IrisError

SIM_LAUNCHED = "sim-launched"
SIM_WORKERS = "sim-workers"
GPU_SINGLE = "gpu-single-process"
GPU_MULTI = "gpu-multi-process"

# the collective kernel's elements per tile: on GPUs the best of benchmarks/tune_collectives.py;
# the interpreter runs a tile as numpy operations, so a few large tiles cost far less than many
# small ones (RESULTS.md, "Simulator speed")
GPU_BLOCK, SIM_BLOCK = 8192, 1 << 16
FALLBACK_SMS = 132  # an H200's, for devices that do not report their SM count
SIM_SMS = 2  # what a simulated device counts as


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
        partition (iris_jax.workspace).
      fused_comm_programs, fused_reduce_programs, fused_poll_ns: defaults of FusedSettings.
    """

    mode: str
    process_per_rank: bool
    interprets_kernels: bool
    speed_guides_auto: bool
    collective_block: int
    tile_fits_data: bool = False
    workspace_bytes: int
    fused_workspace_bytes: int
    fused_flags: int
    fused_comm_programs: int
    fused_reduce_programs: int
    fused_poll_ns: int

    def sm_count(self, devices: Sequence[jax.Device]) -> int:
        """SMs per device, for grids of co-resident programs."""
        raise NotImplementedError

    def collective_warps(self, warps: int) -> int:
        """Warps per program of the collective kernel, given the configured `warps`."""
        return warps

    def fused_programs(self, devices: Sequence[jax.Device]) -> int:
        """The grid of every fused kernel: all programs co-resident (at most the SMs)."""
        from iris_core.collectives.workspace import MAX_PROGRAMS  # (imports Triton)

        return min(self.sm_count(devices), MAX_PROGRAMS)

    def gemm_config(self, dtype) -> tuple | None:
        """The fused GEMM's tile configuration for every dtype, or None: chosen by dtype."""
        return None

    def wait_for_devices(self, devices: Sequence[jax.Device]) -> None:
        """Waits for the device work of this process on `devices` (kernels, copies); the
        simulator's is done once XLA's call returned."""

    def wait_for_dispatch(self) -> None:
        """Before heap errors are read: until every dispatched kernel was launched (the
        simulator raised them in the call already, and its barrier would raise them again)."""

    def heap_array(self, heap, rank: int, owner, shape: tuple, dtype: np.dtype, device: jax.Device,
                   value: jax.Array | None) -> jax.Array:
        """A jax.Array on `device` whose buffer is `shape`/`dtype` at `owner.offset` of rank's
        heap, holding `value` (None: as it is); the buffer keeps `owner` alive."""
        raise NotImplementedError

    def execute(self, rt, rank: int, spec, row_ptr: int, group_ptr: int | None, operand_ptrs, outs) -> None:
        """Runs a kernel call on the host (iris_jax.cpu_lowering)."""
        raise IrisError(f"kernels of the {self.mode} model run on GPUs, not on the host (internal error)")

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

    def sm_count(self, devices):
        return int(getattr(devices[0], "core_count", None) or FALLBACK_SMS)

    def wait_for_devices(self, devices):
        import torch

        for d in devices:
            torch.cuda.synchronize(d.local_hardware_id)

    def wait_for_dispatch(self):
        jax.effects_barrier()

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


class GpuMultiProcess(_GpuBackend):
    """One process per GPU (jax.distributed); peers' heaps mapped through CUDA IPC or VMM."""

    mode, process_per_rank = GPU_MULTI, True


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
    fused_comm_programs, fused_reduce_programs, fused_poll_ns = 1, 1, 0

    def sm_count(self, devices):
        return SIM_SMS

    def collective_warps(self, warps):
        return 4

    def fused_programs(self, devices):
        return 3

    def gemm_config(self, dtype):
        return 16, 16, 16, 2, "ieee", 4, 1

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

    mode, process_per_rank = SIM_WORKERS, False

    def execute(self, rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs):
        from iris_jax import cpu_lowering

        cpu_lowering.execute_in_worker(rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs)


class SimulatorLaunched(_SimulatorBackend):
    """A rank launched by `python -m iris_core.sim`: kernels run in this process, heaps in shared memory."""

    mode, process_per_rank = SIM_LAUNCHED, True

    def execute(self, rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs):
        from iris_jax import cpu_lowering

        cpu_lowering.execute_here(spec, row_ptr, group_ptr, operand_ptrs, outs)


class _HostBytes:
    """`nbytes` of host memory as a numpy-compatible object that keeps `owner` alive."""

    def __init__(self, address: int, nbytes: int, owner):
        self.owner = owner
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (address, False),
                                    "version": 3}
