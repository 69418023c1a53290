"""The ranks' launches of one kernel call site, run as one batched replay (simulator, one process).

Each rank's launch of a user's kernel goes to its rank's worker, where the interpreter replays the
kernel's recorded program (iris_core.sim.replay): at 8 ranks, eight replays of the same operations
and eight round trips. For kernels whose program has a batched form (iris_core.sim.batched: no
waits, every operation with a rule), the ranks of the call site meet here instead, and the last to
come runs them all as one replay, on XLA's buffers: the worker that recorded the program hands its
batched form over, and it runs without Triton's front end. Whether launches meet changes no result:
one batched replay is one of the orders in which the ranks' kernels may run.

Launches run one per rank, in their workers, where they do not meet:
* the call site's first launches (they ask their workers for the form);
* with the race detector or debug (replays run without them), or for a kernel without a batched form;
* launches of more than `MAX_BYTES` of operands and results per rank;
* a launch that comes after its meeting ran without it: a rank late by more than `GATHER_S`, or one
  that skipped the call under lax.cond. After `MISSES` missed meetings the call site runs per rank
  for good.
"""

from __future__ import annotations

import os
import threading
import time

ENABLED = os.environ.get("IRIS_SIM_BATCH", "1") != "0"  # IRIS_SIM_BATCH=0: every launch in its rank's worker
# launches whose operands and results exceed this per rank run per rank: their numpy work is most of
# their time, and the workers do it on every core where one batched replay does it on one (RESULTS.md)
MAX_BYTES = 1 << 19
GATHER_S = 1.0  # how long the ranks that came wait for one that has not
MISSES = 3  # meetings a rank may miss before the call site runs per rank for good
ALONE = object()  # a launch's result that says: run it alone, in its rank's worker


class KernelBatch:
    """One call site's meetings: each rank's k-th launch meets the other ranks' k-th."""

    def __init__(self, ranks: tuple[int, ...]):
        self.ranks = ranks
        self.form = None  # the kernel's batched program (iris_core.sim.batched), once a worker handed it over
        self.asks = True  # not known yet: the launches run per rank and ask their workers for it
        self.off = False  # ranks missed MISSES meetings: every launch runs alone
        self.runs = self.misses = 0  # batched replays run, meetings missed (for tests and benchmarks)
        self._cond = threading.Condition()
        self._count = dict.fromkeys(ranks, 0)
        self._open: dict[int, _Gathering] = {}
        self._missed: dict[int, set] = {}  # generation -> the ranks that have not come to its meeting yet

    @property
    def meets(self) -> bool:
        return self.form is not None and not self.off

    def learn(self, form) -> None:
        """What a worker said of the kernel's program: its batched form, or None (it has none)."""
        with self._cond:
            if self.asks:
                self.form, self.asks = form, False

    def launch(self, rank: int, launch, run):
        """Rank's `launch` in its meeting; the last to come runs them all, `run(launches)` giving each
        one's error or None, or ALONE. Returns this launch's result, or ALONE where it came after its
        meeting ran without it (late, or the meetings are off)."""
        with self._cond:
            if not self.meets:
                return ALONE
            generation = self._count[rank]
            self._count[rank] += 1
            missed = self._missed.get(generation)
            if missed is not None:  # late: the others ran without this launch
                missed.discard(rank)
                if not missed:
                    del self._missed[generation]
                return ALONE
            gathering = self._open.setdefault(generation, _Gathering())
            gathering.launches[rank] = launch
            if len(gathering.launches) < len(self.ranks):
                deadline = time.monotonic() + GATHER_S
                while not gathering.closed:
                    left = deadline - time.monotonic()
                    if left <= 0:  # a rank is late, or skipped the call (lax.cond): the ones here run
                        self._missed[generation] = set(self.ranks) - set(gathering.launches)
                        self.misses += 1
                        self.off = self.misses >= MISSES  # a rank that keeps missing them: per rank from now on
                        break
                    self._cond.wait(left)
                if gathering.closed:  # another launch runs them
                    while not gathering.done:
                        self._cond.wait()
                    return gathering.results[rank]
            gathering.closed = True
            del self._open[generation]
            self._cond.notify_all()
        ranks = sorted(gathering.launches)
        try:
            results = run([gathering.launches[r] for r in ranks])
        except BaseException as e:  # noqa: BLE001  (every launch of the meeting fails with it)
            results = [e] * len(ranks)
        with self._cond:
            gathering.results = dict(zip(ranks, results))
            gathering.done = True
            self.runs += 1
            self._cond.notify_all()
        return gathering.results[rank]


class _Gathering:
    __slots__ = ("launches", "closed", "done", "results")

    def __init__(self):
        self.launches: dict = {}  # rank -> its launch
        self.closed = False  # a launch took them to run
        self.done = False
        self.results: dict = {}


class KernelBatches:
    """Every call site's meetings (a runtime's service)."""

    def __init__(self):
        self._sites: dict = {}
        self._lock = threading.Lock()

    def sites(self) -> list[KernelBatch]:
        return [site[1] for site in list(self._sites.values())]

    def of(self, spec) -> KernelBatch:
        site = self._sites.get(id(spec))
        if site is None or site[0] is not spec:
            with self._lock:
                site = self._sites[id(spec)] = (spec, KernelBatch(spec.ranks))
        return site[1]
