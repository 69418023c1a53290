"""Host side of the group row that every collective and fused kernel receives second.

Layout, in int32 words, one row per device::

    [index of this device in its group, rank of member 0, ..., rank of member G-1,
     workspace offset low word, high word]

The offset is the heap offset of the group's partition's workspace (iris_jax._runtime.workspace).
Written by iris_jax.calls.operands.group_table; read on the device by iris_core.collectives.group
(member_rank, workspace_offset) and on the simulator's host by iris_jax.calls.cpu_execution.
"""

from __future__ import annotations

from collections.abc import Sequence

MEMBERS = 1  # the word of member 0
OFFSET_WORDS = 2  # the workspace offset after the members, as (low, high)


def encode(index: int, members: Sequence[int], workspace_offset: int) -> list[int]:
    """The row of the device at `index` of a group of `members` (global ranks)."""
    return [index, *members, workspace_offset & 0xFFFFFFFF, workspace_offset >> 32]


def members(row: Sequence[int]) -> list[int]:
    """The global ranks of the row's group, in the group's order."""
    return [int(m) for m in row[MEMBERS:len(row) - OFFSET_WORDS]]


def group_key(row: Sequence[int]) -> list[int]:
    """What every member's row shares (members and workspace): the same for one group's calls."""
    return [int(w) for w in row[MEMBERS:]]
