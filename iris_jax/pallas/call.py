"""`pallas_call`: Pallas's kernel call, with an iris context before the kernel's refs.

The context travels as one more input of the inner `pl.pallas_call` (its first ref, an
int32 row): the device's context row (rank, world size, heap bases), chosen in-graph as
for iris triton_call kernels. On the simulator the row also carries the addresses of the
symmetric operands (see iris_jax.pallas.simulator).

The inner call is wrapped in our own primitive, `iris_pallas_call`, which carries the
iris kernel effect (a kernel whose only effect is a remote write is not removed from the
jaxpr), marks Pallas's custom call as side-effecting (nor from the HLO), gives the
outputs the varying axes of the shard_map they run in, and on the simulator orders the
kernel after the previous iris kernel of the same computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import tree_util
from jax.experimental import pallas as pl
from jax.extend.core import Primitive
from jax.interpreters import mlir

from iris_core.errors import IrisError
from iris_core.heap.context_layout import context_words
from iris_core.platform import GPU, SIMULATOR
from iris_jax import _runtime as runtime_lib
from iris_jax.calls import cpu_lowering
from iris_jax.calls.operands import context_aval, context_operand
from iris_jax.calls.triton_call import _check_symmetric, _like, _manual_axes, iris_kernel_effect, vary
from iris_jax.pallas import _compat, simulator
from iris_jax.pallas.context import PallasContext

iris_pallas_call_p = Primitive("iris_pallas_call")
iris_pallas_call_p.multiple_results = True

# custom-call targets of Pallas's GPU backends (the Triton one in jax 0.10-0.12, Mosaic GPU)
_PALLAS_TARGETS = ("__gpu$xla.gpu.triton", "triton_kernel_call_ffi", "mosaic_gpu", "mosaic_gpu_v2")


def pallas_call(kernel: Callable[..., None], out_shape: Any, *, grid: int | Sequence[int] = (),
                in_specs: Sequence[Any] | None = None, out_specs: Any = None, symmetric: Sequence[int] = (),
                input_output_aliases: dict[int, int] | None = None, interpret: bool | None = None,
                num_warps: int | None = None, num_stages: int | None = None, name: str | None = None,
                debug: bool = False) -> Callable[..., Any]:
    """Like `jax.experimental.pallas.pallas_call`; `kernel(ctx, *in_refs, *out_refs)` also
    receives a PallasContext (rank, world size, remote ops on symmetric refs).

    Experimental: GPUs through Pallas's Triton backend (deprecated by JAX 0.11), the
    simulator through Pallas interpret mode.

    Args:
      kernel: the kernel; its first parameter receives the context.
      out_shape: as for Pallas.
      grid: as for Pallas.
      in_specs: as for Pallas (indices count the operands, not the context).
      out_specs: as for Pallas.
      symmetric: indices of operands that are heap arrays (iris_jax.zeros, to_heap, ...)
        reached on other ranks through `ctx`. Their block is the whole array: give no
        BlockSpec for them (None in `in_specs`).
      input_output_aliases: as for Pallas (indices count the operands, not the context).
      interpret: Pallas interpret mode; default: on the simulator (CPU devices), off on GPUs.
      num_warps: Triton's compiler parameter (GPUs).
      num_stages: Triton's compiler parameter (GPUs).
      name: as for Pallas.
      debug: as for Pallas.

    Returns:
      A function of the operands that returns the outputs; call it inside jax.jit
      (and jax.shard_map over several devices).
    """
    _compat.require()
    symmetric = tuple(symmetric)
    aliases = dict(input_output_aliases or {})

    def call(*args):
        rt = runtime_lib.runtime()
        flat_args, in_tree = tree_util.tree_flatten(args)
        if in_tree != tree_util.tree_structure(tuple(flat_args)):
            raise TypeError("iris_jax.pallas.pallas_call takes arrays as operands, not pytrees")
        _check_symmetric(flat_args, symmetric)
        interpreted = rt.backend.interprets_kernels if interpret is None else bool(interpret)
        specs = _in_specs(in_specs, len(flat_args), symmetric)
        world_size = rt.world_size
        row_words = 2 * context_words(world_size) + (2 * len(symmetric) if interpreted else 0)

        def kernel_with_context(ctx_ref, *refs):
            kernel(PallasContext(ctx_ref, world_size, tuple(refs[i] for i in symmetric)), *refs)

        kernel_with_context.__name__ = getattr(kernel, "__name__", "iris_pallas_kernel")
        compiler_params = None
        if not interpreted:
            from jax.experimental.pallas import triton as plgpu

            compiler_params = plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)
        block_specs = {} if specs is None else {"in_specs": [pl.BlockSpec(), *specs]}
        if out_specs is not None:
            block_specs["out_specs"] = out_specs
        inner = pl.pallas_call(
            kernel_with_context, out_shape=out_shape, grid=grid, **block_specs,
            input_output_aliases={i + 1: o for i, o in aliases.items()}, interpret=interpreted,
            compiler_params=compiler_params, name=name or kernel_with_context.__name__, debug=debug)
        row = jax.ShapeDtypeStruct((row_words,), jnp.int32)
        # traces the kernel now, so that mistakes in it surface here and not at lowering
        out_struct = _out_shapes(inner, row, flat_args)
        flat_outs, out_tree = tree_util.tree_flatten(out_struct)
        axes = _manual_axes()
        device_index = vary(jnp.zeros((), jnp.int32), axes) if axes else jnp.zeros((), jnp.int32)
        results = iris_pallas_call_p.bind(
            device_index, *flat_args, inner=inner, symmetric=symmetric, interpreted=interpreted,
            row_words=row_words, kernel_name=kernel_with_context.__name__,
            out_shapes=tuple(jax.ShapeDtypeStruct(o.shape, o.dtype) for o in flat_outs))
        return tree_util.tree_unflatten(out_tree, results)

    return call


def _out_shapes(inner, row, flat_args):
    """The inner call's output shapes, traced as at lowering: outside the shard_map's
    varying-axes typing (the outputs get their varying axes from iris_pallas_call)."""
    from jax._src import config

    structs = [jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a)) for a in flat_args]
    with config._check_vma(False):
        return jax.eval_shape(inner, row, *structs)


def _in_specs(in_specs, count: int, symmetric: tuple[int, ...]):
    """The operands' BlockSpecs, whole-array blocks for the symmetric ones."""
    for i in symmetric:
        if not 0 <= i < count:
            raise IndexError(f"symmetric index {i} out of range for {count} operands")
    if in_specs is None:
        return None
    specs = list(in_specs)
    if len(specs) != count:
        raise ValueError(f"in_specs has {len(specs)} entries for {count} operands")
    for i in symmetric:
        if specs[i] is not None and getattr(specs[i], "block_shape", None) is not None:
            raise ValueError(
                f"operand {i} is symmetric, so its block is the whole array (remote ops address it by heap "
                f"offset); pass None as its BlockSpec, not {specs[i]}")
    return [pl.BlockSpec() if s is None else s for s in specs]


@iris_pallas_call_p.def_effectful_abstract_eval
def _abstract_eval(device_index, *args, out_shapes, **_):
    return [_like(device_index, s.shape, s.dtype) for s in out_shapes], {iris_kernel_effect}


iris_pallas_call_p.def_impl(lambda *args, **params: jax.jit(
    lambda *a: iris_pallas_call_p.bind(*a, **params))(*args))


def _lowering(ctx, device_index, *args, inner, symmetric, interpreted, row_words, out_shapes, kernel_name):
    del device_index, out_shapes  # the index carries the outputs' varying axes only
    row = context_operand(ctx)
    avals = list(ctx.avals_in[1:])
    tail, tail_avals = [], []
    on_cpu = SIMULATOR.jax_platform in (ctx.module_context.platforms or ())
    if on_cpu:  # run in program order with the other iris kernels (see cpu_lowering)
        previous = cpu_lowering._previous_call(ctx)
        if previous is not None:
            tail, tail_avals = [previous[0]], [previous[1]]

    def body(row, *rest):
        operands, chain = rest[:len(avals)], rest[len(avals):]
        if interpreted:
            target = simulator.address_target(len(symmetric), bool(chain), context_aval().shape[0], kernel_name)
            row = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((row_words,), jnp.int32), has_side_effect=True)(
                row, *[operands[i] for i in symmetric], *chain)
        return tuple(tree_util.tree_leaves(inner(row, *operands)))

    # plain avals: the kernel is traced again here, outside the shard_map's varying-axes typing
    sub = ctx.replace(primitive=None, avals_in=[_plain(a) for a in (context_aval(), *avals, *tail_avals)],
                      avals_out=[_plain(a) for a in ctx.avals_out])
    block = mlir.ir.InsertionPoint.current.block
    first_new = len(list(block.operations))
    from jax._src import config

    with config._check_vma(False):
        results = mlir.lower_fun(body, multiple_results=True)(sub, row, *args, *tail)
    marked = _mark_side_effect(list(block.operations)[first_new:])
    if not interpreted and not marked:
        raise IrisError("could not find Pallas's custom call to keep it alive (an unknown Pallas backend?)")
    if on_cpu and results:
        cpu_lowering._remember_call(ctx, results[0], ctx.avals_out[0])
    return results


def _plain(aval):
    from jax._src import core as jax_core

    return jax_core.ShapedArray(aval.shape, aval.dtype)


def _mark_side_effect(operations) -> int:
    """Sets has_side_effect on Pallas's custom calls among `operations` (and nested ones)."""
    count = 0
    for op in operations:
        op = op.operation
        if op.name == "stablehlo.custom_call":
            target = mlir.ir.StringAttr(op.attributes["call_target_name"]).value
            if target in _PALLAS_TARGETS or target.startswith("mosaic"):
                op.attributes["has_side_effect"] = mlir.ir.BoolAttr.get(True)
                count += 1
        for region in op.regions:
            for blk in region.blocks:
                count += _mark_side_effect(list(blk.operations))
    return count


def _register() -> None:
    mlir.register_lowering(iris_pallas_call_p, _lowering, platform=GPU.jax_platform)
    mlir.register_lowering(iris_pallas_call_p, _lowering, platform=SIMULATOR.jax_platform, cacheable=False)


_register()
