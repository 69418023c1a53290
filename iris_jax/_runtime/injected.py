"""Faults injected on purpose, so that code which must name or survive them can be tested.

pytest-iris's `iris_faults` fixture fills a runtime's `FaultPlan`: a rank that dies at its
k-th iris call, a rank that arrives late at one, a rank whose call differs from its peers', a
heap that runs out. The simulator's kernel-call path (iris_jax.calls.cpu_execution) asks the
plan before each call of each rank (`before_call`), heap arrays before each allocation
(`before_allocation`); every fault then takes the path a real one takes, so it is named as a
real one is (PeerTimeoutError on the survivors naming the rank, RankMismatchError naming both
calls, HeapExhaustedError). GPUs ignore the plan.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import defaultdict

from iris_core.errors import HeapExhaustedError, SimulatedRankError

KINDS = ("kill", "delay", "disagree")


@dataclasses.dataclass(frozen=True)
class Injection:
    """One planned fault: `kind` on `rank` at its `at_call`-th iris call (1 = the first)."""

    kind: str
    rank: int
    at_call: int
    seconds: float = 0.0


class FaultPlan:
    """The faults planned for one runtime, and each rank's count of iris calls so far."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._lock = threading.Lock()
        self._calls: dict[int, int] = defaultdict(int)
        self._planned: list[Injection] = []
        self.dead: dict[int, int] = {}  # rank -> the call it died at
        self.deaths: dict[int, str] = {}  # rank -> what its first call after it died raised
        self.heap_out: str | None = None  # why heap arrays cannot be allocated (None: they can)

    def add(self, kind: str, rank: int, at_call: int = 1, seconds: float = 0.0) -> Injection:
        if kind not in KINDS:
            raise ValueError(f"unknown fault {kind!r}; one of {KINDS}")
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is not one of the world's {self.world_size} ranks")
        if at_call < 1:
            raise ValueError(f"at_call counts a rank's iris calls from 1, got {at_call}")
        injection = Injection(kind, rank, at_call, seconds)
        with self._lock:
            self._planned.append(injection)
        return injection

    def calls(self, rank: int) -> int:
        """How many iris calls `rank` has made."""
        return self._calls[rank]

    def before_call(self, rank: int, what: str) -> str | None:
        """Counts rank's call and applies what is planned for it: raises for a dead rank, sleeps
        for a late one; returns a tag to set this call apart from its peers' (a disagreeing
        call), else None."""
        with self._lock:
            self._calls[rank] += 1
            count = self._calls[rank]
            due = [i for i in self._planned if i.rank == rank and i.at_call == count]
            if any(i.kind == "kill" for i in due):
                self.dead.setdefault(rank, count)
        if rank in self.dead:
            death = (f"simulated rank {rank} died at its iris call {self.dead[rank]} (injected by iris_faults.kill); "
                     f"its call {count}, {what}, did not run")
            with self._lock:
                self.deaths.setdefault(rank, death)
            raise SimulatedRankError(death)
        for injection in due:
            if injection.kind == "delay":
                time.sleep(injection.seconds)
        if any(i.kind == "disagree" for i in due):
            return f" (rank {rank}'s call made to differ by iris_faults.disagree)"
        return None

    def death_note(self, ranks) -> str:
        """What the dead ones among `ranks` raised (for a survivor's error: it waited for them), or ""."""
        with self._lock:
            return "\n".join(self.deaths[r] for r in ranks if r in self.deaths)

    def before_allocation(self, nbytes: int) -> None:
        if self.heap_out is not None:
            raise HeapExhaustedError(f"no room for {nbytes} bytes on the heap: {self.heap_out}")
