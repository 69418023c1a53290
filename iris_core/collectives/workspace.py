"""Layout of the fixed collective workspace that every rank keeps at one heap offset.

    epochs  [MAX_PROGRAMS]              at offset 0: local call counter of each program (one line each)
    flags   [MAX_PROGRAMS][W]           flag p of program k on my heap: the last stamp rank p raised
    data    [2 buffers][data_bytes]     staged inputs / accumulators (buffer = epoch parity)
    data2   [2 buffers][data_bytes]     two-shot results, ring partials, spinlock locks
    tiles   int32 [data_bytes / 256]    streamed mode: flag [tile][p] on my heap, the last epoch
                                        in which rank p delivered that tile to me

Every flag sits on its own 128-byte line. A call's flags carry stamps epoch * STEPS + round,
so they only grow; buffers alternate with the epoch's parity, so back-to-back calls need no
reset and no host synchronization: a rank overwrites a buffer only after every peer that
reads it has signalled a later round.
"""

from __future__ import annotations

from dataclasses import dataclass

LINE_BYTES = 128
MAX_PROGRAMS = 256


@dataclass(frozen=True)
class WorkspaceLayout:
    world_size: int
    data_bytes: int

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
    def tile_flags(self) -> int:
        return self.data2 + 2 * self.data_bytes

    @property
    def tile_flag_count(self) -> int:
        """Enough for [tiles][W] when a tile holds >= 128 elements of >= 2 bytes."""
        return self.data_bytes // 256

    @property
    def total_bytes(self) -> int:
        return self.tile_flags + 4 * self.tile_flag_count
