"""Event ids recorded by device tracing, and their names in exported traces.

The ids are shared by the device (`iris_core.device.tracing`, as constexprs) and the
host (export, plot). Kernels may record their own events with ids from `USER` up;
name them at export with `names={id: "name"}`.
"""

from __future__ import annotations

# RMA ops: recorded automatically by the Context methods of a kernel compiled with tracing=True
LOAD, STORE, GET, PUT, COPY = 0, 1, 2, 3, 4
ATOMIC_ADD, ATOMIC_SUB, ATOMIC_XCHG, ATOMIC_XOR, ATOMIC_AND = 5, 6, 7, 8, 9
ATOMIC_OR, ATOMIC_MIN, ATOMIC_MAX, ATOMIC_CAS = 10, 11, 12, 13
# phases of collectives and synchronization (recorded by the kernels that run them)
WAIT = 16  # waiting for peers' flags
TRANSFER = 17  # moving data between ranks
REDUCE = 18  # combining received data
BARRIER = 19  # a device barrier, from entry to exit
# first id free for kernels' own events
USER = 64

NAMES = {
    LOAD: "load", STORE: "store", GET: "get", PUT: "put", COPY: "copy",
    ATOMIC_ADD: "atomic_add", ATOMIC_SUB: "atomic_sub", ATOMIC_XCHG: "atomic_xchg",
    ATOMIC_XOR: "atomic_xor", ATOMIC_AND: "atomic_and", ATOMIC_OR: "atomic_or",
    ATOMIC_MIN: "atomic_min", ATOMIC_MAX: "atomic_max", ATOMIC_CAS: "atomic_cas",
    WAIT: "wait", TRANSFER: "transfer", REDUCE: "reduce", BARRIER: "barrier",
}
RMA_EVENTS = frozenset(range(LOAD, ATOMIC_CAS + 1))
PHASE_EVENTS = frozenset((WAIT, TRANSFER, REDUCE, BARRIER))


def event_name(event_id: int, names: dict[int, str] | None = None) -> str:
    """Display name of an event id (`names` overrides and extends the built-in ones)."""
    if names and event_id in names:
        return names[event_id]
    return NAMES.get(event_id, f"user_{event_id}" if event_id >= USER else f"event_{event_id}")


def category(event_id: int) -> str:
    """Trace-event category: rma, phase or user."""
    if event_id in RMA_EVENTS:
        return "rma"
    return "phase" if event_id in PHASE_EVENTS else "user"
