"""The simulator's host collectives, met in C: one entry into Python per collective call.

Where the simulator runs a collective call on the host (iris_core.sim.host_collectives), a
Python FFI handler on every device's thread would take the GIL, record the call, join the
meeting, wait and take the GIL again to return: eight devices pay that eight times per call,
while XLA's own collectives meet in C. A training step of small collectives is mostly that.

So the call site lowers to host_meeting.c's handler instead, with its C site (an address) as an
attribute. A member that is not the last to arrive leaves its buffer pointers there and waits
without the GIL; the last one does the whole call for every member, as Rendezvous.run's last
member does. Where the site has a plan (`_plan`: the copies, and sums in float32, bfloat16 and
int32, maxima and minima in int32) and the members made the same call from the same site, the C
code writes their call records and combines (the values of host_collectives.execute, bit for bit);
otherwise it enters Python once (`_complete`): the records, the signatures compared, the combine,
the sites compared. The C meeting numbers the call table's records (CallTable.count_with), so
that records written here and in Python agree. Python is also entered the first time a (site,
rank) meets its group row, and to word an error: timeouts, mismatches, failed groups and a
shut-down runtime are named with the Python meeting's texts. Without a C compiler (c_build), the
Python handler and Rendezvous run these calls, with the same values and errors.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import threading
import traceback
import warnings
from dataclasses import dataclass, field

from iris_core import faults
from iris_core.collectives import kinds
from iris_core.errors import IrisError, PeerFailedError, PeerTimeoutError, RankDivergenceWarning
from iris_core.sim import call_table, host_collectives
from iris_jax import _runtime as runtime_lib
from iris_jax.calls import _ffi, c_build, cpu_execution

# a meeting's state, a member's outcome (host_meeting.c's)
_DONE, _TIMED_OUT, _CLOSED, _FAILED, _UNRESOLVED, _ERROR = 1, 2, 3, 4, 5, 6

_RESOLVER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int64))
_COMPLETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_DESCRIBER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                              ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t)


@dataclass
class _Site:
    """A call site lowered to the C handler: what its calls ask for, and the group rows read."""

    spec: cpu_execution.KernelSpec
    groups: dict = field(default_factory=dict)  # rank -> cpu_execution._Group


_sites: dict[int, _Site] = {}  # by the number the C site carries (kept, as the FFI targets are)
_ids = itertools.count(1)
_messages: dict[tuple[int, int], str] = {}  # (meeting, rank) -> the error _complete worded for it
_lock = threading.Lock()
enabled = True  # tests switch it off to run the Python meeting (as without a C compiler)


@functools.cache
def _library() -> ctypes.CDLL | None:
    layout = (f"-DBUCKETS={call_table.BUCKETS}", f"-DRING={call_table.RING}",
              f"-DRECORD_BYTES={call_table.RECORD_BYTES}", f"-DTEXT_BYTES={call_table.TEXT_BYTES}",
              *(f"-D{name.upper()}={getattr(kinds, name.upper())}" for name in
                ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "sum", "max")))
    lib = c_build.build("host_meeting", flags=layout, what="the simulator's collective meeting place",
                        instead="the Python meeting (iris_jax.calls.host_meeting)")
    if lib is None:
        return None
    lib.iris_meet_place.restype = ctypes.c_void_p
    lib.iris_meet_site.restype = ctypes.c_void_p
    lib.iris_meet_site.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_double,
                                   ctypes.c_int64, ctypes.c_int64, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int64)]
    lib.iris_meet_next_record.restype = ctypes.c_int64
    lib.iris_meet_next_record.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64]
    lib.iris_meet_seed.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_int64, ctypes.c_int64]
    lib.iris_meet_member.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    lib.iris_meet_number.restype = ctypes.c_int64
    lib.iris_meet_number.argtypes = [ctypes.c_void_p]
    lib.iris_meet_set_status.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.iris_meet_fail_group.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    lib.iris_meet_close.argtypes = [ctypes.c_void_p]
    lib.iris_meet_start(_resolve, _complete, _describe)
    return lib


class _Place:
    """A runtime's meeting place in C (a runtime service: closed with it, which fails the calls waiting).
    It numbers the runtime's call records from now on, as it writes some of them."""

    def __init__(self, rt, lib: ctypes.CDLL):
        self.lib, self.address = lib, lib.iris_meet_place()
        if rt.call_table is not None:
            rt.call_table.count_with(lambda rank, key: lib.iris_meet_next_record(self.address, key, rank),
                                     lambda rank, key, count: lib.iris_meet_seed(self.address, key, rank, count))

    def close(self) -> None:
        self.lib.iris_meet_close(self.address)


def site(rt, spec: cpu_execution.KernelSpec) -> tuple[str, int] | None:
    """The FFI target and C site (its address, the handler's attribute) of a call lowered for `rt`, or
    None where the call is not a host collective of this runtime or no C library could be built. The
    target is the C handler under a name of its own, as every simulator call site has. Calls meet in
    Python where the race detector is on (that meeting joins the members' vector clocks) or faults
    are injected (each call asks the plan first: iris_jax._runtime.injected)."""
    if (spec.host is None or not enabled or not cpu_execution.runs_collectives_here(rt) or rt.detect_races
            or rt.fault_plan is not None):
        return None
    lib = _library()
    if lib is None:
        return None
    place = rt.service("host_meeting", lambda _: _Place(rt, lib))
    with _lock:
        number = next(_ids)
        _sites[number] = _Site(spec)
    table = rt.call_table
    _, digest, text = table.record_text(spec.what, tuple(spec.site)) if table is not None else ("", 0, b"")
    plan = (ctypes.c_int64 * (7 + spec.host.members))(*_plan(spec))
    address = lib.iris_meet_site(place.address, number, spec.host.members, spec.group_nbytes, spec.host.timeout_s,
                                 spec.signature, digest, text.ljust(call_table.TEXT_BYTES, b"\0"), plan)
    handler = _ffi.capsule_at(ctypes.cast(lib.iris_host_meeting, ctypes.c_void_p).value)
    return _ffi.register_cpu_capsule("iris_cpu_kernel", handler), address


# the types whose sums the C code combines as host_collectives does (their accumulators: float32, int32)
_TYPES = {"float32": 1, "bfloat16": 2, "int32": 3}
_BYTES = 4  # copies: any type


def _plan(spec: cpu_execution.KernelSpec) -> list[int]:
    """host_meeting.c's plan of a site: kind, op, type (0: Python does the call), in and out blocks,
    in and out bytes, then every member's source."""
    call, dtype = spec.host, spec.operand_dtypes[0].name
    if call.kind in (kinds.ALL_REDUCE, kinds.REDUCE_SCATTER):
        # (float maxima and minima stay with numpy, whose NaN and signed-zero rules they follow)
        kind_type = _TYPES[dtype] if dtype == "int32" or (call.op == kinds.SUM and dtype in _TYPES) else 0
    elif kinds.gathers(call.kind) or kinds.from_one_source(call.kind):
        kind_type = _BYTES
    else:  # ragged_all_to_all
        kind_type = 0
    sources = list(call.sources) or [-1] * call.members
    return [call.kind, call.op, kind_type, call.in_blocks, call.out_blocks, spec.operand_nbytes[0],
            spec.result_nbytes[0], *sources]


@_RESOLVER
def _resolve(number: int, rank: int, row: int, out) -> int:
    """Reads rank's group row at site `number` into `out`: the group's key, rank's place, its call
    table's address (0: none), the members."""
    try:
        spec = _sites[number].spec
        rt = spec.runtime()
        if rt is None:
            return 1
        group = _sites[number].groups[rank] = cpu_execution.group_row(rt, row, spec.group_nbytes)
        out[0], out[1] = group.key, group.index
        out[2] = rt.call_table.records_at(rank) if rt.call_table is not None else 0
        for i, member in enumerate(group.members):
            out[3 + i] = member
        return 0
    except BaseException:  # (nothing may cross into C) the caller names the call as failed
        traceback.print_exc()
        return 1


@_COMPLETER
def _complete(meeting: int) -> None:
    """The last member's work: every member's record, then the call (or the mismatch), every member's outcome."""
    _ffi.keep_thread_state()
    lib = _library()
    number, members, size = lib.iris_meet_number(meeting), [], 1
    out = (ctypes.c_int64 * 64)()
    while len(members) < size:  # (the first answer gives the size)
        size = lib.iris_meet_member(meeting, len(members), out)
        site, rank, nargs, nrets = _sites[out[0]], out[1], out[2], out[3]
        members.append((site, rank, list(out[4:4 + nargs]), list(out[4 + nargs:4 + nargs + nrets])))
    first = members[0][0].spec
    try:
        rt = first.runtime()
        if rt is None:
            raise runtime_lib.stale_program_error(f"kernel {first.kernel_name}")
        with rt.running_call(f"kernel {first.kernel_name}"):
            outcomes = _call(rt, lib, meeting, number, members)
    except BaseException as e:  # every member fails with it
        outcomes = [f"{type(e).__name__}: {e}"] * len(members)
    for i, ((_, rank, _, _), outcome) in enumerate(zip(members, outcomes)):
        if outcome is None:
            lib.iris_meet_set_status(meeting, i, _DONE)
        else:
            _messages[meeting, rank] = outcome


def _call(rt, lib, meeting: int, number: int, members: list) -> list[str | None]:
    """Each member's error text (None: its output is written)."""
    group = members[0][0].groups[members[0][1]]
    table = rt.call_table
    calls = [table and table.begin(rank, group.key, site.spec.signature, site.spec.what, site.spec.site)
             for site, rank, _, _ in members]
    signatures = [site.spec.signature for site, _, _, _ in members]
    if len(set(signatures)) > 1:  # nothing moves; the group fails
        ranks = group.members
        other = next(i for i, s in enumerate(signatures) if s != signatures[0])
        lib.iris_meet_fail_group(meeting, ranks[0], ranks[other])
        errors = []
        for i, (site, rank, _, _) in enumerate(members):
            theirs = next(j for j, s in enumerate(signatures) if s != signatures[i])
            error = host_collectives.mismatch(site.spec.host, rank, ranks[theirs], number, ranks)
            errors.append(_text(cpu_execution.named_fault(rt, calls[i], ranks, error)))
        return errors
    spec = members[0][0].spec
    buffers = [cpu_execution.host_buffers(site.spec, ins[2:len(ins) - site.spec.ordered_after], outs)
               for site, _, ins, outs in members]
    try:
        host_collectives.execute(spec.host, buffers)
    except Exception as e:
        detail = "".join(traceback.format_exception(e))
        return [f"IrisError: iris {spec.host.what} on rank {rank}: the member that ran the call failed: "
                f"{type(e).__name__}: {e}\n{detail}" for _, rank, _, _ in members]
    sites = {call.site for call in calls if call and call.site}
    if len(sites) > 1:  # (rare: the members made the call from different lines)
        for call, (_, rank, _, _) in zip(calls, members):
            divergence = table.divergence(call, group.members)
            if divergence:
                warnings.warn(f"rank {rank}: {divergence}", RankDivergenceWarning, stacklevel=1)
    return [None] * len(members)


@_DESCRIBER
def _describe(outcome: int, number: int, rank: int, peer: int, call: int, meeting: int, buffer: int,
              size: int) -> None:
    """Writes why rank's call `call` at site `number` failed into `buffer` (XLA's error text)."""
    try:
        text = _error_text(outcome, _sites[number], rank, peer, call, meeting)
    except BaseException as e:  # (nothing may cross into C)
        text = f"IrisError: iris could not word a failed collective call: {type(e).__name__}: {e}"
    encoded = text.encode(errors="replace")[:size - 1]
    ctypes.memmove(buffer, encoded + b"\0", len(encoded) + 1)


def _error_text(outcome: int, site: _Site, rank: int, peer: int, number: int, meeting: int) -> str:
    if outcome == _ERROR:
        return _messages.pop((meeting, rank), "IrisError: iris: a collective call failed (internal error)")
    spec = site.spec
    rt = spec.runtime()
    if rt is None or outcome == _CLOSED:
        return _text(runtime_lib.stale_program_error(f"kernel {spec.kernel_name}"))
    if outcome == _UNRESOLVED:
        return f"IrisError: iris {spec.what}: rank {rank}'s group row could not be read (internal error)"
    try:
        with rt.running_call(f"kernel {spec.kernel_name}"):  # (the call table is on the heaps)
            group = site.groups[rank]
            call = rt.call_table and rt.call_table.begin(rank, group.key, spec.signature, spec.what, spec.site)
            where = dict(epoch=number, group=group.workspace)
            if outcome == _FAILED:
                return _text(PeerFailedError(faults.message(faults.PEER_FAILED, spec.host.what, rank, peer,
                                                            **where)))
            error = PeerTimeoutError(faults.message(faults.TIMEOUT, spec.host.what, rank, peer, **where))
            return _text(cpu_execution.named_fault(rt, call, group.members, error))
    except IrisError as e:  # shut down meanwhile
        return _text(e)


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
