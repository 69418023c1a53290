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

On GPUs jax-triton compiles the kernel and builds the custom call; we then point that call
at jaxlib's Triton FFI handler, registered as command-buffer compatible, so XLA can run iris
kernels inside its CUDA graphs (see "launch path" below).
"""

from __future__ import annotations

import os
import threading
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util
from jax._src import core, effects
from jax.extend.core import Primitive
from jax.interpreters import mlir

from iris_core.errors import IrisError
from iris_jax import _runtime as runtime_lib
from iris_jax.workspace import workspaces


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
            f"mesh: {names}); put all axes in the shard_map (axis_names=...)")
    return names if manual else ()


def triton_call(*args: Any, kernel, out_shape, grid, name: str = "",
                custom_call_target_name: str = "triton_kernel_call", num_warps: int | None = None,
                num_stages: int | None = None, num_ctas: int = 1, compute_capability: int | None = None,
                enable_fp_fusion: bool = True, input_output_aliases: dict[int, int] | None = None,
                zeroed_outputs: Sequence[int] | Callable = (), debug: bool = False,
                serialized_metadata: bytes = b"", symmetric: Sequence[int] = (),
                group_axes: tuple[str, ...] | None = None, workspace: str = "collective",
                out_varying: tuple[str, ...] | None = None, **metaparams: Any):
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
        `lax.axis_index(group_axes)`; the workspace: see iris_jax.workspace).
      workspace: which part of the group's workspace that offset points to: "collective"
        (the collective kernels') or "fused" (the fused GEMM ops').
      out_varying: mesh axes the outputs vary over (default: every manual axis); a
        collective whose result is the same across an axis leaves that axis out.
    """
    runtime_lib.runtime()  # created lazily here, before anything is traced
    out_shape = tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), out_shape)
    flat_args, _ = tree_util.tree_flatten(args)
    flat_out_shapes, out_tree = tree_util.tree_flatten(out_shape)
    _check_symmetric(flat_args, symmetric)

    array_args, scalar_args = [], []
    for i, arg in enumerate(flat_args):
        if isinstance(arg, (bool, int, float, np.float32)):
            from jax_triton.triton_lib import get_triton_type

            scalar_args.append((i + 1, get_triton_type(arg), float(arg) if isinstance(arg, np.float32) else arg))
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
        symmetric=symmetric_operands, group_axes=tuple(group_axes) if group_axes else None, workspace=workspace,
        **metaparams)
    return tree_util.tree_unflatten(out_tree, out_flat)


def varying_axes(x) -> frozenset:
    """The manual mesh axes `x` varies over (jax 0.10 calls it manual_axis_type, later vma)."""
    aval = core.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(vma)


def vary(x, axes):
    """`x` marked as varying over `axes` (no-op for what already varies)."""
    missing = tuple(a for a in axes if a not in varying_axes(x))
    return lax.pcast(x, missing, to="varying") if missing else x


def _check_symmetric(flat_args, symmetric):
    from iris_jax.arrays import require_symmetric

    for i in symmetric:
        if not 0 <= i < len(flat_args):
            raise IndexError(f"symmetric index {i} out of range for {len(flat_args)} arguments")
        if isinstance(flat_args[i], jax.Array) and not isinstance(flat_args[i], core.Tracer):
            require_symmetric(flat_args[i], f"argument {i}")


# -- lowering -------------------------------------------------------------------------
def devices_of(ctx) -> list:
    """The devices of the computation being lowered, in partition (mesh) order."""
    from jax._src.sharding_impls import ShardingContext, SPMDAxisContext

    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, SPMDAxisContext):
        return list(axis_context.mesh.devices.flat)
    if isinstance(axis_context, ShardingContext):
        assignment = axis_context.device_assignment
        if axis_context.num_devices == 1:
            return [assignment[0] if assignment else runtime_lib.runtime().devices[0]]
        raise IrisError(
            f"an iris kernel in a computation over {axis_context.num_devices} devices must run "
            "inside jax.shard_map (each device needs its own context)")
    raise IrisError(f"cannot place an iris kernel in axis context {type(axis_context).__name__}")


def per_device_operand(ctx, table: np.ndarray):
    """Lowers `table[partition_id]`: one int32 row per device of the computation.

    In a fully manual shard_map the partition id is the device's linear position in the
    mesh; a single-device computation uses the one row as a constant.
    """
    from jax._src.lib.mlir.dialects import hlo

    if table.shape[0] == 1:
        return mlir.ir_constant(np.ascontiguousarray(table[0]))
    index = hlo.convert(mlir.ir.RankedTensorType.get([], mlir.ir.IntegerType.get_signless(32)),
                        hlo.partition_id())
    row_aval = core.ShapedArray(table.shape[1:], np.int32)
    sub = ctx.replace(primitive=None, avals_in=[core.ShapedArray((), np.int32)], avals_out=[row_aval])
    (row,) = mlir.lower_fun(lambda i: (jnp.asarray(table)[i],), multiple_results=True)(sub, index)
    return row


def context_operand(ctx):
    """This device's context row (see per_device_operand)."""
    return per_device_operand(ctx, runtime_lib.runtime().context_table(devices_of(ctx)))


def group_table(ctx, group_axes: tuple[str, ...], workspace: str = "collective") -> np.ndarray:
    """Per device: [index in its group over `group_axes`, global ranks of the group's members,
    heap offset of the partition's `workspace` part as two int32 words (low, high)].

    Raises:
      CrossDomainError: a group spans domains (see Runtime.domains), before anything runs.
    """
    from jax._src.sharding_impls import SPMDAxisContext

    rt = runtime_lib.runtime()
    axis_context = ctx.module_context.axis_context
    if not isinstance(axis_context, SPMDAxisContext):
        raise IrisError(f"collectives over {group_axes} must run inside jax.shard_map")
    mesh = axis_context.mesh
    names = list(mesh.axis_names)
    for a in group_axes:
        if a not in names:
            raise NameError(f"unbound axis name: {a} (mesh axes: {tuple(names)})")
    devices = mesh.devices
    order = [names.index(a) for a in group_axes]
    rows = []
    for position in np.ndindex(devices.shape):
        members = []
        for member in np.ndindex(*[devices.shape[i] for i in order]):
            p = list(position)
            for axis, coord in zip(order, member):
                p[axis] = coord
            members.append(rt.rank_of(devices[tuple(p)]))
        index = int(np.ravel_multi_index([position[i] for i in order], [devices.shape[i] for i in order]))
        rows.append([index, *members])
    for group in {tuple(row[1:]) for row in rows}:  # heaps map only within a domain
        rt.check_one_domain(group, f"an iris kernel over mesh axes {tuple(group_axes)}")
    offset = workspaces(rt).offset_for((row[1:] for row in rows), workspace)
    return np.asarray([[*row, offset & 0xFFFFFFFF, offset >> 32] for row in rows], np.int64).astype(np.int32)


def extra_operands(ctx, group_axes, workspace="collective"):
    """Operands prepended to the kernel's arguments: the context row, then the group row."""
    operands = [context_operand(ctx)]
    avals = [context_aval()]
    if group_axes:
        table = group_table(ctx, group_axes, workspace)
        operands.append(per_device_operand(ctx, table))
        avals.append(core.ShapedArray(table.shape[1:], np.int32))
    return operands, avals


def context_aval() -> core.ShapedArray:
    return core.ShapedArray(runtime_lib.runtime().context(0).shape, np.int32)


def _gpu_lowering(ctx, device_index, *args, fn, symmetric, group_axes, workspace, scalar_args,
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


mlir.register_lowering(iris_triton_call_p, _gpu_lowering, platform="cuda")
