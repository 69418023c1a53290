"""`triton_call`: jax-triton's kernel call, with the device's iris context as first argument.

    out = iris_jax.triton_call(x, kernel=my_kernel, out_shape=x, grid=(4,), BLOCK=256)

runs `my_kernel(context_ptr, x_ptr, out_ptr, BLOCK=256)` where `context_ptr` is the
context of the device the call runs on, so the kernel can do
`ctx = Context.initialize(context_ptr, WORLD_SIZE)` and reach every rank's heap.

How the context gets there: at trace time we bind `iris_triton_call` with the device's
linear index in the mesh (`axis_index` over every manual axis, or 0 outside shard_map).
At lowering the concrete devices are known, so the context table (one row per device, in
mesh order) becomes a constant and the row is selected in-graph. The primitive carries an
effect, so a kernel whose only output is a remote write is not removed, and its outputs
vary over the same mesh axes as that index, so `check_vma=True` programs type-check.

Lowering: on GPUs, iris_jax.calls.gpu_lowering (jax-triton's custom call, pointed at XLA's CUDA
graphs); on the simulator, iris_jax.calls.cpu_lowering. Both prepend the operands of
iris_jax.calls.operands (the device's context row, and its group's row for collectives).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util
from jax._src import core, effects
from jax.extend.core import Primitive

from iris_core import faults
from iris_core.errors import IrisError
from iris_jax import _runtime as runtime_lib
from iris_jax import compat
from iris_jax._runtime.arrays import require_symmetric
from iris_jax.compat import triton_type


class IrisKernelEffect(effects.Effect):
    """The kernel may read or write memory outside its operands (peers' heaps)."""

    def __str__(self):
        return "IrisKernel"


iris_kernel_effect = IrisKernelEffect()
for _effect_set in (effects.lowerable_effects, effects.control_flow_allowed_effects,
                    effects.custom_derivatives_allowed_effects, effects.remat_allowed_effects):
    _effect_set.add_type(IrisKernelEffect)

iris_triton_call_p = Primitive("iris_triton_call")
iris_triton_call_p.multiple_results = True


@iris_triton_call_p.def_effectful_abstract_eval
def _abstract_eval(device_index, *args, out_shapes, **_):
    index_aval = device_index
    outs = [_like(index_aval, s.shape, s.dtype) for s in out_shapes]
    return outs, {iris_kernel_effect}


def _like(aval, shape, dtype):
    """An aval of `shape`/`dtype` that varies over the same manual axes as `aval`."""
    sharding = getattr(aval, "sharding", None)
    kwargs = dict(shape=tuple(shape), dtype=np.dtype(dtype), weak_type=False)
    if sharding is not None and hasattr(sharding, "mesh"):
        kwargs["sharding"] = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    return aval.update(**kwargs)


iris_triton_call_p.def_impl(lambda *args, **params: jax.jit(
    lambda *a: iris_triton_call_p.bind(*a, **params))(*args))


def _manual_axes() -> tuple[str, ...]:
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty:
        return ()
    manual = getattr(mesh, "manual_axes", ())
    names = tuple(mesh.axis_names)
    if manual and set(manual) != set(names):
        raise IrisError(
            f"iris kernels need every mesh axis manual inside shard_map (manual: {tuple(manual)}, "
            f"mesh: {names}); put all axes in the shard_map (axis_names=...), or call the kernel in a shard_map "
            "over the automatic axes nested in this one, under jax.set_mesh (iris's collectives do that themselves)")
    return names if manual else ()


def triton_call(*args: Any, kernel, out_shape, grid, name: str = "",
                custom_call_target_name: str = "triton_kernel_call", num_warps: int | None = None,
                num_stages: int | None = None, num_ctas: int = 1, compute_capability: int | None = None,
                enable_fp_fusion: bool = True, input_output_aliases: dict[int, int] | None = None,
                zeroed_outputs: Sequence[int] | Callable = (), debug: bool = False,
                serialized_metadata: bytes = b"", symmetric: Sequence[int] = (),
                group_axes: tuple[str, ...] | None = None, axis_index_groups: tuple | None = None,
                workspace: str = "collective", out_varying: tuple[str, ...] | None = None, **metaparams: Any):
    """Calls a Triton kernel whose first parameter receives the iris context.

    Same arguments as `jax_triton.triton_call` (the context is not among `args`; indices
    in `input_output_aliases` count `args` only), plus:

    Args:
      symmetric: indices of `args` that must be arrays on the symmetric heap (the kernel
        translates their pointers to peers). A concrete array that is not raises
        NotOnHeapError before anything runs; the simulator also checks inside jit.
      group_axes: mesh axes forming a communication group; the kernel then receives, right
        after the context, an int32 array [my index in the group, global rank of member 0,
        ..., member G-1, workspace offset low, high] (members in the order of
        `lax.axis_index(group_axes)`; the workspace: see iris_jax._runtime.workspace).
      axis_index_groups: with `group_axes`, equal-sized groups of their axis indices that
        partition them (as lax's collectives take them): the group is then this device's
        group, its members in the group's order.
      workspace: which part of the group's workspace that offset points to: "collective"
        (the collective kernels') or "fused" (the fused GEMM ops').
      out_varying: mesh axes the outputs vary over (default: every manual axis); a
        collective whose result is the same across an axis leaves that axis out.

    Returns:
      The kernel's outputs, shaped as `out_shape` (one array, or a list for a list).

    Raises:
      NotOnHeapError: a concrete `symmetric` operand is not on the heap.
      IrisError: the call cannot run here (e.g. inside a partially manual `shard_map`), or a
        fault an iris kernel recorded before.
    """
    runtime_lib.runtime().raise_faults()  # created lazily here, before anything is traced; a past fault raises
    if isinstance(metaparams.get("WHAT"), str):  # the op a fault record of the kernel names
        faults.named(metaparams["WHAT"], getattr(kernel, "__name__", None))
    out_shape = tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), out_shape)
    flat_args, _ = tree_util.tree_flatten(args)
    flat_out_shapes, out_tree = tree_util.tree_flatten(out_shape)
    _check_symmetric(flat_args, symmetric)

    array_args, scalar_args = [], []
    for i, arg in enumerate(flat_args):
        if isinstance(arg, (bool, int, float, np.float32)):
            scalar_args.append((i + 1, triton_type(arg), float(arg) if isinstance(arg, np.float32) else arg))
        else:
            array_args.append(arg)

    positions = [i for i, a in enumerate(flat_args) if not isinstance(a, (bool, int, float, np.float32))]
    symmetric_operands = tuple(sorted(positions.index(i) for i in symmetric))
    axes = _manual_axes()
    varying = axes if out_varying is None else tuple(a for a in axes if a in out_varying)
    # the outputs' avals are derived from this operand's, so it carries their varying axes
    device_index = vary(jnp.zeros((), jnp.int32), varying) if varying else jnp.zeros((), jnp.int32)
    out_flat = iris_triton_call_p.bind(
        device_index, *array_args,
        fn=kernel, scalar_args=tuple(scalar_args), name=name,
        custom_call_target_name=custom_call_target_name, out_shapes=tuple(flat_out_shapes), grid=grid,
        num_warps=num_warps, num_stages=num_stages, num_ctas=num_ctas,
        compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion,
        input_output_aliases=tuple((i + 1, o) for i, o in (input_output_aliases or {}).items()),
        zeroed_outputs=zeroed_outputs, debug=debug, serialized_metadata=serialized_metadata,
        symmetric=symmetric_operands, group_axes=tuple(group_axes) if group_axes else None,
        axis_index_groups=tuple(map(tuple, axis_index_groups)) if axis_index_groups else None, workspace=workspace,
        **metaparams)
    return tree_util.tree_unflatten(out_tree, out_flat)


def kernel_arguments(operands: Sequence, scalars: Sequence[tuple], outputs: Sequence) -> list:
    """A kernel's arguments in launch order: the operands with each scalar (position, value)
    inserted at its position, then the outputs (jax-triton's order)."""
    args = list(operands)
    for position, value in sorted(scalars, key=lambda s: s[0]):
        args.insert(position, value)
    return args + list(outputs)


def aval_nbytes(aval) -> int:
    """The bytes of an array of `aval`'s shape and dtype."""
    return int(np.dtype(aval.dtype).itemsize * np.prod(aval.shape, dtype=np.int64))


def normalize_grid(grid, constexprs) -> tuple[int, int, int]:
    """A launch grid (an int, a tuple of up to 3, or a function of the constexprs) as 3 ints."""
    grid = grid(constexprs) if callable(grid) else grid
    grid = (grid,) if isinstance(grid, int) else tuple(grid)
    if len(grid) > 3:
        raise ValueError(f"a kernel's grid has at most three dimensions, not {len(grid)}: {grid}")
    return tuple(int(g) for g in grid) + (1,) * (3 - len(grid))


def varying_axes(x) -> frozenset:
    """The manual mesh axes `x` varies over."""
    return compat.varying_axes(core.typeof(x))


def vary(x, axes):
    """`x` marked as varying over `axes` (no-op for what already varies)."""
    missing = tuple(a for a in axes if a not in varying_axes(x))
    return lax.pcast(x, missing, to="varying") if missing else x


def _check_symmetric(flat_args, symmetric):
    for i in symmetric:
        if not 0 <= i < len(flat_args):
            raise IndexError(f"symmetric index {i} out of range for {len(flat_args)} arguments")
        if isinstance(flat_args[i], jax.Array) and not isinstance(flat_args[i], core.Tracer):
            require_symmetric(flat_args[i], f"argument {i}")
