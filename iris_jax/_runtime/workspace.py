"""Heap workspaces for communicating kernels: one per partition of the ranks and size class.

A collective or fused op over mesh axes splits the mesh's devices into disjoint groups (a
partition). Every group of a partition runs the same sequence of calls, so epochs and
double-buffered flags stay consistent inside the partition; two partitions that share ranks (a
mesh's x and y axes) would not, so each partition keeps workspaces of its own. Disjoint groups
of one partition share the offset (they never touch each other's heaps).

A workspace is sized to the call, not to the largest call allowed: the buffers come in *size
classes*, the configured (largest) one and every 4th fraction of it down to MIN_CLASS_BYTES
(GPUs: data buffers of 16 MiB, 4 MiB, 1 MiB, 256 KiB, 64 KiB), and a call takes the smallest
class that holds it in one chunk (calls that are chunked take the largest, as before;
ragged_all_to_all likewise, by its window and slice tables). The
class decides nothing about how a call runs (tile, programs, algorithm and streaming are chosen
against the largest class first); it only trims buffers the call would not touch. Each
(partition, part, class) is a workspace of its own, with its own flags and epochs: it is a
partition's workspace as before, but one that only the calls of its class use, and since every
member of a group makes the same calls (same shapes, same class), its flags see one sequence of
calls on every member. Why not one set of buffers per rank shared by every partition:
docs/architecture.md ("Workspaces").

A partition has two parts, each allocated the first time a kernel of its kind runs over it: the
collectives' and the fused GEMM ops' (iris_jax.ops), so that neither kind's flags or buffers see
the other's calls. A workspace lives as long as the runtime (compiled programs hold its offset).

Largest class: `WorkspaceLayout(world_size, data_bytes, stream_bytes)`, about 4 x data_bytes +
2 x stream_bytes; data_bytes defaults to 16 MiB on GPUs and 256 KiB on the simulator, 1 MiB there
for heaps of 64 MiB or more (environment IRIS_WORKSPACE_BYTES; the backend's defaults),
stream_bytes to 4 x data_bytes of the small default (IRIS_STREAM_BYTES): ~195 MiB on GPUs. A
64 MiB streamed buffer holds one slot per sender (G - 1 of them), so psum, all_gather,
psum_scatter and all_to_all calls of up to 64 MiB per rank stream on 2 GPUs (21 MiB on 4).
Larger arrays are processed in chunks. A class of 1/4^k keeps the ratio of the two.

Fused part: `FusedLayout(data_bytes, flag_count, world_size)`, 2 x data_bytes plus epochs and
flags; the largest data_bytes defaults to 128 MiB on GPUs and 512 KiB on the simulator
(IRIS_FUSED_WORKSPACE_BYTES). Problems larger than it run as several kernels over row chunks.
"""

from __future__ import annotations

import os
import threading
from typing import NamedTuple

from iris_core import faults
from iris_core.collectives.workspace import FusedLayout, WorkspaceLayout
from iris_core.errors import HeapExhaustedError
from iris_core.heap.allocator import format_bytes
from iris_jax import _runtime as runtime_lib

PARTS = ("collective", "fused")
CLASS_STEP = 4  # each size class's buffers are a quarter of the next larger one's
MIN_CLASS_BYTES = 64 << 10  # the smallest class's data buffer (collective) or parity buffer (fused)
OWNER = "workspaces"  # what the heap's statistics call the workspaces' memory (Runtime.memory_stats)


class Workspace(NamedTuple):
    """One allocated workspace: its heap offset, part, size class (bytes of a data buffer),
    the partition's groups (rank tuples) and layout."""
    offset: int
    part: str
    size: int
    groups: tuple
    layout: WorkspaceLayout | FusedLayout

    @property
    def nbytes(self) -> int:
        return self.layout.total_bytes


def workspace_key(part: str, size: int | None = None) -> str:
    """The `workspace` parameter of a kernel call (iris_jax.calls.triton_call): `part`, and
    the size class `size` (None: the largest)."""
    return part if size is None else f"{part}/{size}"


def parse_key(key: str) -> tuple[str, int | None]:
    part, _, size = key.partition("/")
    if part not in PARTS:
        raise ValueError(f"unknown workspace part {part!r}; choose one of {PARTS}")
    return part, int(size) if size else None


class GroupWorkspaces:
    """Per-runtime pool of workspaces, one per (partition, part, size class) (a runtime service)."""

    def __init__(self, rt):
        backend = rt.backend  # the default sizes
        data_bytes = int(os.environ.get("IRIS_WORKSPACE_BYTES") or backend.workspace_bytes)
        stream_bytes = int(os.environ.get("IRIS_STREAM_BYTES") or 4 * data_bytes)  # the streamed calls' buffers
        if (not os.environ.get("IRIS_WORKSPACE_BYTES") and backend.large_heap_bytes is not None
                and rt.heap_size >= backend.large_heap_bytes):
            data_bytes = backend.large_workspace_bytes  # the streamed buffers keep their size
        self.layout = WorkspaceLayout(rt.world_size, data_bytes, stream_bytes)  # the largest class
        fused_bytes = int(os.environ.get("IRIS_FUSED_WORKSPACE_BYTES", backend.fused_workspace_bytes)) // 256 * 256
        self.fused_layout = FusedLayout(fused_bytes, backend.fused_flags, rt.world_size)
        self._rt = rt
        self._found: dict[tuple, Workspace] = {}  # (part, size, partition) -> its workspace
        self._lock = threading.Lock()

    # -- size classes --------------------------------------------------------------------
    def largest(self, part: str) -> WorkspaceLayout | FusedLayout:
        """`part`'s largest class: the configured sizes."""
        return self.layout if part == "collective" else self.fused_layout

    def classes(self, part: str = "collective") -> list[WorkspaceLayout | FusedLayout]:
        """The layouts of `part`'s size classes, largest first."""
        found = [self.largest(part)]
        while True:
            smaller = _shrunk(found[-1], CLASS_STEP)
            if smaller is None:
                return found
            found.append(smaller)

    def fitting(self, part: str, need: int, streamed: bool = False) -> WorkspaceLayout | FusedLayout:
        """The smallest class of `part` whose buffer holds `need` bytes (a collective's
        streamed buffer with `streamed`, else its data buffer; a fused parity buffer); the
        largest if none does."""
        fits = [c for c in self.classes(part) if _capacity(c, streamed) >= need]
        return fits[-1] if fits else self.largest(part)

    def key(self, part: str, layout) -> str:
        """The kernel call's `workspace` parameter for `layout`, a class of `part`."""
        return workspace_key(part, None if layout == self.largest(part) else layout.data_bytes)

    def layout_of(self, key: str) -> WorkspaceLayout | FusedLayout:
        part, size = parse_key(key)
        for layout in self.classes(part):
            if size is None or layout.data_bytes == size:
                return layout
        raise ValueError(f"no {part} workspace class of {size} bytes (classes: "
                         f"{[c.data_bytes for c in self.classes(part)]})")

    # -- allocation ----------------------------------------------------------------------
    def offset_for(self, groups, key: str = "collective") -> int:
        """Heap offset of the workspace `key` (a part, "collective" or "fused", with its size
        class: `workspace_key`) of the partition made of `groups` (rank tuples)."""
        return self.workspace_for(groups, key).offset

    def workspace_for(self, groups, key: str = "collective") -> Workspace:
        """The Workspace `key` of the partition made of `groups`, allocated on first use."""
        part, _ = parse_key(key)
        layout = self.layout_of(key)
        partition = tuple(sorted(tuple(g) for g in set(map(tuple, groups))))
        found_key = (part, layout.data_bytes, partition)
        with self._lock:
            if found_key not in self._found:
                offset = self._allocate(partition, part, layout)
                self._found[found_key] = Workspace(offset, part, layout.data_bytes, partition, layout)
                faults.name_workspace(offset, partition)  # what a fault record of its groups names
            return self._found[found_key]

    def _allocate(self, partition: tuple, part: str, layout) -> int:
        """A new workspace; an exhausted heap is named as what it is, with what holds the heap."""
        size = layout.total_bytes
        try:
            return self._rt.allocate_shared(size, owner=OWNER, name=f"the {part} workspace of groups "
                                                                   f"{[list(g) for g in partition]}")
        except HeapExhaustedError as e:
            kept = list(self._found.values())
            raise HeapExhaustedError(
                f"iris needs a {part} workspace ({format_bytes(size)}, buffers of {format_bytes(layout.data_bytes)}) "
                f"for the partition of the ranks into groups {[list(g) for g in partition]}, and the heap has no "
                f"room for it: {e} Workspaces live as long as the runtime, one per partition that collectives "
                f"or fused ops run over and size class of their calls ({len(kept)} kept, "
                f"{format_bytes(sum(w.nbytes for w in kept))}); run over fewer distinct groupings of the mesh's "
                "axes, or cap the largest class (IRIS_WORKSPACE_BYTES, IRIS_STREAM_BYTES, "
                "IRIS_FUSED_WORKSPACE_BYTES).") from None

    def allocated(self, part: str | None = None) -> list[Workspace]:
        """Every workspace allocated so far (of `part`; None: both), by offset."""
        with self._lock:
            return sorted((w for w in self._found.values() if part in (None, w.part)), key=lambda w: w.offset)

    def offsets(self, part: str = "collective") -> list[int]:
        """Heap offsets of `part` of every workspace allocated so far."""
        return [w.offset for w in self.allocated(part)]

    @property
    def nbytes(self) -> int:
        """Heap bytes the workspaces hold."""
        return sum(w.nbytes for w in self.allocated())


def _capacity(layout, streamed: bool) -> int:
    if isinstance(layout, FusedLayout):
        return layout.data_bytes
    return layout.stream_capacity if streamed else layout.data_bytes


def _shrunk(layout, step: int):
    """`layout` with buffers 1/`step` the size, or None below MIN_CLASS_BYTES."""
    data_bytes = layout.data_bytes // step // 256 * 256
    if data_bytes < MIN_CLASS_BYTES:
        return None
    if isinstance(layout, FusedLayout):
        return FusedLayout(data_bytes, layout.flag_count, layout.world_size)
    stream_bytes = layout.stream_capacity // step // 256 * 256
    if stream_bytes < MIN_CLASS_BYTES:
        return None
    return WorkspaceLayout(layout.world_size, data_bytes, stream_bytes)


def workspaces(rt=None) -> GroupWorkspaces:
    rt = rt or runtime_lib.runtime()
    return rt.service("group_workspaces", GroupWorkspaces)
