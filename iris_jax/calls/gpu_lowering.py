"""GPU lowering of iris kernel calls: jaxlib's Triton launcher, run inside XLA's CUDA graphs.

A chain of small steps, as jax-triton's own lowering, but iris's (so that it works on every
jax-triton release, and whether or not jax-triton's lowering does):

1. the kernel's arguments: iris's operands (iris_jax.calls.operands: the context row, the group row),
   the call's arrays with its scalars at their positions, then the outputs;
2. the kernel: @triton.autotune / @triton.heuristics resolved to one config, the same on every
   rank (iris_jax.calls.autotune), compiled to PTX through the disk cache (iris_jax.calls.kernel_cache);
3. jaxlib's kernel call (TritonKernel, TritonKernelCall; iris_jax.compat) serialized into a
   typed-FFI custom call with side effects (a kernel whose only effect is a remote write stays
   in the program), pointed at the capturable launcher (see "launch path");
4. its outputs passed through the fault gate (iris_jax.calls.fault_gate), so that a kernel that
   gave up fails the execution instead of handing back numbers.
"""

from __future__ import annotations

import os
import threading
import warnings
import zlib

import jax
import numpy as np
from jax.interpreters import mlir

from iris_core.errors import IrisError
from iris_core.platform import GPU
from iris_jax import compat
from iris_jax.calls import _ffi, fault_gate, kernel_cache
from iris_jax.calls.autotune import resolve_call
from iris_jax.calls.operands import extra_operands
from iris_jax.calls.triton_call import aval_nbytes, iris_triton_call_p, kernel_arguments, normalize_grid

_DEFAULTS = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "enable_fp_fusion": True, "debug": False}


def _lowering(ctx, device_index, *args, fn, symmetric, group_axes, workspace, scalar_args, input_output_aliases,
              out_shapes, grid, num_warps, num_stages, num_ctas, compute_capability, enable_fp_fusion,
              zeroed_outputs, debug, serialized_metadata, name, custom_call_target_name, axis_index_groups=None,
              **metaparams):
    del device_index, symmetric, custom_call_target_name  # device_index carries the outputs' varying axes only
    extra, extra_avals = extra_operands(ctx, group_axes, workspace, axis_index_groups)
    operands, operand_avals = [*extra, *args], [*extra_avals, *ctx.avals_in[1:]]
    shift = len(extra) - 1  # the user's arguments were numbered after the context only
    scalars = tuple((i + shift, t, v) for i, t, v in scalar_args)
    aliases = {i + shift: o for i, o in input_output_aliases}
    caller = {"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas,
              "enable_fp_fusion": enable_fp_fusion, "debug": debug}
    call = launch(ctx, operand_avals, fn=fn, scalars=scalars, aliases=aliases, metaparams=metaparams,
                  options=caller, grid=grid, zeroed_outputs=zeroed_outputs,
                  compute_capability=compute_capability)
    proto = call.to_proto(name, serialized_metadata)
    target = graph_target() or "triton_kernel_call_ffi"
    results = jax.ffi.ffi_lowering(target, api_version=4, operand_output_aliases=aliases, has_side_effect=True)(
        ctx.replace(avals_in=operand_avals), *operands, opaque=zlib.compress(proto))
    return fault_gate.gated(ctx, results)  # a kernel that gave up fails the execution, not hands back numbers


def launch(ctx, operand_avals, *, fn, scalars, aliases, metaparams, options, grid, zeroed_outputs,
           compute_capability):
    """jaxlib's TritonKernelCall of `fn` over `operand_avals` (then the outputs, ctx.avals_out)."""
    values = [(i, v) for i, _, v in scalars]
    args = kernel_arguments(operand_avals, values, ctx.avals_out)
    resolved = resolve_call(fn, operand_avals, values, ctx.avals_out, metaparams, aliases)
    options = {k: next(v for v in (options.get(k), resolved.options.get(k), _DEFAULTS[k]) if v is not None)
               for k in _DEFAULTS}
    cc = compute_capability or _compute_capability()
    if options["num_ctas"] > 1 and cc < 90:
        raise IrisError(f"num_ctas={options['num_ctas']} needs compute capability 9.0 or later (this GPU: {cc})")
    arg_types = [compat.triton_type(a) for a in args]
    compiled, _ = kernel_cache.compile_kernel(
        kernel_cache.cache(), resolved.kernel, arg_types, [(i, arg_types[i], v) for i, _, v in scalars],
        options=options, compute_capability=cc, metaparams=resolved.constexprs)
    zeroed = zeroed_outputs(resolved.constexprs) if callable(zeroed_outputs) else zeroed_outputs
    zeroed_bytes = {len(args) - len(ctx.avals_out) + o: aval_nbytes(ctx.avals_out[o])
                    for o in {*zeroed, *resolved.reset_outputs}}
    lib = compat.gpu_triton()
    params = []
    for i, (arg, arg_type) in enumerate(zip(args, arg_types)):
        if arg_type.startswith("*"):
            params.append(lib.create_array_parameter(zeroed_bytes.get(i, 0), 16))
        elif not kernel_cache.is_one(arg):
            params.append(lib.create_scalar_parameter(_python(arg), arg_type))
    grid = normalize_grid(grid, resolved.constexprs)
    return lib.TritonKernelCall(_triton_kernel(compiled, options["num_warps"], options["num_ctas"], cc), *grid, params)


def _python(value):
    """A scalar as the plain Python value jaxlib's (strict) binding accepts."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    return float(value)


_kernels: dict = {}  # jaxlib TritonKernel objects by compile (each loads its module once)
_kernels_lock = threading.Lock()


def _triton_kernel(compiled, num_warps: int, num_ctas: int, cc: int):
    key = (compiled, num_warps, num_ctas, cc)
    with _kernels_lock:
        if key not in _kernels:
            _kernels[key] = compat.triton_kernel(compiled.name, num_warps, num_ctas, compiled.shared_mem_bytes,
                                                 compiled.asm, compiled.ttir, cc, compiled.global_scratch)
        return _kernels[key]


def _compute_capability() -> int:
    return int(compat.gpu_triton().get_compute_capability(0))


# -- launch path ----------------------------------------------------------------------
# jaxlib registers its Triton launcher as the typed-FFI handler `triton_kernel_call_ffi`
# (serialized kernel, module loaded at the handler's initialize stage, only a kernel launch at
# execute). XLA launches a call from its CUDA graphs (command buffers) only where the handler
# says it may: we register the same handler once more under our own name with the
# command-buffer-compatible trait, so XLA captures iris kernels together with the surrounding
# fusions instead of launching each from the host (benchmarks/latency_floor.py).
GRAPH_TARGET = "iris_triton_kernel_call"
_registration: dict = {"lock": threading.Lock()}  # "target": the outcome, once tried


def graph_target() -> str | None:
    """The capturable FFI target, registered with XLA on first use; None (jaxlib's own
    `triton_kernel_call_ffi`, launched from the host) where IRIS_TRITON_CALL=legacy, where jaxlib
    lacks the handler, or where its plugin refuses handler traits (jaxlib 0.10 says "does not
    support custom call traits")."""
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
    from jax._src.lib import gpu_triton

    plugin = getattr(gpu_triton, GPU.jaxlib_triton, None)
    handler = plugin.registrations().get("triton_kernel_call_ffi") if plugin else None
    if handler is None:
        return None
    refusal = _ffi.register_capturable(GRAPH_TARGET, handler, GPU.xla_platform)
    if refusal is not None:  # keep the host-launched call
        warnings.warn(f"iris kernels fall back to jaxlib's host-launched call (outside XLA's CUDA graphs, "
                      f"a host launch per call): registering {GRAPH_TARGET} failed: {refusal}", stacklevel=2)
        return None
    return GRAPH_TARGET


def register() -> None:
    mlir.register_lowering(iris_triton_call_p, _lowering, platform=GPU.jax_platform)
