"""What every iris kernel call receives before its own arguments, built at lowering time.

The concrete devices are known at lowering, so per-device tables (one row per device, in
mesh order) become constants and each device selects its row in-graph by partition id:

* the context row: the device's rank and every rank's heap base, as its own process maps
  them (Runtime.context);
* for collectives and fused ops, the group row: the device's index in its group over the
  collective's axes (or in its group of `axis_index_groups` over them), the group's global
  ranks, and the heap offset of the group's workspace (iris_jax._runtime.workspace; one workspace per
  partition of the ranks).

On the simulator (`partition_operands`) the rows are not selected in-graph: the call receives
the partition id and the whole tables, and its handler picks the rows (`pick_rows`). XLA:CPU
compiles each in-graph selection into a kernel of its own (LLVM), which made compiling an iris
program four times as slow as lax's; a constant and the partition id need no code.
"""

from __future__ import annotations

import ctypes

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import core
from jax.interpreters import mlir

from iris_core.collectives import group_layout
from iris_core.errors import IrisError
from iris_jax import _runtime as runtime_lib
from iris_jax._runtime.workspace import workspaces
from iris_jax.compat import context_concrete_mesh


def devices_of(ctx) -> list:
    """The devices of the computation being lowered, in partition (mesh) order."""
    from jax._src.sharding_impls import ShardingContext, SPMDAxisContext

    axis_context = ctx.module_context.axis_context
    if isinstance(axis_context, SPMDAxisContext):
        return list(concrete(axis_context.mesh).devices.flat)
    if isinstance(axis_context, ShardingContext):
        assignment = axis_context.device_assignment
        if axis_context.num_devices == 1:
            return [assignment[0] if assignment else runtime_lib.runtime().devices[0]]
        raise IrisError(
            f"an iris kernel in a computation over {axis_context.num_devices} devices must run "
            "inside jax.shard_map (each device needs its own context)")
    raise IrisError(f"cannot place an iris kernel in axis context {type(axis_context).__name__}")


def concrete(mesh):
    """`mesh` itself if concrete; for an abstract one (a shard_map nested in another takes the
    outer one's abstract mesh), the context's concrete mesh of the same axes."""
    if isinstance(mesh, jax.sharding.Mesh):
        return mesh
    found = context_concrete_mesh()
    if found is None or dict(found.shape) != dict(mesh.shape):
        raise IrisError(
            f"an iris kernel in a shard_map nested in another, over the abstract mesh {dict(mesh.shape)}, needs "
            "the concrete devices: call the program under jax.set_mesh(mesh)")
    return found


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


def group_table(ctx, group_axes: tuple[str, ...], workspace: str = "collective",
                axis_index_groups: tuple | None = None) -> np.ndarray:
    """Per device: [index in its group over `group_axes`, global ranks of the group's members,
    heap offset of the partition's `workspace` part as two int32 words (low, high)].

    A group is every device that differs from this one only along `group_axes`, numbered as
    `lax.axis_index(group_axes)` numbers them; with `axis_index_groups` (equal-sized groups of
    those indices, covering each once, as lax takes them) it is the devices whose index lies
    in this device's group, in the group's order.

    Raises:
      CrossDomainError: a group spans domains (see Runtime.domains), before anything runs.
    """
    from jax._src.sharding_impls import SPMDAxisContext

    rt = runtime_lib.runtime()
    axis_context = ctx.module_context.axis_context
    if not isinstance(axis_context, SPMDAxisContext):
        raise IrisError(f"collectives over {group_axes} must run inside jax.shard_map")
    mesh = concrete(axis_context.mesh)
    names = list(mesh.axis_names)
    for a in group_axes:
        if a not in names:
            raise NameError(f"unbound axis name: {a} (mesh axes: {tuple(names)})")
    devices = mesh.devices
    order = [names.index(a) for a in group_axes]
    sizes = [devices.shape[i] for i in order]
    groups = axis_index_groups or (tuple(range(int(np.prod(sizes)))),)  # default: one group, the axes
    group_of = {index: group for group in groups for index in group}
    groups_of = []  # per device: (its index in its group, the group's ranks)
    for position in np.ndindex(devices.shape):
        mine = int(np.ravel_multi_index([position[i] for i in order], sizes))  # lax.axis_index(group_axes)
        members = []
        for member in group_of[mine]:
            p = list(position)
            for axis, coord in zip(order, np.unravel_index(member, sizes)):
                p[axis] = coord
            members.append(rt.rank_of(devices[tuple(p)]))
        groups_of.append((group_of[mine].index(mine), members))
    for group in {tuple(members) for _, members in groups_of}:  # heaps map only within a domain
        rt.check_one_domain(group, f"an iris kernel over mesh axes {tuple(group_axes)}")
    offset = workspaces(rt).offset_for((members for _, members in groups_of), workspace)
    rows = [group_layout.encode(index, members, offset) for index, members in groups_of]
    return np.asarray(rows, np.int64).astype(np.int32)


def _tables(ctx, group_axes, workspace, axis_index_groups) -> list[np.ndarray]:
    """The context table, then with `group_axes` the group table."""
    tables = [runtime_lib.runtime().context_table(devices_of(ctx))]
    if group_axes:
        tables.append(group_table(ctx, group_axes, workspace, axis_index_groups))
    return tables


def extra_operands(ctx, group_axes, workspace="collective", axis_index_groups=None):
    """Operands prepended to the kernel's arguments: the context row, then the group row."""
    tables = _tables(ctx, group_axes, workspace, axis_index_groups)
    return ([per_device_operand(ctx, t) for t in tables],
            [core.ShapedArray(t.shape[1:], np.int32) for t in tables])


def partition_operands(ctx, group_axes, workspace="collective", axis_index_groups=None):
    """extra_operands as the simulator's calls take them: the partition id (uint32), then the context
    table and, with `group_axes`, the group table, whole (constants); with the rows' sizes in bytes.
    The call's handler picks this device's rows with pick_rows."""
    from jax._src.lib.mlir.dialects import hlo

    tables = _tables(ctx, group_axes, workspace, axis_index_groups)
    operands = [hlo.partition_id(), *(mlir.ir_constant(np.ascontiguousarray(t, np.int32)) for t in tables)]
    avals = [core.ShapedArray((), np.uint32), *(core.ShapedArray(t.shape, np.int32) for t in tables)]
    return operands, avals, tuple(4 * t.shape[1] for t in tables)


def pick_rows(pointers: list[int], row_bytes: tuple[int, ...]) -> list[int]:
    """A simulator call's operand pointers [partition id, *tables, *rest] (partition_operands) as
    [*this device's rows, *rest]."""
    partition = ctypes.c_uint32.from_address(pointers[0]).value
    return [table + partition * size for table, size in zip(pointers[1:], row_bytes)] + pointers[1 + len(row_bytes):]


def context_aval() -> core.ShapedArray:
    return core.ShapedArray(runtime_lib.runtime().context(0).shape, np.int32)
