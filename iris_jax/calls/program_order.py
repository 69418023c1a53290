"""The simulator's kernel calls in program order across nested functions and control flow.

cpu_lowering chains each kernel call to the previous call of the same MLIR block (the previous
call's result is an extra, ignored operand), so that XLA:CPU, which runs independent operations
as soon as their inputs are ready and, where many are ready at once, on several threads, runs
them in program order on every device. A program's calls are not all in one block, though:

- a nested `jax.jit` (and the calls JAX makes for scan's partial evaluation, `closed_call`) is
  lowered as a function of its own, called from the caller's block. Its calls would be chained
  neither to the caller's calls before it nor to those after it. On the simulator a call whose
  body runs iris kernels is lowered inline instead (XLA inlines such calls anyway), so its calls
  are in the caller's block and chained there.
- a while loop (scan, fori_loop) or a cond runs its body as one operation of the enclosing
  block. One that runs iris kernels is ordered as a kernel call is: one of its operands (the
  smallest; a cond's branch index) first passes through a gate, a no-op custom call that also
  takes the previous kernel call's result, and the next kernel call takes one of its results.
  The calls inside are chained in their own block, and run while the loop or cond runs.

Without this, two collectives of different groups (a ppermute ring in a nested jit beside an
all-reduce, as pipeline x tensor parallel code has) could run in one order on one device and in
the other order on another, and wait for each other forever; one GPU stream never does that.
The GPU lowering is not affected (these rules are registered for the simulator's platform).
"""

from __future__ import annotations

import ctypes

import jax
import numpy as np
from jax._src import ad_checkpoint, core, custom_derivatives, shard_map
from jax._src.interpreters import mlir as jax_mlir
from jax._src.interpreters import partial_eval as pe
from jax._src.lax.control_flow import conditionals, loops
from jax._src.lib import xla_client
from jax.interpreters import mlir

from iris_core.platform import SIMULATOR
from iris_jax import compat
from iris_jax.calls import cpu_lowering
from iris_jax.calls._ffi import register_cpu_target
from iris_jax.calls.triton_call import IrisKernelEffect

# the primitives whose calls cpu_lowering chains (iris_jax.collectives' iris_collective lowers to kernel calls,
# or to the simulator's host collectives, which carry no effect but pair by call count all the same)
_CALLS = ("iris_triton_call", "triton_kernel_call", "iris_collective")


def _runs_kernels(*jaxprs) -> bool:
    """Whether any of `jaxprs` (closed or not) makes a kernel call, at any depth."""
    def found(jaxpr) -> bool:
        jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
        if any(isinstance(e, IrisKernelEffect) for e in jaxpr.effects):
            return True
        return any(e.primitive.name in _CALLS or any(found(sub) for sub in core.jaxprs_in_params(e.params))
                   for e in jaxpr.eqns)
    return any(found(j) for j in jaxprs)


# -- calls: inline -------------------------------------------------------------------------
def _inline(ctx, args, jaxpr, name=None):
    closed = jaxpr if compat.is_closed_jaxpr(jaxpr) else pe.close_jaxpr(jaxpr)
    module_context = ctx.module_context
    if ctx.platforms is not None:
        module_context = module_context.replace(platforms=ctx.platforms)
    name_stack = ctx.name_stack.extend(name) if name else ctx.name_stack
    out, tokens = jax_mlir.jaxpr_subcomp(
        module_context, closed.jaxpr, name_stack, ctx.tokens_in,
        jax_mlir.ir_consts(closed.consts, [v.aval for v in closed.jaxpr.constvars]), *args,
        dim_var_values=ctx.dim_var_values, const_lowering=ctx.const_lowering,
        outer_traceback=xla_client.Traceback())
    ctx.set_tokens_out(tokens)
    return out


def _call_rule(original, jaxpr_param: str):
    def rule(ctx, *args, **params):
        jaxpr = params[jaxpr_param]
        if not _runs_kernels(jaxpr):
            return original(ctx, *args, **params)
        return _inline(ctx, args, jaxpr, params.get("name"))
    return rule


# -- while loops and conds: gated like a kernel call ----------------------------------------
def _region_rule(original, jaxprs_of):
    def rule(ctx, *args, **params):
        if not _runs_kernels(*jaxprs_of(params)):
            return original(ctx, *args, **params)
        block = mlir.ir.InsertionPoint.current.block
        previous = cpu_lowering._previous_call(ctx)
        first_new = len(block.operations)
        outs = original(ctx, *args, **params)
        ops = [block.operations[i] for i in range(first_new, len(block.operations))]
        regions = [op for op in ops if op.name in ("stablehlo.while", "stablehlo.case")]
        if not regions:  # nothing to order (not expected)
            return outs
        op = regions[-1]
        if previous is not None:
            index = 0 if op.name == "stablehlo.case" else _smallest(op.operands)
            if index is not None:
                value = op.operands[index]
                with mlir.ir.InsertionPoint(op):
                    gated = _gate(ctx, value, previous)
                op.operands[index] = gated
        after = _smallest(op.results)
        if after is not None:
            cpu_lowering._remember_call(ctx, op.results[after], _aval(op.results[after].type))
        return outs
    return rule


def _smallest(values):
    """The index of the array value with the fewest elements (None: no array values)."""
    sizes = [(int(np.prod(v.type.shape)), i) for i, v in enumerate(values)
             if isinstance(v.type, mlir.ir.RankedTensorType)]
    return min(sizes)[1] if sizes else None


_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16",
           "bfloat16", "float32", "float64", "complex64", "complex128")


def _aval(ir_type) -> core.ShapedArray:
    tensor = mlir.ir.RankedTensorType(ir_type)
    element = str(tensor.element_type)
    for name in _DTYPES:
        dtype = np.dtype(name) if name != "bfloat16" else np.dtype(jax_mlir.dtypes.bfloat16)
        if str(mlir.dtype_to_ir_type(dtype)) == element:
            return core.ShapedArray(tuple(tensor.shape), dtype)
    # another element type: a byte array of its size orders it as well (only the layout is read)
    return core.ShapedArray(tuple(tensor.shape), np.dtype(np.uint8))


def _gate(ctx, value, previous):
    """`value`, after the kernel call `previous` (a no-op custom call that takes both)."""
    aval = _aval(value.type)
    nbytes = int(np.prod(aval.shape)) * aval.dtype.itemsize

    def run(ins, outs):
        if nbytes and ins[0] != outs[0]:
            ctypes.memmove(outs[0], ins[0], nbytes)

    name = register_cpu_target("iris_cpu_order", run)
    gate_ctx = ctx.replace(primitive=None, avals_in=[aval, previous[1]], avals_out=[aval])
    (gated,) = jax.ffi.ffi_lowering(name, operand_output_aliases={0: 0}, has_side_effect=True)(
        gate_ctx, value, previous[0])
    return gated


def register() -> None:
    """Registers the simulator's rules (idempotent; done on import of iris_jax)."""
    platform = SIMULATOR.jax_platform
    calls = {compat.jit_primitive(): "jaxpr", core.closed_call_p: "call_jaxpr"}
    regions = {loops.while_p: lambda p: (p["cond_jaxpr"], p["body_jaxpr"]),
               conditionals.cond_p: lambda p: p["branches"]}
    for prim, param in calls.items():
        _wrap(prim, platform, lambda original, param=param: _call_rule(original, param))
    # JAX lowers an equation of a cacheable primitive into a function of its own, then copies
    # its body into the caller: the kernel calls inside would be chained in that function, not
    # to the caller's. Primitives that hold jaxprs are lowered in place instead (the same IR).
    for module, names in ((loops, ("scan_p", "while_p")), (conditionals, ("cond_p",)),
                          (ad_checkpoint, ("remat_p",)), (shard_map, ("shard_map_p",)),
                          (custom_derivatives, ("custom_jvp_call_p", "custom_vjp_call_p", "custom_vjp_call_jaxpr_p",
                                                "remat_opt_p", "linear_call_p"))):
        for prim_name in names:
            prim = getattr(module, prim_name, None)
            if prim is not None:
                jax_mlir._uncacheable_primitives.add(prim)
    for prim, jaxprs_of in regions.items():
        _wrap(prim, platform, lambda original, jaxprs_of=jaxprs_of: _region_rule(original, jaxprs_of))


def _wrap(prim, platform, make_rule) -> None:
    """Registers make_rule(JAX's own rule) as `prim`'s lowering on `platform`, once."""
    entry = jax_mlir._platform_specific_lowerings[platform].get(prim) or jax_mlir._lowerings[prim]
    if getattr(entry.rule, "_iris_program_order", False):
        return
    rule = make_rule(entry.rule)
    rule._iris_program_order = True
    mlir.register_lowering(prim, rule, platform=platform, cacheable=False)
