"""lax formulations of collectives that XLA:CPU does not run, to check iris against on the simulator.

`ragged_all_to_all(...)` has lax.ragged_all_to_all's signature and semantics, written with
lax.all_gather and selects (every member gathers every operand: a reference, not a fast path).
On GPUs compare with lax.ragged_all_to_all itself.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name,
                      axis_index_groups=None):
    """lax.ragged_all_to_all through lax.all_gather (see the module docstring); over
    `axis_index_groups`, within each group."""
    del recv_sizes  # the senders' sizes say the same
    operands, starts, sizes, targets = (lax.all_gather(v, axis_name, axis_index_groups=axis_index_groups) for v in
                                        (operand, input_offsets, send_sizes, output_offsets))
    members, slices = starts.shape[0], starts.shape[1] // starts.shape[0]
    me = _position(axis_name, axis_index_groups)
    rows = jnp.arange(output.shape[0])
    result = output
    for sender in range(members):
        for s in range(slices):
            k = me * slices + s
            start, size, target = starts[sender, k], sizes[sender, k], targets[sender, k]
            source = jnp.clip(rows - target + start, 0, operand.shape[0] - 1)
            hit = (rows >= target) & (rows < target + size) & (rows - target + start < operand.shape[0])
            result = jnp.where(hit.reshape(-1, *[1] * (output.ndim - 1)), operands[sender][source], result)
    return result


def _position(axis_name, groups):
    """This member's index in its group of `groups` (lax.axis_index where there are none)."""
    index = lax.axis_index(axis_name)
    if groups is None:
        return index
    table = [0] * sum(len(g) for g in groups)
    for group in groups:
        for position, member in enumerate(group):
            table[member] = position
    return jnp.asarray(table, index.dtype)[index]
