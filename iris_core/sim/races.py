"""The simulator's race detector: heap accesses of different ranks, or of different programs of
one launch, that nothing orders.

Opt-in (iris_jax.init(detect_races=...), IRIS_DETECT_RACES). While a kernel runs under it,
every load, store and atomic of the interpreter whose address lies in a heap of the session
goes through `Detector.access` (the builder hooks of `builder_patches`, set for the length of
a launch: without detection nothing is hooked). The happens-before order is the device API's
memory model (docs/device-api.md):

* each rank is one thread of a vector clock, and so is each program of the launch that runs now,
  for the length of the launch (`_Programs`): a rank's launches are ordered (stream order: a
  launch begins after every program of the one before, `Shadow.vcs` hands the clock on where the
  next runs in another process), the programs of one launch are not (they run side by side on a
  GPU; the simulator runs them one after another and says where each begins, `begin_program`);
  nothing orders a launch's start after a peer's launches (GPUs do not wait for each other there:
  a fast rank may have run this very launch already);
* an atomic with sem release or acq_rel at system scope publishes the rank's clock with the
  word it writes (the SYNC plane, joined: later atomics continue the release sequence); an
  atomic with sem acquire or acq_rel at system scope, and the simulator's `load_acquire`
  (Flags.wait on my own flag), join what is published there. Relaxed atomics, GPU or CTA
  scope and volatile loads make no edge;
* between programs of one launch on one rank, a release then an acquire of one heap word at gpu
  or system scope (the rank's own flag, a peer's, the counter the last program to arrive reads)
  orders the releasing program's past before the acquiring program's future, its view of the
  peers included; nothing else does (tl.debug_barrier orders the threads of one program, scope
  "cta" nothing between programs, a device_barrier ranks). A peer's flag acquired by one program
  orders that program only;
* a host barrier (iris_jax.barrier, once it waited for every rank's launches) orders everything
  before it before everything after;
* a collective that the simulator runs on the host in its kernel's place (iris_jax.calls.cpu_execution,
  `_host_reads`, `_host_writes`) is a launch of its own: each member reads its operands (`access_range`), the
  meeting joins every member's clock into each (host_collectives.Rendezvous.run(clock=)), and each
  member writes its results.

A heap block allocated anew has no history: its owner clears its words in every plane when it
allocates it (`forget`, ThreadSanitizer's reset of shadow at allocation), before any kernel can be
given it; the heap frees a block only once XLA is done with every buffer on it, so no launch in
flight touches those words (docs/architecture.md). Volatile and acquiring loads are atomic reads
(FLAG, recorded): they race with plain stores only, before or after them. A
plain store races even where it writes the bytes the word already holds (the memory model
knows no benign race; the collectives once rewrote their signature beside a flag every round).

Shadow memory lives in one sparse shared-memory file per heap session, mapped by every process
that runs kernels, sized by the heaps' upper bound (address space, not memory: only the pages of
accessed words are touched; docs/architecture.md says why it does not grow with the heap): for
each rank, each heap and each 4-byte word, the clock of that rank's last plain store (WRITE),
plain load (READ), atomic (ATOMIC) and volatile or acquiring load (FLAG), the clock released there
(SYNC) and the clock that would have been released had every atomic been release at system scope
(WEAK, for the report's hint).
Each rank writes only its own rows, so records need no lock; joins into SYNC and WEAK take one.
Two accesses race when they overlap, at least one writes, not both are atomics, they are of
different ranks, or of different programs of one launch of one rank, and the earlier one's clock
is not in the later one's vector clock. Between programs, the shadow needs no column more: the
programs' clocks are consecutive ranges of their rank's, so a record of this rank made after the
launch began and before the running program began is another program's, which the program has
seen up to its `known` entry (how, and the planes that are this process's own: `_Programs`).
What that leaves out (docs/device-api.md, "What it does not see"; each a seeded xfail test of
tests/jax/test_races.py): a peer's view of a rank stays one number, so a peer that acquires one
program's release counts every earlier access of that rank as seen, other programs' too (a race
hidden, never a false one); between programs of a launch, one load (atomic, flag load) per word
or byte is kept aside beside the last, so a store that saw those two but not one between is not
reported; a Pallas kernel's programs count as one, and its plain ref accesses are not seen. Elements
smaller than 4 bytes (int8, bfloat16, ...) are checked byte by byte: their accesses record one
clock per byte in byte planes (WRITE, READ, ATOMIC, FLAG; a second sparse file, mapped on the first
such access) and mark their words "mixed"; they check the word planes of their words and the
byte planes of their own bytes, so two ranks writing neighbouring bytes of one word do not race.
A word access checks the byte planes only of words marked mixed (one byte of the mark per word),
so code without small elements pays one look-up per access. Releases and acquires join per word
whatever the element (a larger join can only hide a race). A ring of access records per rank
(and a file of its source lines, numbered by a hash of the text: the host process's Pallas
launches and the worker's Triton launches of one rank share it) lets the report name the earlier
access, each racing pair of lines once per launch; the heap's allocation
table and the names given to allocations (a heap array's name=; `Detector.names`) name the
array.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import glob
import hashlib
import mmap
import os
import sys
import threading
import time
import warnings

import numpy as np

from iris_core.errors import RaceError, RaceWarning
from iris_core.heap.shared_memory import SHM_DIR

MODES = ("raise", "warn")
GRANULE = 4  # bytes of heap per shadow word (the byte planes: one byte each)
RING = 1 << 16  # access records kept per rank
_WRITE, _READ, _ATOMIC, _FLAG, _SYNC, _WEAK = range(6)  # _FLAG: a volatile or acquiring load (an atomic read)
_PLANES = 6
_ACCESSES = 4  # the planes of accesses (WRITE, READ, ATOMIC, FLAG); the others hold what releases made
_BYTE_PLANES = _ACCESSES  # the same of single bytes (what releases is joined per word)
# a launch's planes of one rank (_Programs)
_ASIDE_READ, _ASIDE_ATOMIC, _ASIDE_FLAG, _RELEASED, _WEAK_RELEASED = range(5)
_ASIDE = {_READ: _ASIDE_READ, _ATOMIC: _ASIDE_ATOMIC, _FLAG: _ASIDE_FLAG}
_PLANE_KINDS = {_WRITE: "store", _READ: "load", _ATOMIC: "atomic", _FLAG: "flag load"}
_MANY_RELEASES = 8  # earlier releases at the words of one atomic joined one by one, at most
_RECORD_WORDS = 8  # clock, site, program, kind, heap rank, first byte, end byte, 0
KINDS = ("load", "store", "atomic", "flag load")
LOAD, STORE, ATOMIC, FLAG_LOAD = range(4)  # FLAG_LOAD: volatile or acquiring (PTX: relaxed / acquire at sys)


def mode_of(value) -> str | None:
    """The detection mode a setting names: "raise", "warn" or None (off).

    True, "1" and "raise" raise RaceError; "warn" warns (RaceWarning); False, None, "", "0": off.
    """
    if value is None or value is False or value in ("", "0", "off", "false"):
        return None
    if value is True or value in ("1", "true", "on"):
        return "raise"
    if value in MODES:
        return value
    raise ValueError(f"detect_races must be True, False, 'raise' or 'warn' (IRIS_DETECT_RACES: 1, 0, raise, "
                     f"warn); got {value!r}")


def env_mode() -> str | None:
    return mode_of(os.environ.get("IRIS_DETECT_RACES", "0").strip().lower())


def shadow_path(session: str) -> str:
    """In the heap's directory, named so that its clean-ups (remove_session_segments) find it."""
    return os.path.join(SHM_DIR, f"iris-{session}-r-races")


def remove(session: str) -> None:
    """Unlinks a session's shadow files (its owner, when the heaps go)."""
    for path in glob.glob(shadow_path(session) + "*"):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class Shadow:
    """A session's shadow memory, mapped in this process (created by the first to open it)."""

    def __init__(self, session: str, world_size: int, heap_size: int):
        self.path = shadow_path(session)
        self.world_size, self.heap_size = world_size, heap_size
        granules = heap_size // GRANULE
        plane_bytes = _PLANES * world_size * world_size * granules * 4
        log_bytes = world_size * RING * _RECORD_WORDS * 8
        clock_bytes = (3 + world_size) * world_size * 8
        mixed_bytes = world_size * granules
        size = plane_bytes + log_bytes + clock_bytes + mixed_bytes
        self._map = _map_sparse(self.path, size, world_size, heap_size)
        buffer = np.frombuffer(self._map, np.uint8)
        self.planes = buffer[:plane_bytes].view(np.int32).reshape(_PLANES, world_size, world_size, granules)
        self.log = buffer[plane_bytes:plane_bytes + log_bytes].view(np.int64).reshape(world_size, RING, _RECORD_WORDS)
        # published: each rank's clock at the end of its last launch; floor: the clocks a host barrier saw
        at = plane_bytes + log_bytes
        words = buffer[at:at + clock_bytes].view(np.int64)
        self.clocks = words[:2 * world_size].reshape(2, world_size)
        # nanoseconds each rank waits before each launch begins (tests: `stagger`)
        self.delays = words[2 * world_size:3 * world_size]
        # each rank's vector clock after its last access: its next launch, in whichever process, goes on from it
        self.vcs = words[3 * world_size:].reshape(world_size, world_size)
        # per heap word: 1 once an element smaller than a word was accessed there (its byte planes hold records)
        self.mixed = buffer[at + clock_bytes:size].reshape(world_size, granules)
        self._byte_planes = None
        self._lock_fd = os.open(self.path + "-lock", os.O_CREAT | os.O_RDWR, 0o600)
        self._sites: dict[int, dict[int, str]] = {}

    def byte_planes(self) -> np.ndarray:
        """[plane][accessing rank][heap rank][byte] clocks of the accesses of elements smaller than a
        word (a second sparse file, mapped on first use: runs that make none map nothing more)."""
        if self._byte_planes is None:
            size = _BYTE_PLANES * self.world_size * self.world_size * self.heap_size * 4
            mapping = self._byte_mapping = _map_sparse(self.path + "-bytes", size, self.world_size, self.heap_size)
            self._byte_planes = np.frombuffer(mapping, np.int32).reshape(
                _BYTE_PLANES, self.world_size, self.world_size, self.heap_size)
        return self._byte_planes

    @contextlib.contextmanager
    def locked(self):
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._lock_fd, fcntl.LOCK_UN)

    def host_barrier(self) -> None:
        """Everything every rank did so far happens before what any rank does next (called once every
        rank's launches are over: iris_jax.barrier waits for them first)."""
        with self.locked():
            np.maximum(self.clocks[1], self.clocks[0], out=self.clocks[1])

    def forget(self, offset: int, nbytes: int, heaps) -> None:
        """A new allocation at [offset, offset + nbytes) of the heaps `heaps`: its words start with
        no history in every plane (ThreadSanitizer resets shadow at allocation). Whole pages of the
        shadow files are given back (a hole reads as zeros); the partial pages at the ends are
        zeroed where they are not already."""
        first, end = offset // GRANULE, -(-(offset + nbytes) // GRANULE)
        rows = [self.planes[p, a, h, first:end] for p in range(_PLANES) for a in range(self.world_size) for h in heaps]
        _clear(self.path, self._map, rows + [self.mixed[h, first:end] for h in heaps])
        if self._byte_planes is not None or os.path.exists(self.path + "-bytes"):
            planes = self.byte_planes()
            _clear(self.path + "-bytes", self._byte_mapping, [
                planes[p, a, h, first * GRANULE:end * GRANULE]
                for p in range(_BYTE_PLANES) for a in range(self.world_size) for h in heaps])

    def site(self, rank: int, site: int) -> str:
        known = self._sites.setdefault(rank, {})
        if site not in known:
            try:
                with open(self.path + f"-sites-{rank}") as f:
                    for line in f:
                        number, _, text = line.rstrip("\n").partition("\t")
                        known[int(number)] = text
            except FileNotFoundError:
                pass
        return known.get(site, "an unknown line")


def _map_sparse(path: str, size: int, world_size: int, heap_size: int) -> mmap.mmap:
    """Maps `path`, made `size` bytes if shorter: sparse, only the pages touched take memory (see
    docs/architecture.md on why it is sized by the heap's upper bound, not by what is mapped)."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except OSError as e:
        raise MemoryError(
            f"race detector: cannot map {size / 2 ** 40:.1f} TiB of shadow memory for {world_size} ranks of "
            f"{heap_size / 2 ** 30:.1f} GiB heaps (address space, not memory: {e.strerror}); give the heaps a "
            "lower upper bound, init(heap_size=...) or IRIS_HEAP_SIZE, or detect races with fewer ranks") from None
    finally:
        os.close(fd)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
_PUNCH_HOLE = 0x02 | 0x01  # FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE
_PAGE = mmap.PAGESIZE


def _clear(path: str, mapping: mmap.mmap, rows) -> None:
    """Zeroes `rows` (contiguous views of `mapping`, the file at `path`): rows on no page of the file
    are skipped (SEEK_DATA), the pages they cover whole punched out (memory given back, and no page
    touched), the rest zeroed if not zero."""
    base = np.frombuffer(mapping, np.uint8).ctypes.data
    fd = os.open(path, os.O_RDWR)
    try:
        for row in rows:
            start = row.ctypes.data - base
            end = start + row.nbytes
            try:
                if os.lseek(fd, start, os.SEEK_DATA) >= end:  # no page there: never touched, nothing to clear
                    continue
            except OSError:  # ENXIO: no page after start
                continue
            low, high = -(-start // _PAGE) * _PAGE, end // _PAGE * _PAGE
            if high <= low or _LIBC.fallocate(fd, _PUNCH_HOLE, low, high - low) != 0:
                low = high = end  # no whole page (or no hole punching here): zero it all below
            for a, b in ((start, low), (high, end)):
                if b > a and any(os.pread(fd, b - a, a)):  # pread: a hole is read without making a page
                    mapping[a:b] = bytes(b - a)
    finally:
        os.close(fd)


_SHADOWS: dict[str, Shadow] = {}


def shadow(session: str, world_size: int, heap_size: int) -> Shadow:
    if session not in _SHADOWS:
        _SHADOWS[session] = Shadow(session, world_size, heap_size)
    return _SHADOWS[session]


def host_barrier(session: str, world_size: int, heap_size: int) -> None:
    """Every rank's launches are over (the caller waited for them): what they did precedes what
    follows. This process's Pallas launches, which end when the next begins, publish theirs first."""
    for (found, _), d in _DETECTORS.items():
        if found == session:
            d.publish()
    shadow(session, world_size, heap_size).host_barrier()


def forget(session: str, world_size: int, heap_size: int, heaps, offset: int, nbytes: int) -> None:
    """The owner of `heaps` allocated [offset, offset + nbytes) anew: no history there (see Shadow.forget;
    a session that has not mapped its shadow yet has none to forget)."""
    if session in _SHADOWS or os.path.exists(shadow_path(session)):
        shadow(session, world_size, heap_size).forget(offset, nbytes, heaps)


def stagger(session: str, world_size: int, heap_size: int, delays_s) -> None:
    """Test-only: rank r waits delays_s[r] seconds before each launch begins (so that one rank can
    run a whole launch before a peer's begins; tests/jax/test_races.py)."""
    shadow(session, world_size, heap_size).delays[:] = [int(d * 1e9) for d in delays_s]


# -- where an access was made: the kernel's line --------------------------------------------------
_HERE = os.path.dirname(os.path.abspath(__file__))
_DEVICE = os.path.join(os.path.dirname(_HERE), "device")
_TRITON = os.path.dirname(os.path.dirname(os.path.abspath(np.__file__)))  # site-packages: triton, numpy
# iris's other modules count as kernel code wherever iris is installed (site-packages too, for a wheel)
_IRIS = tuple(os.path.join(os.path.dirname(os.path.dirname(_HERE)), p, "") for p in ("iris_core", "iris_jax"))
_DYNAMIC = "<dynamic-code>"
_CATEGORY: dict = {}  # code object -> 0 (skip: Triton, the simulator), 1 (the device API), 2 (kernel code)


def _category(code) -> int:
    found = _CATEGORY.get(code)
    if found is None:
        name = os.path.abspath(code.co_filename)
        if name.startswith(_DEVICE):
            found = 1
        elif name.startswith(_HERE) or "/triton/" in name or "/numpy/" in name:
            found = 0
        elif name.startswith(_TRITON) and not name.startswith(_IRIS):
            found = 0
        else:
            found = 2
        _CATEGORY[code] = found
    return found


def _site_text() -> str:
    """`file:line (function)` of the kernel code that made the access, and the device API function
    it went through ("via Context.load")."""
    frame = sys._getframe(3)
    via = None
    while frame is not None:
        category = _category(frame.f_code)
        if category == 1:
            via = frame.f_code.co_qualname if hasattr(frame.f_code, "co_qualname") else frame.f_code.co_name
        elif category == 2:
            where = source_line(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)
            return where + (f" via {via}" if via else "")
        frame = frame.f_back
    return "an unknown line"


def allocation_at(starts, sizes, names, offset: int) -> tuple[int, int, str] | None:
    """(start, size, what it is) of the live allocation holding heap `offset`, from the heap's
    allocation table (`starts`, `sizes`: None where unknown) and `names` (a callable giving
    {start: (owner, name)}, or None); None outside every allocation."""
    if starts is None or len(starts) == 0:
        return None
    i = int(np.searchsorted(starts, offset, side="right")) - 1
    if i < 0 or offset >= starts[i] + sizes[i]:
        return None
    start = int(starts[i])
    owner, name = (names() if names is not None else {}).get(start, ("", None))
    return start, int(sizes[i]), f'array "{name}"' if owner == "arrays" else name or "an unnamed allocation"


def source_line(path: str, line: int, function: str) -> str:
    """A source line as reports name it: `file:line (function)`, the file relative to the repository."""
    return f"{_short(path)}:{line} ({function})"


def _short(path: str) -> str:
    """`path` relative to iris's checkout, else to the working folder (an installed iris, the user's
    files under the folder they run from), else whole."""
    for root in (os.path.dirname(os.path.dirname(_HERE)), os.getcwd()):
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return path


# -- one rank's detector ---------------------------------------------------------------------------
class Detector:
    """One rank's vector clock and its view of the shadow memory (kept across launches)."""

    def __init__(self, session: str, world_size: int, heap_size: int, heap_bases, rank: int):
        self.shadow = shadow(session, world_size, heap_size)
        self.rank, self.world_size, self.heap_size = rank, world_size, heap_size
        self.bases = np.asarray([int(b) for b in heap_bases], np.uint64)
        self.order = np.argsort(self.bases)
        self.vc = np.zeros(world_size, np.int64)  # what this rank has seen of every rank's accesses
        self.weak = np.zeros(world_size, np.int64)  # ... had every atomic been release/acquire at system scope
        self.weak_site = [None] * world_size  # the atomic read that raised weak[r] above vc[r]
        self.sites: dict[str, int] = {}
        self.reports: list[str] = []
        self._reported: set = set()
        self.kernel = "?"
        self.allocations = None  # a function: (starts, sizes) of the heap's live allocations
        self.names = None  # a function: {offset: (owner, name)} of the named ones
        self.programs = _Programs()  # the launch's programs: one thread each (see _Programs)

    # a launch --------------------------------------------------------------------------------
    def begin(self, kernel: str, programs: int = 1) -> None:
        """A launch of `programs` programs begins (stream order: after everything this rank did; of
        the peers, after what a host barrier saw: nothing else orders it, as GPUs do not wait for
        each other at a launch)."""
        delay = int(self.shadow.delays[self.rank])
        if delay:  # a test's staggered start
            time.sleep(delay / 1e9)
        self.kernel = kernel
        self._reported.clear()  # each racing pair of lines once per launch
        # stream order, also where this rank's last launch ran in another process (a Pallas kernel's
        # ops run in the host process, a Triton kernel's in the rank's worker)
        np.maximum(self.vc, self.shadow.vcs[self.rank], out=self.vc)
        np.maximum(self.vc, self.shadow.clocks[1], out=self.vc)
        self.programs.begin(self, programs)

    def begin_program(self, x: int, y: int, z: int) -> None:
        """The launch's next program begins: it knows what the launch began with, not what the
        programs before it did (on a GPU they run beside it)."""
        self.programs.next(self, _packed(x, y, z))

    def end(self) -> list[str]:
        """The launch is over: publishes this rank's clock (for a host barrier); returns its reports."""
        self.programs.end(self)  # the next launch comes after every program of this one
        self.publish()
        return self.take_reports()

    def publish(self) -> None:
        """This rank's vector clock as its next launch and a host barrier take it (a Pallas launch in
        progress: up to now). A rank's launches run one after another: no lock."""
        row = self.shadow.vcs[self.rank]
        np.maximum(row, self.vc, out=row)
        self.shadow.clocks[0, self.rank] = row[self.rank]

    def take_reports(self) -> list[str]:
        """The reports made since the last call (a launch in progress: a Pallas kernel's ops)."""
        reports, self.reports = self.reports, []
        return reports

    # an access ---------------------------------------------------------------------------------
    def _where(self, addresses, element: int):
        """[(heap rank, granule indices, byte offsets, element bytes)] of the `addresses` that lie in a
        heap (the granules of elements under 4 bytes: each word they touch, once)."""
        if addresses.size == 0:
            return []
        found = []
        low, high = int(addresses.min()), int(addresses.max())
        for h in self.order:
            base = int(self.bases[h])
            if high < base or low >= base + self.heap_size:
                continue
            inside = None
            if not (base <= low and high < base + self.heap_size):
                inside = (addresses >= base) & (addresses < base + self.heap_size)
            offsets = (addresses if inside is None else addresses[inside]) - np.uint64(base)
            offsets = offsets.astype(np.int64)
            granules = offsets // GRANULE
            if element > GRANULE:
                granules = (granules[:, None] + np.arange(element // GRANULE)).reshape(-1)
            elif element < GRANULE:
                granules = _distinct(granules)
            found.append((int(h), granules, offsets, element))
        return found

    def _site(self, where: str | None = None) -> int:
        text = f"kernel {self.kernel} at {where or _site_text()}"
        number = self.sites.get(text)
        if number is None:  # a hash: two processes that record for one rank (Pallas, Triton) agree on it
            number = self.sites[text] = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=7).digest(), "little")
            with open(self.shadow.path + f"-sites-{self.rank}", "a") as f:
                f.write(f"{number}\t{text}\n")
        return number

    def access(self, builder, ptrs, mask, kind: int, sem: str = "", scope: str = "") -> list:
        """Records and checks one load, store or atomic of the interpreter (`ptrs` and `mask` its
        tensors) before it runs; returns what `acquire` needs afterwards (the heap words it touched)."""
        addresses = ptrs.data.reshape(-1)
        if mask is not None:
            lanes = np.broadcast_to(mask.data, ptrs.data.shape).reshape(-1).astype(bool)
            if not lanes.all():
                addresses = addresses[lanes]
        x, y, z = getattr(builder, "grid_idx", (0, 0, 0))
        return self.access_at(addresses, max(1, ptrs.get_element_ty().primitive_bitwidth // 8), kind, sem, scope,
                              program=_packed(x, y, z))

    def access_at(self, addresses, element: int, kind: int, sem: str = "", scope: str = "", *, program: int = 0,
                  where: str | None = None) -> list:
        """Records and checks one access of `element`-byte elements at `addresses` (a flat uint64
        array, masked lanes left out) by `program` (packed as `access` packs it), made at the source
        line `where` (None: the kernel's frame on the stack) before it runs; returns what `acquire`
        needs afterwards."""
        touched = self._where(addresses, element)
        if not touched:
            return touched
        rank, vc, planes = self.rank, self.vc, self.shadow.planes
        vc[rank] += 1
        clock = int(vc[rank])
        site = self._site(where)
        programs = self.programs if self.programs.concurrent else None  # other programs of this launch
        for heap, granules, offsets, element in touched:
            record = (clock, site, int(program), kind, heap, int(offsets.min()), int(offsets.max()) + element, 0)
            self.shadow.log[rank, clock % RING] = record
            where = _span(granules)
            if kind == STORE:
                recorded, checked = _WRITE, (_WRITE, _READ, _ATOMIC, _FLAG)
            elif kind == LOAD:
                recorded, checked = _READ, (_WRITE, _ATOMIC)
            elif kind == FLAG_LOAD:  # an atomic read: races with plain stores only, before it or after
                recorded, checked = _FLAG, (_WRITE,)
            else:
                recorded, checked = _ATOMIC, (_WRITE, _READ)
                self._publish(heap, where, sem, scope)
                if programs is not None:
                    programs.release(self, heap, where, sem, scope, clock)
            report = (kind, sem, scope, heap, clock, site, program)
            mixed = self.shadow.mixed[heap]
            if element < GRANULE:  # its own bytes only: a neighbour's bytes in the word are not its
                small = _bytes_of(offsets, element)
                at, byte_planes = _span(small), self.shadow.byte_planes()
                mixed[where] = 1  # before the record: a word access that checks after it sees both
                if programs is not None:  # before the record, which replaces this rank's last one
                    programs.before_record(self, byte_planes, 1, checked, recorded, at, small, report)
                byte_planes[recorded, rank, heap][at] = clock
                self._check(planes, GRANULE, checked, where, granules, report)  # whole words of others
                self._check(byte_planes, 1, checked, at, small, report)
                continue
            if programs is not None:  # before the record, which replaces this rank's last one
                programs.before_record(self, planes, GRANULE, checked, recorded, where, granules, report)
            planes[recorded, rank, heap][where] = clock  # record, then check: of two racing ranks one sees the other
            self._check(planes, GRANULE, checked, where, granules, report)
            flagged = mixed[where]
            if flagged.any():  # bytes of these words were accessed as smaller elements
                small = _bytes_of(granules[flagged.astype(bool)] * GRANULE, GRANULE)
                at, byte_planes = _span(small), self.shadow.byte_planes()
                self._check(byte_planes, 1, checked, at, small, report)
                if programs is not None:
                    programs.before_record(self, byte_planes, 1, checked, None, at, small, report)
        return touched

    def access_range(self, address: int, nbytes: int, element: int, kind: int, where: str | None = None) -> None:
        """Records and checks the `nbytes` at `address` as one access of `element`-byte elements, made
        by the host in a kernel's place (a collective the simulator runs on the host reads its operands
        and writes its results) at the program's source line `where`; nothing when no byte is on a heap."""
        end = address + nbytes
        if nbytes > 0 and any(b < end and address < b + self.heap_size for b in self.bases.tolist()):
            self.access_at(np.arange(address, end, element, dtype=np.uint64), element, kind, where=where)

    def _check(self, planes, unit: int, checked, where, indices, report) -> None:
        """Reports the records of other ranks in `planes` (one clock per `unit` bytes) at `where`
        (the `indices`, or their slice) that this rank has not seen."""
        vc, heap = self.vc, report[3]
        for plane in checked:
            seen = planes[plane, :, heap][:, where]  # (ranks, units): index the units last
            late = seen.max(axis=1) > vc
            late[self.rank] = False
            if late.any():
                other = int(np.argmax(late))
                unseen = seen[other] > vc[other]
                self._report(plane, other, int(seen[other, int(np.argmax(unseen))]), indices[unseen], unit, *report)

    def _publish(self, heap, where, sem, scope) -> None:
        """An atomic write: what it releases goes with the word (a relaxed one continues the release
        sequence: it adds nothing)."""
        strong = sem in ("release", "acq_rel") and scope == "sys"
        planes = self.shadow.planes
        with self.shadow.locked():
            weak = np.maximum(self.vc, self.weak)[:, None]
            rows = planes[_WEAK, :, heap]
            rows[:, where] = np.maximum(rows[:, where], weak)
            if strong:
                rows = planes[_SYNC, :, heap]
                rows[:, where] = np.maximum(rows[:, where], self.vc[:, None])

    def acquire(self, touched, sem: str, scope: str, where: str | None = None) -> None:
        """After an atomic read (or a flag load) of the words `touched`: joins what was released
        there when it acquires at system scope; notes what a stronger one would have joined (the
        read made at the source line `where`, as for `access_at`)."""
        planes = self.shadow.planes
        strong = sem in ("acquire", "acq_rel") and scope == "sys"
        programs = self.programs if self.programs.concurrent else None
        for heap, granules, _, _ in touched:
            if strong:
                released = planes[_SYNC, :, heap][:, granules].max(axis=1)
                np.maximum(self.vc, released, out=self.vc)
                if programs is not None:  # a release of this rank's, come back through peers
                    programs.learn(int(released[self.rank]))
            if programs is not None:
                programs.acquire(self, heap, granules, sem, scope, where)
            weak = planes[_WEAK, :, heap][:, granules].max(axis=1)
            raised = (weak > self.weak) & (weak > self.vc)
            if raised.any():
                site = self._site(where)
                for r in np.flatnonzero(raised):
                    self.weak_site[int(r)] = (site, sem or "a volatile load", scope)
            np.maximum(self.weak, weak, out=self.weak)

    # the report ----------------------------------------------------------------------------------
    def _report(self, plane, other, other_clock, racing, unit, kind, sem, scope, heap, clock, site, program):
        record = self.shadow.log[other, other_clock % RING]
        known = int(record[0]) == other_clock
        other_kind = KINDS[int(record[3])] if known else _PLANE_KINDS[plane]
        other_site = self.shadow.site(other, int(record[1])) if known else "a line no longer recorded"
        key = (other, int(record[1]) if known else -1, site)
        if key in self._reported:
            return
        self._reported.add(key)
        first, end = int(racing.min()) * unit, (int(racing.max()) + 1) * unit
        mine = KINDS[kind] + (f" (sem={sem}, scope={scope})" if kind == ATOMIC else
                              " (volatile)" if kind == FLAG_LOAD and not sem else "")
        other_program = _program(int(record[2])) if known else "?"
        if other == self.rank:
            remedy = _programs_remedy(other_program, other_kind, _program(program), KINDS[kind])
            remedy += self.programs.hint(self, other_clock)
        else:
            remedy = self._remedy(other, other_kind, KINDS[kind], other_clock)
        lines = [
            f"data race on rank {heap}'s heap, {self._region(first, end)}:",
            f"  {other_kind} by rank {other}, program {other_program}: {other_site}",
            f"  {mine} by rank {self.rank}, program {_program(program)}: {self.shadow.site(self.rank, site)}",
            "  " + remedy,
        ]
        self.reports.append("\n".join(lines))

    def _region(self, first: int, end: int) -> str:
        where = f"bytes [{first}, {end}) (heap offsets)"
        if self.allocations is None:
            return where
        found = allocation_at(*self.allocations(), self.names, first)
        if found is None:
            return where
        start, size, what = found
        return (f"{what} ({size} bytes at heap offset {start}), its bytes [{first - start}, {end - start}) "
                f"({(first - start) // GRANULE}..{(end - start - 1) // GRANULE} in 4-byte words)")

    def _remedy(self, other: int, other_kind: str, kind: str, other_clock: int) -> str:
        me = self.rank
        if other_kind == "store" or other_kind == "atomic" and kind != "store":
            order = (f"to order them, rank {other} must release a flag after its {other_kind} (an atomic with "
                     f"sem='release' or 'acq_rel', scope='sys': Flags.signal / set) and rank {me} acquire it "
                     f"before its {kind} (sem='acquire' or 'acq_rel', scope='sys': Flags.wait), or a "
                     "device_barrier / host barrier must separate them")
        else:
            order = (f"to order them, rank {other} must release a flag after its {other_kind} (e.g. 'done "
                     f"reading this buffer') and rank {me} wait for it (acquire, scope='sys') before its {kind}: "
                     "a buffer reused while a peer may still use it; or a device_barrier / host barrier between")
        if other_kind != "atomic" and kind != "atomic" and other_kind == kind == "store":
            order += "; or make both stores atomics"
        if self.programs.concurrent and self.programs.joined[other] >= other_clock:
            order += (f". Another program of rank {me}'s launch did acquire it, which orders that program only "
                      "(the programs of a launch run concurrently): it must pass it on, a release at scope='gpu' "
                      "or 'sys' that this program acquires, or this program acquire the flag itself")
        hint = self.weak_site[other]
        if hint is not None and self.weak[other] >= other_clock:
            where, sem, scope = hint
            order += (f". Rank {me} did read a flag that rank {other} changed after its {other_kind} "
                      f"({self.shadow.site(me, where)}, sem={sem}, scope={scope}): that read or the write it saw "
                      "lacks acquire / release at system scope")
        return order + "."


class _Programs:
    """The programs of the launch that runs now, each a thread of its rank's vector clock.

    The simulator runs them one after another, so program i's accesses take this rank's clocks
    [starts[i], starts[i + 1]), all after the launch's `first`: which program made an access is its
    clock's place in `starts`. A program begins with what its launch began with (other ranks'
    clocks) and nothing of its launch's other programs; `known[i]` is the last clock of program i
    that the running program has seen, through a release then an acquire at gpu or sys scope of one
    word (the word's `_RELEASED` entry names what was released there: the releasing program's vector
    clock and `known`). The launch's end joins every program's clock: the next launch (stream order)
    comes after all of them.

    This rank's row of the shadow holds its last access of a word, which may be the running
    program's own, over another program's: every access checks that row before it records. Two
    programs' loads (atomics) of one word do not race, yet a store after them must see both: a load
    that replaces in the row one of another program that it has not seen puts that one aside, in a
    plane of the launch (`_ASIDE_READ`, `_ASIDE_ATOMIC`, `_ASIDE_FLAG`: the earliest such, where one
    is already; elements under 4 bytes in planes of bytes alike, `byte_planes`), which stores check
    once anything is there (a store that saw the one aside and the last but not one between is not
    reported). These planes are this process's own (all programs of a rank run in its process: no
    lock, no shared file), sparse, rows of one rank.
    A system-scope acquire can bring this rank's own clock back through peers (`learn`): the program
    that made it is seen up to there, what that program had seen is not (a peer keeps one number).
    For the report's hint, atomics that release nothing between programs (relaxed, scope "cta")
    leave their clock in `_WEAK_RELEASED`, and reads that acquire nothing note what they saw there
    or in `_RELEASED` (`weak_clock`, `weak_read`): the flag that was meant to order the two.
    """

    def __init__(self):
        self.concurrent = False  # the launch has more than one program
        self.packed = 0  # the running program's id, as access records pack it
        self.ordinal = -1  # its place in the launch's order
        self.first = self.start = 0  # the clock before the launch's first access; the program's first
        self.starts = self.known = np.zeros(1, np.int64)
        self.launch_vc = self.launch_weak = self.joined = self.joined_weak = None
        self.snapshots: list = []  # (vector clock, known) released in this launch: ids base + 1, ...
        self.base = 0
        self.aside = False
        self.weak_clock, self.weak_read = 0, None  # the running program's latest flag read that orders nothing
        self._planes = self._byte_planes = None

    def begin(self, detector: Detector, programs: int) -> None:
        self.concurrent, self.ordinal, self.packed = programs > 1, -1, 0
        if not self.concurrent:
            return
        self.first = self.start = int(detector.vc[detector.rank])
        self.aside = False  # whether a load or atomic was kept aside in this launch (before_record)
        self.starts = np.zeros(programs, np.int64)
        self.known = np.zeros(programs, np.int64)
        self.launch_vc, self.launch_weak = detector.vc.copy(), detector.weak.copy()
        self.joined, self.joined_weak = detector.vc.copy(), detector.weak.copy()
        self.base += len(self.snapshots)  # the ids earlier launches released are stale from here on
        self.snapshots = []

    def next(self, detector: Detector, packed: int) -> None:
        self.packed = packed
        if not self.concurrent:
            return
        vc, rank = detector.vc, detector.rank
        self.weak_clock, self.weak_read = 0, None
        if self.ordinal >= 0:  # the program before ends: the next one knows none of it
            np.maximum(self.joined, vc, out=self.joined)
            np.maximum(self.joined_weak, detector.weak, out=self.joined_weak)
            own = vc[rank]
            vc[:] = self.launch_vc
            vc[rank] = own
            detector.weak[:] = self.launch_weak
            self.known.fill(0)
        self.ordinal += 1
        self.start = self.starts[self.ordinal] = int(vc[rank]) + 1

    def end(self, detector: Detector) -> None:
        if self.concurrent and self.ordinal >= 0:
            np.maximum(detector.vc, self.joined, out=detector.vc)
            np.maximum(detector.weak, self.joined_weak, out=detector.weak)
        self.concurrent = False

    def planes(self, detector: Detector) -> np.ndarray:
        """[_ASIDE_READ, _ASIDE_ATOMIC, _ASIDE_FLAG, _RELEASED, _WEAK_RELEASED][heap rank][word] (mapped at
        the first launch of several programs)."""
        if self._planes is None:
            granules = detector.heap_size // GRANULE
            size = 5 * detector.world_size * granules * 4
            path = f"{detector.shadow.path}-programs-{os.getpid()}-{detector.rank}"
            try:
                mapping = _map_sparse(path, size, detector.world_size, detector.heap_size)
            finally:
                os.unlink(path)  # this process's alone: gone with it
            self._planes = np.frombuffer(mapping, np.int32).reshape(5, detector.world_size, granules)
        return self._planes

    def byte_planes(self, detector: Detector) -> np.ndarray:
        """[_ASIDE_READ, _ASIDE_ATOMIC, _ASIDE_FLAG][heap rank][byte]: the set-aside planes of elements
        under 4 bytes (mapped at the first such access of a launch of several programs)."""
        if self._byte_planes is None:
            path = f"{detector.shadow.path}-programs-bytes-{os.getpid()}-{detector.rank}"
            size = len(_ASIDE) * detector.world_size * detector.heap_size * 4
            try:
                mapping = _map_sparse(path, size, detector.world_size, detector.heap_size)
            finally:
                os.unlink(path)
            self._byte_planes = np.frombuffer(mapping, np.int32).reshape(len(_ASIDE), detector.world_size,
                                                                         detector.heap_size)
        return self._byte_planes

    def _aside_planes(self, detector: Detector, unit: int) -> np.ndarray:
        return self.planes(detector) if unit == GRANULE else self.byte_planes(detector)

    # which program made an access, and whether the running one has seen it ----------------------------
    def unseen(self, clocks):
        """Which of these clocks of this rank are accesses of the launch's other programs that the
        running program has not seen."""
        other = (clocks > self.first) & (clocks < self.start)
        if other.any():
            made_by = np.searchsorted(self.starts[:self.ordinal + 1], clocks[other], side="right") - 1
            other[other] = clocks[other] > self.known[made_by]
        return other

    def before_record(self, detector: Detector, planes, unit: int, checked, recorded, where, indices,
                      report) -> None:
        """Before an access records `recorded` into this rank's row of `planes` (one clock per `unit`
        bytes) at `where`: reports the launch's other programs' accesses there in the `checked`
        planes that the running program has not seen, and keeps aside an unseen load or atomic of
        another program that the record is about to replace (in planes of words or of bytes, as
        `unit`)."""
        heap = report[3]
        own = planes[:_ACCESSES, detector.rank, heap][:, where]  # this rank's last store, load, atomic, flag load
        if own.max() > self.first:  # the launch has been here
            for plane in checked:
                self._report_unseen(detector, own[plane], plane, unit, indices, report)
            if recorded in _ASIDE:
                self._keep_aside(detector, unit, _ASIDE[recorded], heap, where, own[recorded])
        if self.aside:
            for plane in checked:
                if plane in _ASIDE:
                    kept = self._aside_planes(detector, unit)[_ASIDE[plane], heap][where]
                    self._report_unseen(detector, kept, plane, unit, indices, report)

    def _keep_aside(self, detector: Detector, unit: int, slot: int, heap: int, where, old) -> None:
        """Loads (atomics) of two programs do not race, but a store after both must see both: where the
        record replaces one the running program has not seen, that one goes to the launch's plane
        `slot`, unless an earlier one unseen is there already."""
        unseen = self.unseen(old)
        if unseen.any():
            row = self._aside_planes(detector, unit)[slot, heap]
            kept = row[where]
            row[where] = np.where(unseen & ~self.unseen(kept), old, kept)
            self.aside = True

    def _report_unseen(self, detector: Detector, clocks, plane, unit, indices, report) -> None:
        if clocks.max() <= self.first:  # none of this launch
            return
        unseen = self.unseen(clocks)
        if unseen.any():
            detector._report(plane, detector.rank, int(clocks[int(np.argmax(unseen))]), indices[unseen], unit,
                             *report)

    # the edges between programs: release, then acquire, at gpu or sys scope -------------------------
    def release(self, detector: Detector, heap: int, where, sem: str, scope: str, clock: int) -> None:
        """An atomic that releases at gpu or sys scope: the words it writes carry what the running
        program has seen, itself up to this atomic included (joined with what they carried)."""
        if sem not in ("release", "acq_rel") or scope == "cta":  # orders nothing; for the report's hint
            row = self.planes(detector)[_WEAK_RELEASED, heap]
            self._weakly(detector, row[where].max(), (sem, scope), None)  # what it reads, before it writes
            row[where] = clock
            return
        self.known[self.ordinal] = clock
        mine = (detector.vc.copy(), self.known.copy())
        row = self.planes(detector)[_RELEASED, heap]
        ids = np.array(row[where])
        fresh = ids > self.base
        earlier = np.unique(ids[fresh])  # a release sequence: join what was released there
        if len(earlier) > _MANY_RELEASES:  # words released apart: one join for all (it can only hide)
            for old in earlier:
                mine = self._joined(int(old), mine)
            self.snapshots.append(mine)
            row[where] = self.base + len(self.snapshots)
            return
        new = ids.copy()
        for old in earlier:
            self.snapshots.append(self._joined(int(old), mine))
            new[ids == old] = self.base + len(self.snapshots)
        if not fresh.all():
            self.snapshots.append(mine)
            new[~fresh] = self.base + len(self.snapshots)
        row[where] = new

    def _joined(self, released: int, view):
        vc, known = self.snapshots[released - self.base - 1]
        return np.maximum(vc, view[0]), np.maximum(known, view[1])

    def acquire(self, detector: Detector, heap: int, granules, sem: str, scope: str, where=None) -> None:
        """An atomic read (or a flag load) that acquires at gpu or sys scope: the running program joins
        what programs of this launch released at the words. Any other notes, for the report's hint,
        what a release and an acquire at gpu scope would have ordered (`weak`)."""
        planes = self.planes(detector)
        ids = planes[_RELEASED, heap][granules]
        strong = sem in ("acquire", "acq_rel") and scope != "cta"
        for released in np.unique(ids[ids > self.base]):
            vc, known = self.snapshots[int(released) - self.base - 1]
            if strong:
                np.maximum(detector.vc, vc, out=detector.vc)
                np.maximum(self.known, known, out=self.known)
            else:
                self._weakly(detector, known.max(), (sem or "a volatile load", scope), where)
        self._weakly(detector, planes[_WEAK_RELEASED, heap][granules].max(), (sem or "a volatile load", scope),
                     where)

    def _weakly(self, detector: Detector, clock: int, how, where) -> None:
        """The running program read a flag that another program of the launch changed at `clock`
        without a release and an acquire at gpu or sys scope between them."""
        if self.first < clock < self.start and clock > self.weak_clock:
            self.weak_clock, self.weak_read = int(clock), (detector._site(where), *how)

    def hint(self, detector: Detector, other_clock: int) -> str:
        """What the report adds where the running program read a flag that the other program changed
        after its access, with too weak a sem or scope on one side."""
        if self.weak_read is None or self.weak_clock < other_clock:
            return ""
        made_by = np.searchsorted(self.starts[:self.ordinal + 1], [other_clock, self.weak_clock], side="right")
        if made_by[0] != made_by[1]:  # a flag of a third program
            return ""
        site, sem, scope = self.weak_read
        return (f" The later program did read a flag the earlier one changed after its access "
                f"({detector.shadow.site(detector.rank, site)}, sem={sem}, scope={scope}): that read or the "
                "write it saw lacks acquire / release at gpu or sys scope.")

    def learn(self, clock: int) -> None:
        """A system-scope acquire joined this rank's `clock` from a peer's release: the program that
        made that access is seen up to it (what that program had seen is not: a peer's vector clock
        keeps one entry per rank)."""
        if self.first < clock < self.start:
            made_by = int(np.searchsorted(self.starts[:self.ordinal + 1], clock, side="right")) - 1
            self.known[made_by] = max(int(self.known[made_by]), clock)


def _programs_remedy(other: str, other_kind: str, me: str, kind: str) -> str:
    """What orders two accesses of programs of one launch on one rank (they run side by side on a GPU)."""
    text = ""
    if other_kind == kind == "store":
        text = ("two programs store into the same elements: do their tiles overlap (an off-by-one tile "
                "mapping, chunks that overlap)? Give each program its own elements; else ")
    return text + (
        f"to order them, program {other} must release a flag after its {other_kind} (an atomic with "
        f"sem='release' or 'acq_rel', scope='gpu' or 'sys') and program {me} acquire it before its {kind} "
        "(sem='acquire' or 'acq_rel', scope='gpu' or 'sys'), or the two must be separate launches: the "
        "programs of a launch run concurrently, tl.debug_barrier orders the threads of one program only, "
        "an atomic at scope='cta' orders nothing between programs and a device_barrier orders ranks, not "
        "the programs of one launch.")


def _distinct(indices):
    """`indices` without repeats (ascending ones, the common case, in one pass)."""
    if indices.size > 1 and bool((indices[1:] >= indices[:-1]).all()):
        return indices[np.concatenate(([True], indices[1:] != indices[:-1]))]
    return np.unique(indices)


def _bytes_of(offsets, element: int):
    """The byte offsets of the elements of `element` bytes at `offsets`."""
    if offsets.size > 1 and offsets[-1] - offsets[0] == (offsets.size - 1) * element and bool(
            (np.diff(offsets) == element).all()):
        return np.arange(int(offsets[0]), int(offsets[-1]) + element)  # consecutive elements: one range
    return (offsets[:, None] + np.arange(element)).reshape(-1)


def _span(indices):
    """`indices` as a slice where they are consecutive and ascending (a view, not a gather)."""
    if indices.size == 1 or (indices[-1] - indices[0] == indices.size - 1 and bool((np.diff(indices) == 1).all())):
        return slice(int(indices[0]), int(indices[-1]) + 1)
    return indices


def _packed(x, y, z) -> int:
    """A program id (its grid index) as access records hold it, in one word (`_program` reads it)."""
    return int(x) | int(y) << 20 | int(z) << 40


def _program(packed: int) -> str:
    """A program id as access records pack it: "3", or "(3, 1)" / "(3, 1, 2)" in 2-D / 3-D grids."""
    x, y, z = packed & 0xFFFFF, packed >> 20 & 0xFFFFF, packed >> 40
    return f"({x}, {y}, {z})" if z else f"({x}, {y})" if y else str(x)


def emit(mode: str, reports: list[str], kernel=None) -> None:
    """Raises RaceError (mode "raise") or warns RaceWarning naming every race found. `kernel`: the
    kernel that ran, whose file names the lines of functions pickled by value into a rank's worker
    (cloudpickle calls their file "<dynamic-code>"; they come from the host's __main__ script)."""
    text = "\n".join(reports)
    code = getattr(getattr(kernel, "fn", kernel), "__code__", None)
    if code is not None and not code.co_filename.startswith("<"):
        text = text.replace(_DYNAMIC, _short(code.co_filename))
    if mode == "raise":
        raise RaceError(text)
    warnings.warn(text, RaceWarning, stacklevel=3)


# -- the interpreter's hooks -------------------------------------------------------------------------
class _Acquiring(threading.local):
    active = False


_ACQUIRING = _Acquiring()


def acquiring_now() -> bool:
    """Whether this thread's loads are acquiring now (inside `acquiring`)."""
    return _ACQUIRING.active


@contextlib.contextmanager
def acquiring():
    """Marks the loads inside as acquiring at system scope (the simulator's load_acquire)."""
    _ACQUIRING.active = True
    try:
        yield
    finally:
        _ACQUIRING.active = False


_SEMS: dict = {}
_SCOPES: dict = {}


def _names(sem, scope) -> tuple[str, str]:
    s = _SEMS.get(sem)
    if s is None:
        s = _SEMS[sem] = {"ACQUIRE_RELEASE": "acq_rel", "ACQUIRE": "acquire", "RELEASE": "release",
                          "RELAXED": "relaxed"}.get(getattr(sem, "name", str(sem)).split(".")[-1], "relaxed")
    c = _SCOPES.get(scope)
    if c is None:
        c = _SCOPES[scope] = {"SYSTEM": "sys", "GPU": "gpu", "CTA": "cta"}.get(
            getattr(scope, "name", str(scope)).split(".")[-1], "gpu")
    return s, c


def builder_patches(ti, detector: Detector) -> list:
    """[(object, name, value)]: the interpreter builder's memory ops, each through `detector` first."""
    builder = ti.InterpreterBuilder
    load, store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas

    def masked_load(self, ptrs, mask, other, *policy):
        volatile = bool(policy[-1]) if policy else False
        if _ACQUIRING.active or volatile:  # a flag read: a strong load, which races only with plain stores
            sem = "acquire" if _ACQUIRING.active else ""
            touched = detector.access(self, ptrs, mask, FLAG_LOAD, sem, "sys")
            out = load(self, ptrs, mask, other, *policy)
            if touched:
                detector.acquire(touched, sem, "sys")
            return out
        detector.access(self, ptrs, mask, LOAD)
        return load(self, ptrs, mask, other, *policy)

    def masked_store(self, ptrs, value, mask, *policy):
        detector.access(self, ptrs, mask, STORE)
        return store(self, ptrs, value, mask, *policy)

    def atomic_rmw(self, op, ptr, value, mask, sem, scope):
        sem_name, scope_name = _names(sem, scope)
        touched = detector.access(self, ptr, mask, ATOMIC, sem_name, scope_name)
        out = rmw(self, op, ptr, value, mask, sem, scope)
        if touched:
            detector.acquire(touched, sem_name, scope_name)
        return out

    def atomic_cas(self, ptr, cmp, value, sem, scope):
        sem_name, scope_name = _names(sem, scope)
        touched = detector.access(self, ptr, None, ATOMIC, sem_name, scope_name)
        out = cas(self, ptr, cmp, value, sem, scope)
        if touched:
            detector.acquire(touched, sem_name, scope_name)
        return out

    return [(builder, "create_masked_load", masked_load), (builder, "create_masked_store", masked_store),
            (builder, "create_atomic_rmw", atomic_rmw), (builder, "create_atomic_cas", atomic_cas)]


_DETECTORS: dict = {}


def detector(session: str, world_size: int, heap_size: int, heap_bases, rank: int) -> Detector:
    """This process's detector of `rank` in `session` (its clock lives as long as the process)."""
    key = (session, rank)
    found = _DETECTORS.get(key)
    if found is None:
        found = _DETECTORS[key] = Detector(session, world_size, heap_size, heap_bases, rank)
    return found
