"""ragged_all_to_all: uneven, data-dependent slices of rows between every pair of members (the
dispatch and combine of expert-parallel mixture-of-experts layers).

One call of six operands (operand, output, input_offsets, send_sizes, output_offsets,
recv_sizes), lax's semantics; its own kernel (iris_core.collectives.ragged): each receiver
pulls the rows of the slices meant for it straight into its output, the sizes travelling with
the first flag round. recv_sizes is lax's statement of what arrives; the kernel takes the
sizes from their senders. lax's own jvp and batching rules apply (run on iris); its transpose
with the output's cotangent masked exactly (`_transpose`). `axis_index_groups` (equal-sized, a
group of one included) run as the groups of the other collectives do: each its own group.
Across domains: XLA (no composition here).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax._src.interpreters import ad

from iris_core import flag_protocol
from iris_core.collectives import ragged
from iris_core.launch import vector_width
from iris_jax import _runtime as runtime_lib
from iris_jax._runtime.workspace import workspaces
from iris_jax.calls.triton_call import triton_call
from iris_jax.calls.triton_call import varying_axes as vma
from iris_jax.collectives import domains, dtypes, lowering
from iris_jax.collectives.registry import Rule, register
from iris_jax.compat import lax_parallel

_TABLE_ENTRY = 3 * 8  # a slice's (input offset, size, output offset), int64


def _check(operand, output, vectors, G: int):
    """lax's requirements that XLA would otherwise find at run time, raised before anything runs."""
    lengths = {v.shape[0] for v in vectors}
    if len(lengths) != 1:
        raise ValueError(f"ragged_all_to_all input_offsets, send_sizes, output_offsets and recv_sizes must have "
                         f"the same length, got {[v.shape[0] for v in vectors]}")
    (K,) = lengths
    if K % G:
        raise ValueError(f"ragged_all_to_all offsets and sizes have {K} entries, which is not a multiple of the "
                         f"{G} members of the group")
    if operand.ndim < 1 or operand.shape[1:] != output.shape[1:] or operand.dtype != output.dtype:
        raise TypeError(f"ragged_all_to_all operand and output must share dtype and every dimension but the "
                        f"first, got {operand.dtype}{list(operand.shape)} and {output.dtype}{list(output.shape)}")
    return K // G


def _lower(collective, params, config, axes, G, xs):
    operand, output, input_offsets, send_sizes, output_offsets, recv_sizes = xs
    slices = _check(operand, output, (input_offsets, send_sizes, output_offsets, recv_sizes), G)
    N, M = operand.shape[0], output.shape[0]
    if N == 0 or M == 0 or math.prod(operand.shape[1:]) == 0:  # nothing can be sent or received
        return [output]
    rows, _ = dtypes.encode(operand, None)  # rows move as the kernel takes them
    buffer, decode = dtypes.encode(output, None)
    R = math.prod(rows.shape[1:])
    out = launch(rows.reshape(N, R), buffer.reshape(M, R), input_offsets, send_sizes, output_offsets, slices,
                 axes, G, config, params.get("axis_index_groups"))
    return [decode(out.reshape(buffer.shape))]


def launch(x, output, input_offsets, send_sizes, output_offsets, slices: int, axes, G: int, config, groups=None):
    """The ragged kernel on x [N, R] into output [M, R] (aliased); `groups`: lax's
    axis_index_groups (the kernel's group is then the device's group of them, of G members)."""
    rt = runtime_lib.runtime()
    ws = workspaces(rt)
    layout = ws.layout
    (N, R), M, itemsize = x.shape, output.shape[0], x.dtype.itemsize
    if R * itemsize > layout.data_bytes:
        raise ValueError(f"ragged_all_to_all rows of {R * itemsize} bytes exceed the workspace buffer of "
                         f"{layout.data_bytes} bytes (IRIS_WORKSPACE_BYTES)")
    rows = min(N, min(layout.data_bytes, config.chunk_bytes or layout.data_bytes) // (R * itemsize) or 1)
    largest_block, max_programs, num_warps = lowering.launch_config(rt, config)
    table_lines = layout.data_bytes // (G * slices * _TABLE_ENTRY)  # programs whose slice tables fit
    if table_lines < 1:
        raise ValueError(f"ragged_all_to_all with {G * slices} slices per member exceeds the workspace")
    programs = min(rows, max_programs, table_lines)
    if rows == N:
        # the largest class decided the above; a call of one window takes the least class whose
        # buffers hold that window (data) and every program's slice table (data2): the same
        # window and grid, only the buffers' offsets (DATA, DATA2, DATA_BYTES) differ
        layout = ws.fitting("collective", max(N * R * itemsize, programs * G * slices * _TABLE_ENTRY))
    key = ws.key("collective", layout)
    block = max(16, min(largest_block, 1 << max(R - 1, 0).bit_length()))
    vec = vector_width(R, itemsize)
    lowering.record(lowering.Launched("ragged_all_to_all", tuple(axes), groups, key))
    varying = vma(x) | vma(output) | vma(input_offsets) | vma(send_sizes) | vma(output_offsets) | set(axes)
    return triton_call(
        x, output, input_offsets, send_sizes, output_offsets, N, M, R, rows, kernel=ragged.ragged_kernel,
        out_shape=jax.ShapeDtypeStruct((M, R), x.dtype), grid=(programs,), num_warps=num_warps, group_axes=axes,
        axis_index_groups=groups, input_output_aliases={1: 0}, workspace=key, out_varying=tuple(varying),
        **ragged.launch_constants(G=G, world=rt.world_size, slices=slices, block=block, layout=layout,
                                  timeout_ns=flag_protocol.timeout_ns(config.timeout_s), vec=vec))


def _transpose(ct, operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name,
               axis_index_groups):
    """lax's transpose (the cotangent goes back the way the rows came), but the output's
    cotangent is zero exactly on the received rows: lax's mask, a cumulative sum of slice
    starts and ends, is wrong where an empty slice starts at another's end (a common case:
    an expert that got no tokens). Traced on iris (run_on_iris), lax's signature."""
    lax = lax_parallel
    groups = axis_index_groups  # (lax's own transpose exchanges the offsets over the whole axis)
    output_at = lax.all_to_all(output_offsets, axis_name, 0, 0, tiled=True, axis_index_groups=groups)
    input_at = lax.all_to_all(input_offsets, axis_name, 0, 0, tiled=True, axis_index_groups=groups)
    operand_t = output_t = None
    if ad.is_undefined_primal(operand):
        operand_t = lax.ragged_all_to_all_p.bind(ct, ad.zeros_like_aval(operand.aval), output_at,
                                                 recv_sizes, input_at, send_sizes, axis_name=axis_name,
                                                 axis_index_groups=axis_index_groups)
    if ad.is_undefined_primal(output):
        received = _received_rows(ct.shape[0], output_at, recv_sizes)
        output_t = jnp.where(received.reshape(-1, *[1] * (ct.ndim - 1)), jnp.zeros_like(ct), ct)
    return [operand_t, output_t, None, None, None, None]


def _received_rows(n: int, starts, sizes):
    """Which of `n` output rows lie in a received slice (rows starts[k], + sizes[k]), as a bool
    vector. Broadcast and typed explicitly: iris's code runs under a user's strict settings
    (jax_numpy_rank_promotion='raise', jax_numpy_dtype_promotion='strict')."""
    rows = jnp.arange(n, dtype=starts.dtype)[:, None]
    starts, ends = starts[None, :], (starts + sizes.astype(starts.dtype))[None, :]
    return ((rows >= starts) & (rows < ends)).any(axis=1)


def _plan(params, nbytes, sizes, inside, across, config):
    return domains.plan_on_xla("ragged_all_to_all", tuple(params["axis_name"]), nbytes, inside)


def _lower_across(collective, params, config, inside, across, xs):
    return [collective.bind(*xs, **params)]


def _detail(params, config) -> str:
    return "ragged kernel: receivers pull their slices into the output"


register(Rule(name="ragged_all_to_all", primitives=("ragged_all_to_all",), lower=_lower, plan=_plan,
              lower_across=_lower_across, operands=6,
              sends_when_trivial=True, transpose=_transpose, detail=_detail, runs_groups=True))
