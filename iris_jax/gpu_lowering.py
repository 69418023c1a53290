"""GPU lowering of iris kernel calls: jax-triton's custom call, run inside XLA's CUDA graphs.

jax-triton compiles the kernel (through iris_jax.kernel_cache) and builds its custom call,
with iris's operands (iris_jax.operands) before the kernel's own; the call is then marked as
having side effects (a kernel whose only effect is a remote write stays in the program) and
pointed at jaxlib's Triton FFI handler (see "launch path").
"""

from __future__ import annotations

import os
import threading
import warnings
import zlib

import jax
from jax.interpreters import mlir

from iris_core.errors import IrisError
from iris_jax.call import iris_triton_call_p
from iris_jax.operands import extra_operands


def _lowering(ctx, device_index, *args, fn, symmetric, group_axes, workspace, scalar_args,
                  input_output_aliases, **params):
    from jax_triton import triton_lib

    del device_index, symmetric  # device_index carries the outputs' varying axes only
    extra, extra_avals = extra_operands(ctx, group_axes, workspace)
    shift = len(extra) - 1  # user arguments were numbered after the context only
    kernel_ctx = ctx.replace(avals_in=[*extra_avals, *ctx.avals_in[1:]])
    results = triton_lib.triton_kernel_call_lowering(
        triton_lib.get_cuda_backend, kernel_ctx, *extra, *args, fn=fn,
        scalar_args=tuple((i + shift, t, v) for i, t, v in scalar_args),
        input_output_aliases=tuple((i + shift, o) for i, o in input_output_aliases), **params)
    op = results[0].owner if results else None
    if op is not None:
        op.attributes["has_side_effect"] = mlir.ir.BoolAttr.get(True)
        target = graph_target()
        if target is not None:
            _retarget(op, target)
    return results


# -- launch path ----------------------------------------------------------------------
# jax-triton 0.3.1 lowers to jaxlib's legacy custom call `triton_kernel_call`. XLA launches
# a legacy custom call from the host, outside its CUDA graphs (command buffers): a host
# launch per call (benchmarks/latency_floor.py). jaxlib also has the same launcher as an FFI
# handler (`triton_kernel_call_ffi`: same serialized kernel, module loaded at its initialize
# stage, only a kernel launch at execute). We register that handler once more under our own
# name with the command-buffer-compatible trait, and point the call at it, so XLA can
# capture iris kernels into its CUDA graphs together with the surrounding fusions.
GRAPH_TARGET = "iris_triton_kernel_call"
_registration: dict = {"lock": threading.Lock()}  # "target": the outcome, once tried


def graph_target() -> str | None:
    """The capturable FFI target, registered with XLA on first use; None (jax-triton's own
    call) where IRIS_TRITON_CALL=legacy, where jaxlib lacks the FFI handler, or where its
    plugin refuses handler traits (jaxlib 0.10 says "does not support custom call traits")."""
    mode = os.environ.get("IRIS_TRITON_CALL", "ffi")
    if mode not in ("ffi", "legacy"):
        raise IrisError(f"IRIS_TRITON_CALL must be 'ffi' or 'legacy', not {mode!r}")
    if mode == "legacy":
        return None
    with _registration["lock"]:
        if "target" not in _registration:
            _registration["target"] = _register()
    return _registration["target"]


def _register() -> str | None:
    from jax._src.lib import gpu_triton, xla_client

    plugin = getattr(gpu_triton, "_cuda_triton", None)
    handler = plugin.registrations().get("triton_kernel_call_ffi") if plugin else None
    if handler is None:
        return None
    try:
        jax.ffi.register_ffi_target(GRAPH_TARGET, handler, platform="CUDA",
                                    traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
    except Exception as e:  # any refusal means: keep the legacy call
        warnings.warn(f"iris kernels fall back to jax-triton's host-launched call (outside XLA's CUDA graphs, "
                      f"a host launch per call): registering {GRAPH_TARGET} failed: {e}", stacklevel=2)
        return None
    return GRAPH_TARGET


def _retarget(op, target: str) -> None:
    """Turns jax-triton's legacy call (compressed kernel proto as backend_config) into a
    typed-FFI call of `target` (the same bytes as its `opaque` attribute)."""
    ir = mlir.ir
    opaque = ir.StringAttr(op.attributes["backend_config"]).value_bytes
    zlib.decompress(opaque)  # fails loudly if jax-triton ever changes what it stores there
    op.attributes["call_target_name"] = ir.StringAttr.get(target)
    op.attributes["api_version"] = mlir.i32_attr(4)  # API_VERSION_TYPED_FFI
    op.attributes["backend_config"] = ir.DictAttr.get({"opaque": ir.StringAttr.get(opaque)})


def register() -> None:
    mlir.register_lowering(iris_triton_call_p, _lowering, platform="cuda")
