"""The GPU platforms iris runs on: what differs between vendors, one record each.

A vendor is the command that lists its GPUs, Triton's compile target (backend and warp size),
its symmetric heap (allocation, peer mapping, export between processes), its device
intrinsics (timer, SM id, acquiring loads, host stores, how a thread stops), and JAX's names
for it (the lowering platform, XLA's custom-call platform, jaxlib's Triton launcher). Code that
needs one of these asks the record (`GPU`) instead of spelling it, and reaches a vendor's own
modules only through it (tests/test_layers.py checks). One vendor today, NVIDIA; a second
(ROCm) would be a record here with its heap module and its intrinsics module (device code takes
them from iris_core.device.intrinsics, which loads the record's). torch's device API is
`torch.cuda` on both vendors' builds of torch, so the GPU backends' calls of it
(iris_jax._runtime.backends) are no vendor's.

The simulator is the other platform (`SIMULATOR`): JAX's "cpu" devices, heaps in host shared
memory (iris_core.heap.shared_memory), host equivalents of the intrinsics (iris_core.sim.intrinsics)
for device code that Triton interprets.

Nothing here imports JAX or a CUDA library: scripts that fall back to the simulator choose
before JAX is imported (`gpus_present`).
"""

from __future__ import annotations

import dataclasses
import importlib
import shutil
import subprocess


@dataclasses.dataclass(frozen=True)
class GpuPlatform:
    vendor: str
    list_gpus: tuple[str, ...]  # a command whose output names every GPU ("GPU" in each line)
    triton_backend: str  # Triton's GPUTarget backend
    warp_size: int
    launcher_stages: tuple[str, ...]  # Triton's stages down to what jaxlib's launcher takes (iris_core.compat)
    heap: str  # "module:class" of its SymmetricHeap
    intrinsics: str  # the module of its device intrinsics (iris_core.device.intrinsics)
    jax_platform: str  # JAX's platform name: lowering rules register for it
    xla_platform: str  # XLA's custom-call (FFI) platform
    jaxlib_triton: str  # the attribute of jaxlib's gpu_triton that holds its Triton launcher

    def heap_class(self) -> type:
        return _load(self.heap)

    def triton_target(self, arch: int):
        """Triton's target for `arch` (NVIDIA: the compute capability, e.g. 90), made without a GPU."""
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.triton_backend, arch, self.warp_size)


NVIDIA = GpuPlatform(vendor="nvidia", list_gpus=("nvidia-smi", "-L"), triton_backend="cuda", warp_size=32,
                     launcher_stages=("ttir", "ttgir", "llir", "ptx"),  # jaxlib assembles the PTX
                     heap="iris_core.heap.cuda:CudaHeap", intrinsics="iris_core.device.nvidia",
                     jax_platform="cuda", xla_platform="CUDA", jaxlib_triton="_cuda_triton")
PLATFORMS = (NVIDIA,)
GPU = NVIDIA  # the platform iris's GPU paths use


@dataclasses.dataclass(frozen=True)
class SimulatorPlatform:
    heap: str  # "module:class" of its SymmetricHeap
    intrinsics: str  # the module of its device intrinsics (iris_core.device.intrinsics, under the interpreter)
    jax_platform: str  # JAX's platform name of its devices

    def heap_class(self) -> type:
        return _load(self.heap)


SIMULATOR = SimulatorPlatform(heap="iris_core.heap.shared_memory:SharedMemoryHeap",
                              intrinsics="iris_core.sim.intrinsics", jax_platform="cpu")


def _load(spec: str):
    """The object a "module:name" string names."""
    module, name = spec.split(":")
    return getattr(importlib.import_module(module), name)


def gpus_present(platform: GpuPlatform = GPU) -> bool:
    """True when `platform`'s tool lists at least one GPU."""
    tool = shutil.which(platform.list_gpus[0])
    if tool is None:
        return False
    try:
        result = subprocess.run([tool, *platform.list_gpus[1:]], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and "GPU" in result.stdout
