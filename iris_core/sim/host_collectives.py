"""The collective kernel's meaning on the host: what the simulator runs in its place.

Where every member of a group lives in one process (the simulator's single-process model, in
which XLA runs each CPU device's program on a thread of its own), a collective call needs no
kernel and no worker: the members meet at an in-process rendezvous, as XLA:CPU's own
collectives do, and the last to arrive reads every member's input where it lies and writes
every member's output. Values are the kernel's bit for bit: contributions are combined in
member order in the kernel's accumulator type and rounded once to the output's
(iris_core.collectives.tiles, `combined`), maxima and minima let a NaN lose (the GPU's max.f32;
the interpreter is patched the same way), and integer sums wrap (tests/jax/test_host_collectives.py
compares every kind with the kernel). ragged_all_to_all's slices land as its kernel puts them.

Faults are the kernel's too. Calls pair as the kernels pair them, by their number in the
group's sequence (a rank that skips a call pairs its next one with the others' skipped one);
members whose signatures differ fail at once with RankMismatchError before anything is
exchanged; a member that does not arrive within the call's timeout fails the waiting ones
with PeerTimeoutError naming it; and either leaves the group failed, so that its later calls
fail at once with PeerFailedError, as the kernels' poisoned flags make them, until the
runtime is started again (a new Rendezvous).

Rendezvous is the meeting in Python. Under JAX the members meet in C where a C compiler is found
(iris_jax/calls/host_meeting.c, with the same pairing, faults and texts), which does the copies
and the common sums itself and calls `execute` for the rest; Rendezvous runs where it cannot be
built.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np

from iris_core import faults
from iris_core.collectives import kinds
from iris_core.errors import IrisError, PeerFailedError, PeerTimeoutError, RankMismatchError

_COMBINE = {kinds.SUM: np.add, kinds.MAX: np.fmax, kinds.MIN: np.fmin}
# the all-reduce algorithms run here: those that combine in member order (ring, atomic and spinlock
# combine in another order, so their kernels run)
ALL_REDUCE_VARIANTS = (kinds.ONE_SHOT, kinds.TWO_SHOT)


@dataclass(frozen=True)
class Collective:
    """What a call of the collective kernel asks for (its constexprs; iris_core.collectives.kinds)."""

    kind: int
    op: int
    variant: int
    members: int  # G
    in_blocks: int  # XB
    out_blocks: int  # OB
    sources: tuple  # PPERMUTE / BROADCAST: each member's source member (-1: none, zeros)
    accumulator: np.dtype
    what: str
    timeout_s: float
    slices: int = 0  # RAGGED_ALL_TO_ALL: the slices each member sends each member


class _Meeting:
    """One call of one group: the members' buffers as they arrive."""

    def __init__(self, size: int):
        self.buffers: list[tuple | None] = [None] * size  # each member's (input, ..., output)
        self.signatures: list[int | None] = [None] * size
        self.sites: list[int] = [0] * size
        self.clocks: list = [None] * size  # each member's vector clock, where the race detector is on
        self.arrived = 0
        self.ready = False  # the last member to arrive wrote every member's output (or found a mismatch)
        self.error: BaseException | None = None  # ... or failed doing so
        self.waiters: list[threading.Lock] = []  # one per member waiting, released when it may go on


@dataclass(frozen=True)
class _Failure:
    rank: int  # the rank that gave up first
    waited_for: int  # the rank it gave up on


class Rendezvous:
    """The meeting place of one runtime's collective calls, by group and call number.

    The last member to arrive does the whole call: it reads every member's input where it lies
    and writes every member's output, while the others wait (their buffers stay theirs until
    they return), so nothing is copied but what the call moves. Each waiting member blocks on a
    lock of its own that the last one releases: one wake-up per member, no lock contended after
    it. XLA:CPU's own collectives meet the same way.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._meetings: dict[tuple[int, int], _Meeting] = {}  # (group, call number) -> its meeting
        self._counts: dict[tuple[int, int], int] = {}  # (group, rank) -> calls made
        self._failed: dict[int, _Failure] = {}  # group -> how it failed

    def run(self, call: Collective, group: int, members: list[int], me: int, signature: int, site: int,
            buffers: tuple, *, workspace: int = -1, clock: np.ndarray | None = None) -> bool:
        """Member `me` (of `members`, global ranks) makes its next call of `group` on `buffers`: its
        input as [in_blocks, m] and its output as [out_blocks, m] (RAGGED_ALL_TO_ALL: its operand [N,
        R], input offsets, send sizes, output offsets, and its output [M, R], which holds the
        output operand). `signature` is what the members' calls must agree on, `site` where the
        program made it (a digest; 0: unknown), `workspace` the group's heap offset, which errors name.
        `clock`: the member's vector clock (iris_core.sim.races), joined in place with every member's as
        they arrived: the call orders each member's later accesses after every member's earlier ones.

        Returns:
          Whether a member made the call from another site of the program (its sites known).

        Raises:
          PeerTimeoutError: a member did not arrive within the call's timeout (the group then fails).
          RankMismatchError: a member's signature differs (the group then fails).
          PeerFailedError: an earlier call of the group failed.
        """
        rank = members[me]
        with self._lock:
            number = self._counts.get((group, rank), 0)
            self._counts[group, rank] = number + 1
            where = dict(epoch=number, group=workspace)
            self._raise_if_failed(call, group, rank, where)
            key = (group, number)
            meeting = self._meetings.get(key)
            if meeting is None:
                meeting = self._meetings[key] = _Meeting(len(members))
            meeting.buffers[me] = buffers
            meeting.signatures[me], meeting.sites[me] = signature, site
            meeting.clocks[me] = clock
            meeting.arrived += 1
            last = meeting.arrived == len(members)
            if last:
                del self._meetings[key]
            else:
                waiter = threading.Lock()
                waiter.acquire()
                meeting.waiters.append(waiter)
        if last:
            try:
                _join(meeting.clocks)
                if len(set(meeting.signatures)) == 1:
                    execute(call, meeting.buffers)
            except BaseException as e:  # no member may return as if its output were written
                meeting.error = e
                raise
            finally:
                meeting.ready = True
                for waiter in meeting.waiters:  # (every member arrived: no more are added)
                    waiter.release()
        elif not waiter.acquire(timeout=call.timeout_s):
            with self._lock:
                if meeting.arrived < len(members):  # timed out: the group fails
                    missing = next(m for i, m in enumerate(members) if meeting.buffers[i] is None)
                    self._fail(group, _Failure(rank, missing))
            if not meeting.ready and meeting.arrived < len(members):
                raise PeerTimeoutError(faults.message(faults.TIMEOUT, call.what, rank, missing, **where))
            waiter.acquire()  # every member arrived: the last one is at work
        if not meeting.ready:  # woken by a member waiting here that timed out
            missing = next(m for i, m in enumerate(members) if meeting.buffers[i] is None)
            raise PeerTimeoutError(faults.message(faults.TIMEOUT, call.what, rank, missing, **where))
        if meeting.error is not None:
            raise IrisError(f"iris {call.what} on rank {rank}: the member that ran the call failed: "
                            f"{type(meeting.error).__name__}: {meeting.error}") from meeting.error
        other = next((i for i, s in enumerate(meeting.signatures) if s != signature), None)
        if other is not None:
            with self._lock:
                self._fail(group, _Failure(rank, members[other]))
            raise mismatch(call, rank, members[other], number, members)
        return bool(site) and any(s and s != site for s in meeting.sites)

    def _raise_if_failed(self, call: Collective, group: int, rank: int, where: dict) -> None:
        failure = self._failed.get(group)
        if failure is not None:
            peer = failure.rank if failure.rank != rank else failure.waited_for
            raise PeerFailedError(faults.message(faults.PEER_FAILED, call.what, rank, peer, **where))

    def _fail(self, group: int, failure: _Failure) -> None:
        """Marks `group` failed and wakes every member waiting in one of its calls (they time out too)."""
        self._failed.setdefault(group, failure)
        for key in [k for k in self._meetings if k[0] == group]:
            for waiter in self._meetings.pop(key).waiters:
                if waiter.locked():
                    waiter.release()


def _join(clocks: list) -> None:
    """Each member's vector clock becomes the join of all (members without one: the detector is off)."""
    present = [c for c in clocks if c is not None]
    if len(present) > 1:
        joined = np.maximum.reduce(present)
        for c in present:
            c[:] = joined


_PASS_BYTES = 256 << 10  # the accumulator's bytes per pass: it stays in cache while every member's part is added


def _combine_into(call: Collective, contributions: list[np.ndarray], outs: list[np.ndarray]) -> None:
    """The contributions combined in member order in the accumulator type, rounded once to the
    output's (tiles.combined), into each of `outs`; column range by column range (the same values:
    every element is combined alone), which keeps the accumulator in cache."""
    combine, step = _COMBINE[call.op], max(1, _PASS_BYTES // call.accumulator.itemsize)
    with np.errstate(all="ignore"):  # inf - inf and integer wrap-around are values here, as on a GPU
        for c in range(0, contributions[0].shape[-1], step):
            acc = contributions[0][..., c:c + step].astype(call.accumulator)
            for value in contributions[1:]:
                combine(acc, value[..., c:c + step].astype(call.accumulator, copy=False), out=acc)
            for out in outs:
                out[..., c:c + step] = acc


def mismatch(call: Collective, rank: int, other: int, number: int, members: list[int]) -> RankMismatchError:
    """The error of `rank`, whose call `number` of the group differs from rank `other`'s."""
    return RankMismatchError(f"iris {call.what}: rank {other} made a different call than rank {rank} (call "
                             f"{number} of the group of ranks {members})")


def execute(call: Collective, buffers: list[tuple]) -> None:
    """What the last member to arrive does: every member's output from every member's input (each
    member's buffers as Rendezvous.run takes them; the table in iris_core.collectives.kinds), an
    all-reduce's combined once for every member. (Members writing their own outputs side by side,
    then waiting for each other, was no faster on two cores: RESULTS.md.)"""
    if call.kind == kinds.RAGGED_ALL_TO_ALL:
        for me in range(len(buffers)):
            _ragged(call, buffers, me)
        return
    inputs, outputs = [b[0] for b in buffers], [b[-1] for b in buffers]
    if call.kind == kinds.ALL_REDUCE:
        _combine_into(call, [x[0] for x in inputs], [out[0] for out in outputs])
    elif call.kind == kinds.REDUCE_SCATTER:
        for me, out in enumerate(outputs):
            _combine_into(call, [x[me] for x in inputs], [out[0]])
    elif kinds.gathers(call.kind):
        for me, out in enumerate(outputs):
            for i, x in enumerate(inputs):
                out[i] = x[me if call.in_blocks > 1 else 0]
    else:  # from one source: PPERMUTE, BROADCAST
        for me, out in enumerate(outputs):
            source = call.sources[me]
            out[0] = inputs[source][0] if source >= 0 else 0


def _ragged(call: Collective, buffers: list[tuple], me: int) -> None:
    """ragged_all_to_all (iris_core.collectives.ragged): sender j's slice me * S + s, rows [start, start
    + size) of its operand, lands at rows [target, target + size) of member me's output; rows that
    fall outside the operand or the output are skipped, and rows nobody sends keep their values."""
    S, out = call.slices, buffers[me][-1]
    M = out.shape[0]
    for x, starts, sizes, targets, _ in buffers:
        N = x.shape[0]
        for k in range(me * S, me * S + S):
            start, shift = int(starts[k]), int(targets[k]) - int(starts[k])
            lo, hi = max(start, 0, -shift), min(start + int(sizes[k]), N, M - shift)
            if lo < hi:
                out[lo + shift:hi + shift] = x[lo:hi]


MODES = ("host", "kernels")  # how the simulator runs the collectives: here, or the kernels under the interpreter


def mode_of(value: str | None) -> str:
    """The mode a setting names (None: environment IRIS_SIM_COLLECTIVES, else "host")."""
    value = os.environ.get("IRIS_SIM_COLLECTIVES", "host") if value is None else value
    mode = str(value).strip().lower()
    if mode not in MODES:
        raise ValueError(f"sim_collectives must be 'host' or 'kernels' (IRIS_SIM_COLLECTIVES); got {value!r}")
    return mode
