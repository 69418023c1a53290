"""CPU lowering of Triton kernel calls, for the simulator.

Registered for both `iris_triton_call` and jax-triton's own `triton_kernel_call`, so a
plain `jax_triton.triton_call` kernel also runs on CPU. Each call site becomes an FFI
custom call (see _ffi) that XLA invokes on the device's thread with buffer pointers; its
first operand is the device's context row, which names the rank. What a call site needs at
run time is a cpu_execution.KernelSpec (the kernel resolved from its autotuners, its grid, scalars, sizes,
and for group kernels the signature and call path the simulator's call records compare);
iris_jax.calls.cpu_execution runs it. Calls are chained in program order (see below).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import weakref

import jax
import numpy as np
from jax._src import core, source_info_util
from jax.interpreters import mlir

from iris_core.platform import SIMULATOR
from iris_core.sim import call_table
from iris_jax import _runtime as runtime_lib
from iris_jax import compat
from iris_jax.calls import cpu_execution, host_meeting
from iris_jax.calls._ffi import register_cpu_target
from iris_jax.calls.autotune import resolve_call
from iris_jax.calls.cpu_execution import KernelSpec
from iris_jax.calls.operands import devices_of, partition_operands, pick_rows
from iris_jax.calls.triton_call import aval_nbytes, iris_triton_call_p, normalize_grid

_CALL_PARAMS = {"name", "custom_call_target_name", "num_warps", "num_stages", "num_ctas",
                "compute_capability", "enable_fp_fusion", "debug", "serialized_metadata", "out_shapes"}


def _lower(ctx, operands, avals_in, *, pass_context, fn, scalar_args, out_shapes, grid, input_output_aliases,
           zeroed_outputs, symmetric=(), group_axes=None, axis_index_groups=None, workspace="collective",
           result_params=None, debug=False, **params):
    metaparams = {k: v for k, v in params.items() if k not in _CALL_PARAMS}
    result_params = tuple(range(len(out_shapes))) if result_params is None else tuple(result_params)
    group = 1 if group_axes else 0
    scalars = tuple(sorted((i + group, v) for i, _, v in scalar_args))
    extra, extra_avals, row_bytes = partition_operands(ctx, group_axes, workspace, axis_index_groups)
    row_avals = [core.ShapedArray(table.shape[1:], np.int32) for table in extra_avals[1:]]
    lead = row_avals if pass_context else []
    # iris_triton_call numbers its operands after the device index (hence - pass_context)
    launch = resolve_call(fn, [*lead, *avals_in], scalars, [ctx.avals_out[o] for o in result_params], metaparams,
                          {len(lead) + i - pass_context: o for i, o in input_output_aliases})
    zeroed = zeroed_outputs(launch.constexprs) if callable(zeroed_outputs) else zeroed_outputs
    zeroed = sorted({*zeroed, *launch.reset_outputs})
    spec = KernelSpec(
        kernel=launch.kernel, grid=tuple(normalize_grid(grid, launch.constexprs)),
        scalars=scalars, constexprs=launch.constexprs,
        operand_dtypes=tuple(np.dtype(a.dtype) for a in avals_in),
        operand_nbytes=tuple(aval_nbytes(a) for a in avals_in),
        result_dtypes=tuple(np.dtype(s.dtype) for s in out_shapes),
        result_nbytes=tuple(aval_nbytes(s) for s in out_shapes),
        zeroed=tuple(zeroed), result_params=result_params, symmetric=tuple(symmetric), pass_context=pass_context,
        runtime=weakref.ref(runtime_lib.runtime()), debug=bool(debug),
        ranks=tuple(runtime_lib.runtime().rank_of(d) for d in devices_of(ctx)))
    if group_axes:
        spec = dataclasses.replace(spec, group_nbytes=row_bytes[1], site=_site(ctx),
                                   host=cpu_execution.host_collective(launch.kernel, launch.constexprs,
                                                                      spec.operand_dtypes[0]),
                                   **_signature(spec, avals_in))
    # the custom call's operands are [partition id, context table, group table?, *operands, previous result?]
    offset = len(extra) - (1 if pass_context else 0)
    aliases = {i + offset: o for i, o in input_output_aliases}
    previous = _previous_call(ctx)
    if previous is not None:
        spec = dataclasses.replace(spec, ordered_after=1)
    meeting = host_meeting.site(spec.runtime(), spec)
    if meeting is not None:  # a host collective: its members meet in C
        name, attributes = meeting[0], {"site": meeting[1]}
    else:
        name = register_cpu_target("iris_cpu_kernel",
                                   lambda ins, outs: cpu_execution.execute(spec, pick_rows(ins, row_bytes), outs))
        attributes = {}
    tail, tail_avals = ([previous[0]], [previous[1]]) if previous is not None else ([], [])
    call_ctx = ctx.replace(avals_in=[*extra_avals, *avals_in, *tail_avals])
    results = jax.ffi.ffi_lowering(name, operand_output_aliases=aliases, has_side_effect=True)(
        call_ctx, *extra, *operands, *tail, **attributes)
    if results:
        _remember_call(ctx, results[0], ctx.avals_out[0])
    return results


def _signature(spec: KernelSpec, avals_in) -> dict:
    """A group kernel's signature and name (see iris_core.sim.call_table)."""
    what = spec.constexprs.get("WHAT") or spec.kernel_name
    shapes = ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in avals_in)
    stable = {k: _stable(v) for k, v in sorted(spec.constexprs.items())}
    key = (spec.kernel_name, stable, spec.scalars, spec.grid, spec.operand_nbytes, spec.result_nbytes,
           [str(d) for d in spec.operand_dtypes])
    return {"signature": call_table.digest(key), "what": f"iris {what} of ({shapes})"}


_enclosing_traceback = contextvars.ContextVar("iris_call_traceback", default=None)


@contextlib.contextmanager
def calls_made_at(ctx):
    """The kernel calls lowered inside this block were made at `ctx`'s line (a collective's
    rule lowers its kernels through lower_fun, whose tracebacks start at the rule)."""
    token = _enclosing_traceback.set(ctx.traceback)
    try:
        yield
    finally:
        _enclosing_traceback.reset(token)


def _site(ctx) -> tuple[str, ...]:
    """Where the user's program made this call: its frames ("file.py:12"), innermost first
    (all of them: a helper that wraps the collective is one frame of several)."""
    enclosing = _enclosing_traceback.get()
    return _user_frames(enclosing if enclosing is not None else ctx.traceback)


def _user_frames(traceback) -> tuple[str, ...]:
    # iris's own frames are not the user's: iris_jax registers them with JAX as library code
    return tuple(f"{os.path.basename(f.file_name)}:{f.start_line}" for f in source_info_util.user_frames(traceback))


def _stable(value):
    """`value` as a repr that is the same in every process (no object addresses)."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_stable(v) for v in value)
    return f"{type(value).__name__}:{getattr(value, '__name__', None) or str(value).split(' at 0x')[0]}"


# XLA:CPU starts independent operations as soon as their inputs are ready, so two kernel
# calls with no data dependency (two collectives over independent arrays) could run in a
# different order on different devices and pair up wrongly. Each kernel call therefore
# takes the previous call of the same block as an extra, ignored operand: calls run in
# program order on every device. (GPUs execute one stream in program order already.)
_last_call: dict = {}


def _previous_call(ctx):
    block = mlir.ir.InsertionPoint.current.block
    entry = _last_call.get(id(ctx.module_context.module))
    if entry is None or entry[0] is not ctx.module_context.module or entry[1] != block:
        return None
    return entry[2], entry[3]


def _remember_call(ctx, value, aval) -> None:
    if len(_last_call) > 64:  # modules lowered long ago: their values are dead
        _last_call.clear()
    # the entry holds its module: a module freed while its values were kept (and its id reused by
    # a new one) would hand a dead block to the comparison above
    module = ctx.module_context.module
    _last_call[id(module)] = (module, mlir.ir.InsertionPoint.current.block, value, aval)


def _iris_lowering(ctx, device_index, *args, fn, **params):
    del device_index  # carries the outputs' varying axes; the row comes from partition_id
    return _lower(ctx, args, ctx.avals_in[1:], pass_context=True, fn=fn, **params)


def _jax_triton_lowering(ctx, *args, **params):
    call = compat.jax_triton_call(params, len(ctx.avals_out))
    return _lower(ctx, args, ctx.avals_in, pass_context=False, fn=call.fn, scalar_args=call.scalars,
                  out_shapes=params["out_shapes"], grid=call.grid, input_output_aliases=call.input_output_aliases,
                  zeroed_outputs=call.zeroed_outputs, result_params=call.result_params,
                  debug=call.debug, **call.metaparams)


def register() -> None:
    """Registers the CPU lowerings (idempotent; done on import of iris_jax)."""
    # not cacheable: every call site is lowered on its own, so it can be chained to the previous one
    mlir.register_lowering(iris_triton_call_p, _iris_lowering, platform=SIMULATOR.jax_platform, cacheable=False)
    mlir.register_lowering(compat.triton_kernel_call_p(), _jax_triton_lowering, platform=SIMULATOR.jax_platform,
                           cacheable=False)
