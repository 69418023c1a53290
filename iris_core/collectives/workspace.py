"""Layouts of the workspaces that every rank keeps at one heap offset per partition of the
ranks (iris_jax._runtime.workspace): the collectives' (`WorkspaceLayout`) and the fused GEMM ops'
(`FusedLayout`, at the end of this docstring).

Collectives:

    epochs  [MAX_PROGRAMS]              at offset 0: local call counter of each program (one line each)
    flags   [MAX_PROGRAMS][W]           flag p of program k on my heap: the last stamp rank p raised
    data    [2 buffers][data_bytes]     staged inputs / accumulators (buffer = epoch parity)
    data2   [2 buffers][data_bytes]     two-shot results, ring partials, spinlock locks
    stream  streamed calls' own region (never shared with the other modes' buffers):
      failed  one line: set on every member when a rank gives up: 1 + its member index, | its
                                        fault code << 12, | the call it gave up in (`calls`) << 16
      sdata   [2 buffers][stream_bytes] deliveries (buffer = the tile's delivery count parity)
      flags   int32 [T]                 [tile][p]: deliveries of that tile rank p made to me
      sent    int32 [T]                 [tile]: deliveries of that tile I made (to each member)
      got     int32 [T]                 [tile]: deliveries of that tile I consumed (from each)
      sigs    int64 [2][W]              (at the next multiple of 8) [k % 2][p]: the signature of the
                                        call in which rank p made delivery k of tile 0 to me
      calls   int32 [MAX_PROGRAMS]      streamed calls of this group, as each program counts them
      with T = stream_bytes / 256 (tiles x members <= T for tiles of >= 256 elements of >= 2
      bytes: a buffer holds G - 1 slots); stream_bytes 0 means data_bytes (iris_jax's
      workspaces default to 4 x data_bytes)

Every flag sits on its own 128-byte line. A call's flags carry stamps epoch * STEPS + round
(the flag protocol: iris_core.flag_protocol), so they only grow; buffers alternate with the
epoch's parity, so back-to-back calls need no reset and no host synchronization: a rank
overwrites a buffer only after every peer that reads it has signalled a later round.

Fused ops (iris_core.gemm.fused):

    epochs  [MAX_PROGRAMS]              at offset 0: fused calls each program has made (one line each)
    members [W]                         line i: [the last epoch member i announced (POISON + the epoch
                                        once it gave up), its signatures of even and odd epochs]
    flags   int32 [flag_count]          flag f: the epoch in which its data was last published
    data    [2 parities][data_bytes]    tiles (parity = epoch % 2)
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from math import ceil

from iris_core.flag_protocol import LINE_BYTES

MAX_PROGRAMS = 256
# the streamed region's counters (flags, sent, got: int32 each) hold stream_bytes / this many
# entries: every tile x member of a call whose tiles have >= 256 elements of >= 2 bytes (see above)
STREAM_BYTES_PER_COUNTER = 256  # (also read by the streamed kernel, iris_core.collectives.streamed)
STREAM_COUNTER_ARRAYS = 3

# where the collective kernel finds its buffers (heap offsets from the workspace's base; bytes
# per buffer), passed to it as one constexpr, REGIONS
Regions = namedtuple("Regions", "data data2 data_bytes stream stream_bytes")


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@dataclass(frozen=True)
class WorkspaceLayout:
    world_size: int
    data_bytes: int
    stream_bytes: int = 0  # 0: data_bytes

    @property
    def stream_capacity(self) -> int:
        """Bytes per buffer of the streamed region (a call streams if each sender's slot fits)."""
        return self.stream_bytes or self.data_bytes

    @property
    def flags(self) -> int:
        return MAX_PROGRAMS * LINE_BYTES

    @property
    def data(self) -> int:
        return self.flags + MAX_PROGRAMS * self.world_size * LINE_BYTES

    @property
    def data2(self) -> int:
        return self.data + 2 * self.data_bytes

    @property
    def stream(self) -> int:
        """Offset of the streamed region (its layout: iris_core.collectives.streamed)."""
        return self.data2 + 2 * self.data_bytes

    @property
    def regions(self) -> Regions:
        return Regions(self.data, self.data2, self.data_bytes, self.stream, self.stream_capacity)

    @property
    def total_bytes(self) -> int:
        """The whole workspace: the streamed region is its last (the module docstring's layout)."""
        counters = self.stream_capacity // STREAM_BYTES_PER_COUNTER
        counter_bytes = _round_up(STREAM_COUNTER_ARRAYS * 4 * counters, 8)  # the int64 sigs follow at a multiple of 8
        signatures = 2 * 8 * self.world_size  # int64 [2][W]
        calls = 4 * MAX_PROGRAMS  # int32 [MAX_PROGRAMS]
        return self.stream + LINE_BYTES + 2 * self.stream_capacity + counter_bytes + signatures + calls


@dataclass(frozen=True)
class FusedLayout:
    data_bytes: int  # per parity buffer, a multiple of 256
    flag_count: int
    world_size: int  # a line per rank in `members`

    @property
    def members(self) -> int:
        return MAX_PROGRAMS * LINE_BYTES

    @property
    def flags(self) -> int:
        return _round_up(self.members + self.world_size * LINE_BYTES, 256)

    @property
    def data(self) -> int:
        return self.flags + ceil(self.flag_count * 4 / 256) * 256

    @property
    def total_bytes(self) -> int:
        return self.data + 2 * self.data_bytes
