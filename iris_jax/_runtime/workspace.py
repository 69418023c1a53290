"""Heap workspaces for communicating kernels, one per *partition* of the ranks into groups.

A collective or fused op over mesh axes splits the mesh's devices into disjoint groups (a partition).
Every group of a partition runs the same sequence of calls, so epochs and double-buffered
flags stay consistent inside the partition; two partitions that share ranks (a mesh's x and
y axes, or two meshes over overlapping devices) would not, so each partition gets its own
workspace, allocated from the symmetric heap the first time it is used. Disjoint groups of
one partition share the offset (they never touch each other's heaps). A partition has two
parts, each allocated the first time a kernel of its kind runs over it: the collectives'
and the fused GEMM ops' (iris_jax.ops), so that neither kind's flags or buffers see the
other's calls.

Size per partition: `WorkspaceLayout(world_size, data_bytes, stream_bytes).total_bytes`,
about 4 x data_bytes + 2 x stream_bytes (2 x 2 buffers, and the streamed calls' own 2);
data_bytes defaults to 16 MiB on GPUs and 256 KiB on the simulator, 1 MiB there for heaps of
64 MiB or more (environment IRIS_WORKSPACE_BYTES; the backend's defaults), stream_bytes to
4 x data_bytes of the small default (IRIS_STREAM_BYTES): ~195 MiB per partition on GPUs. A
64 MiB streamed buffer holds one slot per sender (G - 1 of them), so psum, all_gather,
psum_scatter and all_to_all calls of up to 64 MiB per rank stream on 2 GPUs (21 MiB on 4).
Larger arrays are processed in chunks.

Fused part per partition: `FusedLayout(data_bytes, flag_count, world_size).total_bytes`, 2 x data_bytes
plus epochs and flags; data_bytes defaults to 128 MiB on GPUs and 512 KiB on the simulator
(IRIS_FUSED_WORKSPACE_BYTES). Problems larger than it run as several kernels over row chunks.
"""

from __future__ import annotations

import os
import threading

from iris_core import faults
from iris_core.collectives.workspace import FusedLayout, WorkspaceLayout
from iris_core.errors import HeapExhaustedError
from iris_core.heap.allocator import format_bytes
from iris_jax import _runtime as runtime_lib

PARTS = ("collective", "fused")


class GroupWorkspaces:
    """Per-runtime pool of partition workspaces (a runtime service)."""

    def __init__(self, rt):
        backend = rt.backend  # the default sizes
        data_bytes = int(os.environ.get("IRIS_WORKSPACE_BYTES") or backend.workspace_bytes)
        stream_bytes = int(os.environ.get("IRIS_STREAM_BYTES") or 4 * data_bytes)  # the streamed calls' buffers
        if (not os.environ.get("IRIS_WORKSPACE_BYTES") and backend.large_heap_bytes is not None
                and rt.heap_size >= backend.large_heap_bytes):
            data_bytes = backend.large_workspace_bytes  # the streamed buffers keep their size
        self.layout = WorkspaceLayout(rt.world_size, data_bytes, stream_bytes)
        fused_bytes = int(os.environ.get("IRIS_FUSED_WORKSPACE_BYTES", backend.fused_workspace_bytes)) // 256 * 256
        self.fused_layout = FusedLayout(fused_bytes, backend.fused_flags, rt.world_size)
        self._sizes = {"collective": self.layout.total_bytes, "fused": self.fused_layout.total_bytes}
        self._rt = rt
        self._offsets: dict[str, dict[tuple, int]] = {part: {} for part in PARTS}
        self._lock = threading.Lock()

    def offset_for(self, groups, part: str = "collective") -> int:
        """Heap offset of `part` ("collective" or "fused") of the workspace of the partition
        made of `groups` (rank tuples)."""
        if part not in PARTS:
            raise ValueError(f"unknown workspace part {part!r}; choose one of {PARTS}")
        key = tuple(sorted(tuple(g) for g in set(map(tuple, groups))))
        with self._lock:
            offsets = self._offsets[part]
            if key not in offsets:
                offsets[key] = self._allocate(key, part, len(offsets))
                faults.name_workspace(offsets[key], key)  # what a fault record of its groups names
            return offsets[key]

    def _allocate(self, key: tuple, part: str, kept: int) -> int:
        """The workspace of a new partition; an exhausted heap is named as what it is."""
        size = self._sizes[part]
        try:
            return self._rt.allocate_shared(size)
        except HeapExhaustedError as e:
            raise HeapExhaustedError(
                f"iris needs a {part} workspace ({format_bytes(size)}) for a new partition of the ranks into "
                f"groups {[list(g) for g in key]}, and the heap has no room for it: {e} Each partition that "
                f"collectives or fused ops run over keeps its workspace as long as the runtime ({kept} kept, "
                f"{format_bytes(kept * size)}); run over fewer distinct groupings of the mesh's axes, or shrink "
                "the workspaces (IRIS_WORKSPACE_BYTES, IRIS_STREAM_BYTES, IRIS_FUSED_WORKSPACE_BYTES).") from None

    def offsets(self, part: str = "collective") -> list[int]:
        """Heap offsets of `part` of every partition's workspace allocated so far."""
        with self._lock:
            return list(self._offsets[part].values())


def workspaces(rt=None) -> GroupWorkspaces:
    rt = rt or runtime_lib.runtime()
    return rt.service("group_workspaces", GroupWorkspaces)
