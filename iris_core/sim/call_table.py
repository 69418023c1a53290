"""The simulator's check that the ranks of a group run the same calls.

Group kernels (collectives, fused ops, device barriers) pair the calls of a group's ranks by
count only: if the ranks' programs disagree (a shape that differs between processes, a
collective that only some ranks call), the kernels exchange data anyway and return wrong
values; a GPU cannot tell. On the simulator every rank writes a record of each group call
(its number in the group's sequence and a signature: kernel, constexprs, operand and result
sizes, grid) into a table on its own heap before the kernel runs, and after the kernel
compares the records of every member for that call number. Records live in shared memory, so
the check works with every rank in one process and with a process per rank.

The table: BUCKETS x RING records of RECORD_BYTES on every heap; a group's records go to the
bucket of its key, call n to slot n % RING. A record that was overwritten or belongs to another
group is not compared (no false alarms; a bucket shared by two groups only checks less).
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass

BUCKETS = 256
RING = 8
RECORD_BYTES = 128
_TEXT_BYTES = RECORD_BYTES - 24  # after key, call + 1 and signature (int64 each)
NBYTES = BUCKETS * RING * RECORD_BYTES


def digest(value: object) -> int:
    """A 63-bit hash of `value`'s repr, equal in every process (Python's hash() is salted)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "little") >> 1


@dataclass(frozen=True)
class Call:
    rank: int
    key: int
    number: int
    signature: int
    text: str


class CallTable:
    """The records on one runtime's heaps (at `offset` on every heap, NBYTES long, zeroed)."""

    def __init__(self, heap, offset: int):
        self.heap, self.offset = heap, offset
        self._counts: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()

    def _record(self, rank: int, key: int, number: int) -> int:
        slot = (key % BUCKETS) * RING + number % RING
        return self.heap.heap_bases[rank] + self.offset + slot * RECORD_BYTES

    def begin(self, rank: int, key: int, signature: int, text: str) -> Call:
        """Numbers rank's next call of group `key` and publishes its record."""
        with self._lock:
            number = self._counts.get((rank, key), 0)
            self._counts[rank, key] = number + 1
        address = self._record(rank, key, number)
        ctypes.c_int64.from_address(address + 8).value = 0  # (being rewritten)
        ctypes.memmove(address + 24, text.encode()[:_TEXT_BYTES].ljust(_TEXT_BYTES, b"\0"), _TEXT_BYTES)
        ctypes.c_int64.from_address(address + 16).value = signature
        ctypes.c_int64.from_address(address).value = key
        ctypes.c_int64.from_address(address + 8).value = number + 1  # last: the record is whole
        return Call(rank, key, number, signature, text)

    def mismatch(self, call: Call, members: Sequence[int]) -> str | None:
        """A message naming the first member whose record of this call differs, else None."""
        for member in members:
            if member == call.rank:
                continue
            address = self._record(member, call.key, call.number)
            if (ctypes.c_int64.from_address(address).value != call.key
                    or ctypes.c_int64.from_address(address + 8).value != call.number + 1):
                continue  # not written yet, or overwritten: nothing to compare
            if ctypes.c_int64.from_address(address + 16).value != call.signature:
                theirs = ctypes.string_at(address + 24, _TEXT_BYTES).rstrip(b"\0").decode(errors="replace")
                return (f"{call.text}: call {call.number} of the group of ranks {list(members)} differs between "
                        f"ranks: rank {call.rank} ran {call.text}, rank {member} ran {theirs}. The kernels paired "
                        "them anyway, so the results are discarded. Every rank of a group must make the same "
                        "calls with the same shapes in the same order (as SPMD code does): check shapes that "
                        "differ between processes and collectives under rank-dependent control flow.")
        return None
