"""Faults that GPU kernels record, named on the host: a watchdog, and the checks at iris's entry points.

A kernel that gives up writes a record into its rank's fault page (iris_core.faults: pinned
host memory) and stops: with `on_fault="exit"` (the default) the launch completes and the
CUDA context survives; with "trap" the launch fails, and the process's CUDA context with it.
Either way the host reads the page without the CUDA driver:

* the watchdog (a thread per process, like NCCL's) prints each new record on stderr within
  WATCH_S, naming the op, the rank, the peer, the group and the flag epoch (it reads host
  memory only: a CUDA call from its thread could meet XLA's in the driver);
* `iris_jax.check_faults()` (iris_jax.sync) raises the oldest one as PeerTimeoutError,
  PeerFailedError or RankMismatchError. iris's entry points call it: every iris kernel call
  as it is traced, `barrier()`, `check_heap_errors()`, `block_until_ready()`, and each call of
  a function made by `replace_lax_collectives`, which also turns the CUDA error of a trapped
  kernel into the named error (chained). It also raises the accesses the heap guard refused
  (the heap's status word, copied on a stream of its own without waiting for the kernels).

A result that a failed kernel returned is never valid; the call that comes after it through
iris raises. After a fault the group's flags stay poisoned, so every later call of that group
fails at once: start again with `iris_jax.shutdown()` and `init()` (on_fault="exit"), or new
processes (on_fault="trap"). The simulator raises these errors in the kernel itself.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time

from iris_core import errors, faults
from iris_core.heap.status import error_from_word

WATCH_S = 0.2  # how often the watchdog reads the fault pages
# what a kernel does once its record is written (environment IRIS_ON_FAULT; init(on_fault=...))
DEFAULT_ON_FAULT = os.environ.get("IRIS_ON_FAULT") or "exit"
# which fault gates wait on GPUs (iris_jax.calls.fault_gate; environment IRIS_FAULT_GATE; init(fault_gate=...))
GATE_MODES = ("step", "call", "off")
DEFAULT_FAULT_GATE = os.environ.get("IRIS_FAULT_GATE") or "step"


def check_mode(on_fault: str) -> int:
    if on_fault not in faults.MODES:
        raise ValueError(f"unknown on_fault={on_fault!r} (init(on_fault=...) or IRIS_ON_FAULT); choose one of "
                         f"{tuple(faults.MODES)}")
    return faults.MODES[on_fault]


def check_gate(fault_gate: str) -> None:
    if fault_gate not in GATE_MODES:
        raise ValueError(f"unknown fault_gate={fault_gate!r} (init(fault_gate=...) or IRIS_FAULT_GATE); choose one "
                         f"of {GATE_MODES}")


class FaultWatch:
    """The fault pages of this process's ranks, their watchdog and the records not yet raised
    (a runtime service)."""

    def __init__(self, rt, on_fault: str):
        self.on_fault = on_fault
        self._heap = rt.heap
        self._pages = {r: w for r in rt.heap.local_ranks if (w := rt.heap.fault_words(r)) is not None}
        for words in self._pages.values():
            words[0] = check_mode(on_fault)
        self._lock = threading.Lock()
        self._pending: list[Exception] = []
        self._reported: set = set()
        self._refused: set = set()  # local ranks whose status word reported a refused access
        self.reported_at: float | None = None  # time.monotonic() of the watchdog's last report
        self._stop = threading.Event()
        self._thread = None
        if self._pages:
            self._thread = threading.Thread(target=self._watch, name="iris-fault-watchdog", daemon=True)
            self._thread.start()

    def _collect(self, report: bool, peek: bool) -> None:
        """Moves new records, and with `peek` the refused accesses (the heap guard's status
        word, read through the driver), into the pending errors, printing them when `report`."""
        with self._lock:
            found = []  # (time_ns, key, error) of every local rank, to be ordered oldest first
            for rank, words in self._pages.items():
                found += [(record.time_ns, (rank, record), record.error(rank)) for record in faults.read_records(words)]
                word = self._heap.peek_status(rank) if peek and rank not in self._refused else 0
                if word:  # a refused access has no time of its own: it counts as now
                    self._refused.add(rank)
                    found.append((time.time_ns(), (rank, "guard"), error_from_word(word, rank, self._heap.mapped_size,
                                                                                      upper=self._heap.heap_size)))
            for _, key, error in sorted(found, key=lambda f: f[0]):
                if key in self._reported:
                    continue
                self._reported.add(key)
                self._pending.append(error)
                if report:
                    self.reported_at = time.monotonic()
                    print(f"iris watchdog: {type(error).__name__}: {error}", file=sys.stderr, flush=True)

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            self._collect(report=True, peek=False)  # host memory only: no CUDA call beside XLA's threads

    def take(self) -> list[Exception]:
        """The errors recorded since the last take (records read now included); clears the pages."""
        self._collect(report=self._thread is None, peek=True)
        with self._lock:
            pending, self._pending = self._pending, []
            if pending:
                for words in self._pages.values():
                    faults.clear_records(words)
                for rank in self._refused:
                    self._heap.clear_status(rank)
                self._refused.clear()
                self._reported.clear()
        return pending

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * WATCH_S + 1)


def raise_first(found: list[Exception], cause: BaseException | None = None) -> None:
    """Raises the oldest of `found` (the others follow in its message), chained to `cause`."""
    if found:
        first = found[0]
        if len(found) > 1:
            first = type(first)("\n".join(str(e) for e in found))
        raise first from cause


# a failed execution's message: "UNKNOWN: NotOnHeapError: <the error's words> [executable_name='jit_f']"
_CARRIED = re.compile(r"\b([A-Z]\w*Error): (.*?)(?:\s*\[executable_name=[^\]]*\])?\s*$", re.S)


def carried(error: BaseException) -> Exception | None:
    """The iris error whose words a failed execution carries (the fault gate's, or a simulated
    kernel's), as that error; None when it carries none. (A refusal that the gate reported is
    kept nowhere else: reading the failed execution's outputs is what raises it.)"""
    match = _CARRIED.search(str(error))
    cls = getattr(errors, match.group(1), None) if match else None
    if isinstance(cls, type) and issubclass(cls, errors.IrisError) and not isinstance(error, errors.IrisError):
        return cls(match.group(2))
    return None
