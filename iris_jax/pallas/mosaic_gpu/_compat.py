"""Which JAX versions iris_jax.pallas.mosaic_gpu supports, and a clear error elsewhere.

It builds on private parts of JAX's Mosaic GPU interpreter (jax._src.pallas.mosaic_gpu.interpret,
first in jax 0.12) and on the primitives of Pallas's Mosaic GPU backend, read from jax 0.12.0.1
and tested with it on CPU devices. jax 0.10 and 0.11 have no Mosaic GPU interpreter.
"""

from __future__ import annotations

import functools

import jax

from iris_core.errors import IrisError
from iris_jax.pallas._compat import absent_internals

NEEDED_JAX = "0.12"
TESTED_JAX = "0.12.0.1"

_INTERPRET = "jax._src.pallas.mosaic_gpu.interpret"

# module -> the names the seam reads or replaces there (a dotted name reaches an attribute)
_NEEDED = {
    f"{_INTERPRET}.jaxpr_interpret": (
        "JaxprInterpreter",
        "JaxprInterpreter.interpret",
        "JaxprInterpreter._interpret_copy_smem_to_gmem_p",
        "DeviceInfo",
        "get_uninitialized_array",
        "resolve_ref",
    ),
    f"{_INTERPRET}.race_detection_state": ("GPURaceDetectionState", "GPURaceDetectionState._check_ref_union"),
    "jax._src.pallas.mosaic.interpret.race_detection_state": ("_ranges_overlap",),
    f"{_INTERPRET}.interpret_pallas_call": ("interpret_pallas_call",),
    f"{_INTERPRET}.gpu_callbacks": (
        "TOKEN_SHAPE_DTYPE",
        "fail_on_exception",
        "reset_gpu_interpret_mode_state",
        "_get_shared_memory",
        "_update_clocks_for_device_barrier",
        "cluster_finished",
        "call_get",
        "call_swap",
        "get_races",
        "GPURaceDetectionState",
    ),
    f"{_INTERPRET}.shared_memory": (
        "HostAllocationKey",
        "LAYOUT_TRANSFORMS",
        "get_memory_space_idx",
        "IDX_BY_GPU_MEMORY_SPACE",
        "GPUSharedMemory.incr_clock",
        "GPUSharedMemory.access",
    ),
    f"{_INTERPRET}.params": ("InterpretGPUParams", "force_gpu_interpret_mode", "set_gpu_interpret_mode"),
    "jax._src.pallas.mosaic.interpret.shared_memory": ("Buffer",),
    "jax._src.pallas.mosaic.interpret.utils": ("JaxprEnv", "to_access", "Access"),
    "jax._src.pallas.mosaic_gpu.core": ("PeerMemRef", "MemorySpace"),
    "jax._src.pallas.mosaic_gpu.primitives": (
        "load_p",
        "store_p",
        "copy_smem_to_gmem_p",
        "semaphore_signal_p",
        "semaphore_wait_p",
        "semaphore_signal_parallel_p",
        "semaphore_signal_multicast_p",
        "multimem_store_p",
        "multimem_load_reduce_p",
    ),
    "jax._src.pallas.primitives": (
        "semaphore_signal_p",
        "semaphore_wait_p",
        "get_global_p",
        "DeviceIdType",
        "device_id_to_logical",
        "_device_id_dict_to_mesh",
    ),
    "jax._src.pallas.utils": ("MeshInfo", "strides_from_shape"),
    "jax._src.pallas.core": ("semaphore_dtype",),
    "jax._src.state.primitives": ("get_p", "swap_p"),
    "jax._src.state.types": ("ReshapeTransform", "TransposeTransform"),
    "jax._src.state.indexing": ("NDIndexer",),
    "jax._src.source_info_util": ("summarize", "user_context"),
    "jax._src.core": ("Jaxpr", "Var", "Tracer", "DebugInfo"),
    "jax._src.dispatch": ("runtime_tokens",),
}


@functools.cache
def missing() -> tuple[str, ...]:
    """The JAX internals iris_jax.pallas.mosaic_gpu needs that this JAX lacks (empty: all there)."""
    return absent_internals(_NEEDED)


def unsupported_reason() -> str | None:
    """Why Mosaic GPU kernels cannot run on the simulator with this JAX, or None where they can."""
    absent = missing()
    if not absent:
        return None
    shown = ", ".join(absent[:3]) + (f" and {len(absent) - 3} more" if len(absent) > 3 else "")
    return (
        f"iris_jax.pallas.mosaic_gpu needs jax >= {NEEDED_JAX} (JAX's Mosaic GPU interpreter; tested with "
        f"jax {TESTED_JAX}), but this is jax {jax.__version__}, which lacks {shown}. Install jax {TESTED_JAX}."
    )


def require() -> None:
    """Raises IrisError naming the JAX version needed when this JAX cannot run the seam."""
    reason = unsupported_reason()
    if reason is not None:
        raise IrisError(reason)
