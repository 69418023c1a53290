"""The simulator's check that the ranks of a group run the same calls.

Group kernels (collectives, fused ops, device barriers) pair the calls of a group's ranks by
count only: if the ranks' programs disagree (a shape that differs between processes, a
collective that only some ranks call), the kernels exchange data anyway and return wrong
values; a GPU cannot tell. On the simulator every rank writes a record of each group call
(its number in the group's sequence and a signature: kernel, constexprs, operand and result
sizes, grid) into a table on its own heap before the kernel runs, and after the kernel
compares the records of every member for that call number. Records live in shared memory, so
the check works with every rank in one process and with a process per rank.

Each record also holds the call's site: where the user's program made the call (its frames
outside iris and JAX, innermost first).
Calls with the same signature from different sites are what a collective that only some ranks
call looks like (rank 1 skips the first of two psums: its second pairs with the others'
first), but also what a rank-dependent branch with a collective in each arm looks like, which
GPUs run correctly; so a site that differs is reported as a warning (iris_core.errors.RankDivergenceWarning),
and when a member later times out waiting for a rank that made fewer calls, its error says how
many that rank made and where the ranks' calls diverged.

The table: BUCKETS x RING records of RECORD_BYTES on every heap; a group's records go to the
bucket of its key, call n to slot n % RING. A record that was overwritten or belongs to another
group is not compared (no false alarms; a bucket shared by two groups only checks less).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

BUCKETS = 128
RING = 8
RECORD_BYTES = 256
TEXT_BYTES = RECORD_BYTES - 32  # after key, call + 1, signature and site (int64 each)
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
    text: str  # what the call is and where it was made
    site: int = 0  # digest of where it was made (0: unknown)


@dataclass(frozen=True)
class _Record:
    number: int
    signature: int
    site: int
    text: str


class CallTable:
    """The records on one runtime's heaps (at `offset` on every heap, NBYTES long, zeroed)."""

    def __init__(self, heap, offset: int):
        self.heap, self.offset = heap, offset
        self._counts: dict[tuple[int, int], int] = {}
        self._next = None  # (rank, key) -> the call's number, where another writer numbers calls too
        self._lock = threading.Lock()

    def count_with(self, next_number: Callable[[int, int], int], seed: Callable[[int, int, int], None]) -> None:
        """Numbers calls with `next_number(rank, key)` from now on, for a writer of records beside
        this table (iris_jax's C meeting), after `seed(rank, key, count)` hands it the counts so far."""
        with self._lock:
            for (rank, key), count in self._counts.items():
                seed(rank, key, count)
            self._next = next_number

    def records_at(self, rank: int) -> int:
        """The address of rank's table (in this process)."""
        return self.heap.heap_bases[rank] + self.offset

    def _record(self, rank: int, key: int, number: int) -> int:
        slot = (key % BUCKETS) * RING + number % RING
        return self.records_at(rank) + slot * RECORD_BYTES

    def begin(self, rank: int, key: int, signature: int, text: str, site: Sequence[str] = ()) -> Call:
        """Numbers rank's next call of group `key` and publishes its record; `site` is where
        the program made it, its frames innermost first ("file.py:12"; empty: unknown)."""
        with self._lock:
            if self._next is not None:
                number = self._next(rank, key)
            else:
                number = self._counts.get((rank, key), 0)
                self._counts[rank, key] = number + 1
        text, site_digest, encoded = self.record_text(text, tuple(site))
        call = Call(rank, key, number, signature, text, site_digest)
        address = self._record(rank, key, number)
        ctypes.c_int64.from_address(address + 8).value = 0  # (being rewritten)
        # (a c_char array, not ctypes.memmove: a foreign call gives up the GIL, and every rank's thread wants it)
        (ctypes.c_char * TEXT_BYTES).from_address(address + 32).raw = encoded
        ctypes.c_int64.from_address(address + 16).value = signature
        ctypes.c_int64.from_address(address + 24).value = call.site
        ctypes.c_int64.from_address(address).value = key
        ctypes.c_int64.from_address(address + 8).value = number + 1  # last: the record is whole
        return call

    @functools.lru_cache(maxsize=1024)  # noqa: B019 (the table lives as long as its runtime)
    def record_text(self, text: str, site: tuple) -> tuple[str, int, bytes]:
        """A call's text with its site, the site's digest and the text as a record holds it."""
        if site:
            text = f"{text} at {' < '.join(site[:3])}{' < ...' if len(site) > 3 else ''}"
        return text, digest(site) if site else 0, text.encode()[:TEXT_BYTES].ljust(TEXT_BYTES, b"\0")

    def _read(self, rank: int, key: int, number: int) -> _Record | None:
        """Rank's record of call `number` of group `key`, if it is (still) there."""
        address = self._record(rank, key, number)
        if (ctypes.c_int64.from_address(address).value != key
                or ctypes.c_int64.from_address(address + 8).value != number + 1):
            return None  # not written yet, or overwritten
        text = ctypes.string_at(address + 32, TEXT_BYTES).rstrip(b"\0").decode(errors="replace")
        return _Record(number, ctypes.c_int64.from_address(address + 16).value,
                       ctypes.c_int64.from_address(address + 24).value, text)

    def _peer_records(self, call: Call, members: Sequence[int]):
        """(member, record of this call) for every other member whose record is there."""
        for member in members:
            theirs = self._read(member, call.key, call.number) if member != call.rank else None
            if theirs is not None:
                yield member, theirs

    def mismatch(self, call: Call, members: Sequence[int]) -> str | None:
        """A message naming the first member whose record of this call differs, else None."""
        for member, theirs in self._peer_records(call, members):
            if theirs.signature != call.signature:
                return (f"{call.text}: call {call.number} of the group of ranks {list(members)} differs between "
                        f"ranks: rank {call.rank} ran {call.text}, rank {member} ran {theirs.text}. The kernels "
                        "paired them anyway, so the results are discarded. Every rank of a group must make the "
                        "same calls with the same shapes in the same order (as SPMD code does): check shapes "
                        "that differ between processes and collectives under rank-dependent control flow.")
        return None

    def divergence(self, call: Call, members: Sequence[int]) -> str | None:
        """A warning's text where a member made this call, with the same signature, from
        another site of the program; else None."""
        for member, theirs in self._peer_records(call, members):
            if _sites_differ(call.site, theirs.site):
                return (f"call {call.number} of the group of ranks {list(members)}: rank {call.rank} ran "
                        f"{call.text}, rank {member} ran {theirs.text}. The kernels paired them, as GPUs do; "
                        "if a rank skipped a collective that the others made, its results are the others' "
                        "and a later call will time out.")
        return None

    def behind(self, call: Call, members: Sequence[int]) -> str | None:
        """For a call that timed out: which members made fewer calls of the group, and where
        their calls and this rank's parted; None where every member got this far."""
        lines = []
        for member in members:
            if member == call.rank or self._read(member, call.key, call.number) is not None:
                continue
            last = next((r for n in range(call.number - 1, max(call.number - RING, -1), -1)
                         if (r := self._read(member, call.key, n)) is not None), None)
            if last is None:
                continue  # no record left to tell (none made, or overwritten)
            line = (f"rank {member} has made {last.number + 1} call(s) of this group (its last: {last.text}); "
                    f"this rank's call {call.number} waits for its call {call.number}")
            for n in range(max(call.number - RING + 1, 0), last.number + 1):
                mine, theirs = self._read(call.rank, call.key, n), self._read(member, call.key, n)
                if mine and theirs and _sites_differ(mine.site, theirs.site):
                    line += (f"; their calls parted at call {n}: this rank ran {mine.text}, rank {member} ran "
                             f"{theirs.text} (a collective that only some ranks make?)")
                    break
            lines.append(line)
        return "\n".join(lines) or None


def _sites_differ(a: int, b: int) -> bool:
    return bool(a and b and a != b)  # 0: not known
