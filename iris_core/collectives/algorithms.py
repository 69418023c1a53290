"""The all-reduce algorithms as the host sees them: one row each, what it runs and how.

A call that names an algorithm outside its row (another op, dtype or group size) runs one-shot
when the algorithm comes from a configuration, and is refused by the explicit API
(iris_jax.all_reduce). Adding an algorithm: its row here, its name in kinds.VARIANT_NAMES, its
chunk step in a module of its own and its branch in kernels._one_chunk_at_a_time.
"""

from __future__ import annotations

import dataclasses

from iris_core.collectives import kinds
from iris_core.flag_protocol import RING_MAX_MEMBERS


@dataclasses.dataclass(frozen=True)
class Algorithm:
    name: str
    ops: tuple[str, ...] = kinds.OP_NAMES  # the reductions it runs
    dtypes: tuple[str, ...] | None = None  # numpy names of the dtypes it runs (None: every one iris runs)
    min_members: int = 1  # the smallest group it runs (a group of one emits no kernel at all)
    max_members: int | None = None  # the largest group it runs
    pulls: bool = False  # members read their peers' inputs, so inputs on the heap may be read in place

    @property
    def variant(self) -> int:
        """The kernel's VARIANT constexpr."""
        return kinds.VARIANT_NAMES.index(self.name)

    def refusal(self, op: str, dtype: str | None = None, members: int | None = None) -> tuple[type, str] | None:
        """(error type, why) where this algorithm cannot run a call of `op` over `dtype` (a
        numpy name) and `members` ranks; None where it can."""
        if op not in self.ops:
            others = ", ".join(a.name for a in ALGORITHMS.values() if op in a.ops)
            runs = "s, ".join(self.ops) + "s"
            return ValueError, f"all_reduce variant {self.name!r} only {runs}; use {others} for op={op!r}"
        if dtype is not None and self.dtypes is not None and dtype not in self.dtypes:
            others = ", ".join(a.name for a in ALGORITHMS.values() if op in a.ops and a.dtypes is None)
            return TypeError, (f"all_reduce variant {self.name!r} needs {' or '.join(self.dtypes)} (got {dtype}); "
                               f"use {others}")
        if members is not None and self.max_members is not None and members > self.max_members:
            return ValueError, (f"all_reduce variant {self.name!r} supports groups of up to {self.max_members} ranks "
                                f"(got {members})")
        return None

    def check(self, op: str, dtype: str | None = None, members: int | None = None) -> None:
        """Raises the refusal's error, if any (the explicit API's check of a named algorithm)."""
        refused = self.refusal(op, dtype, members)
        if refused:
            error, why = refused
            raise error(why)

    def runs(self, op: str, dtype: str, members: int) -> bool:
        """Whether a call of `op` over `dtype` and `members` ranks runs this algorithm."""
        return self.refusal(op, dtype, members) is None and members >= self.min_members


ALGORITHMS = {a.name: a for a in (
    Algorithm("one_shot", pulls=True),  # every rank reads every peer's input
    Algorithm("two_shot", pulls=True),  # reduce-scatter, then all-gather
    Algorithm("atomic", ops=("sum",), dtypes=("float32", "int32")),  # remote atomic adds into every accumulator
    Algorithm("spinlock", ops=("sum",)),  # read-add-write under a per-tile lock on every rank
    Algorithm("ring", min_members=2, max_members=RING_MAX_MEMBERS),  # 2(G-1) neighbour steps
)}
assert set(ALGORITHMS) == set(kinds.VARIANT_NAMES), "every algorithm has its row"
BY_VARIANT = {a.variant: a for a in ALGORITHMS.values()}
