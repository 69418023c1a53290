"""The simulator's meaning of iris_rma: host callbacks on the heaps in shared memory.

A kernel under Pallas interpret mode runs as XLA:CPU ops on the device's own thread, one
thread per simulated rank, all in this process. Its symmetric refs are copies of the
blocks, so remote ops do not use them: the kernel's context row carries, after the
context words, the address of every symmetric operand as XLA passed it (read by
`operand_addresses`, a CPU FFI call, before the kernel starts). A callback turns
(address, element index) into a pointer on the target rank's heap,
`bases[rank] + (address - bases[me])` as on GPUs, and accesses it with the Triton
interpreter's helpers: atomics are real atomic instructions, so they hold between the
threads of this process and between processes (`python -m iris_core.sim`).

With the race detector on (iris_jax.init(detect_races=...)), every remote op goes through the
rank's detector first (iris_core.sim.races), as the Triton interpreter's accesses do: the
kernel starts a launch of its rank's detector in the call that writes its context row, and
each op names the kernel's source line it came from. A kernel's plain ref reads and writes
act on interpret mode's copies of its blocks, not on a heap, and are not checked.
"""

from __future__ import annotations

import ctypes
import threading
from typing import NamedTuple

import jax
import numpy as np

from iris_core.errors import NotOnHeapError
from iris_core.heap.context_layout import HEADER_WORDS, context_words
from iris_core.sim import races
from iris_jax import _runtime as runtime_lib
from iris_jax.calls._ffi import register_cpu_target
from iris_jax.calls.cpu_execution import race_detector

_SEM = {"relaxed": "RELAXED", "acquire": "ACQUIRE", "release": "RELEASE", "acq_rel": "ACQUIRE_RELEASE"}
_RMW = {"add": "ADD", "sub": "ADD", "xchg": "XCHG", "and": "AND", "or": "OR", "xor": "XOR", "min": "MIN",
        "max": "MAX"}


class Ordering(NamedTuple):
    """What an op promises about ordering (the race detector's concern: on one host every access
    is coherent), and the kernel's source line that made it."""
    sem: str
    scope: str
    volatile: bool
    site: str


def rma(op, dtype, slot, ordering: Ordering, ctx, index, rank, value, cmp, mask, other):
    """Runs one iris op from inside a discharged kernel; returns (new context, result)."""
    from jax.experimental import io_callback

    result = jax.ShapeDtypeStruct(index.shape, dtype)
    operands = [x for x in (value, cmp) if x is not None]

    def host(ctx_row, index, rank, mask, other, *operands):
        out = _host(op, dtype, slot, ordering, np.asarray(ctx_row), np.asarray(index), int(rank), np.asarray(mask),
                    np.asarray(other), *[np.asarray(o) for o in operands])
        return np.asarray(ctx_row), out

    ctx_shape = jax.ShapeDtypeStruct(ctx.shape, ctx.dtype)
    return io_callback(host, (ctx_shape, result), ctx, index, rank, mask, other, *operands, ordered=False)


def _host(op, dtype, slot, ordering, ctx_row, index, rank, mask, other, *operands):
    words = np.ascontiguousarray(ctx_row).view(np.uint64)
    me = int(words[0])
    detector = race_detector(runtime_lib.runtime(), me)
    if detector is None:
        return _run(op, dtype, slot, ordering.sem, words, index, rank, mask, other, *operands)
    kind, sem, scope = _race_kind(op, ordering)
    checked = []

    def check(pointers):  # before the op: its record and check
        checked.append(detector.access_at(pointers, dtype.itemsize, kind, sem, scope, where=ordering.site))

    out = _run(op, dtype, slot, ordering.sem, words, index, rank, mask, other, *operands, check=check)
    if checked and checked[0] and (kind == races.ATOMIC or kind == races.FLAG_LOAD):
        detector.acquire(checked[0], sem, scope, where=ordering.site)
    detector.publish()  # the launch ends with no call of ours: the rank's next launch goes on from here
    found = detector.take_reports()
    if found:
        races.emit(runtime_lib.runtime().detect_races, found)
    return out


def _race_kind(op, ordering: Ordering) -> tuple[int, str, str]:
    """(kind, sem, scope) of an op as the race detector takes it (see builder_patches there)."""
    if op == "load_acquire":
        return races.FLAG_LOAD, "acquire", ordering.scope
    if op == "load":
        return (races.FLAG_LOAD, "", "sys") if ordering.volatile else (races.LOAD, "", "")
    if op == "store":
        return races.STORE, "", ""
    return races.ATOMIC, ordering.sem, ordering.scope


def _run(op, dtype, slot, sem, words, index, rank, mask, other, *operands, check=None):
    from triton._C.libtriton import interpreter

    shape = index.shape
    me, world = int(words[0]), int(words[1])
    if not 0 <= rank < world:
        raise IndexError(f"iris {op}: rank {rank} out of range for world size {world}")
    bases = words[HEADER_WORDS:HEADER_WORDS + world]
    address = int(words[context_words(world) + slot])
    offsets = index.reshape(-1).astype(np.uint64) * np.uint64(dtype.itemsize)
    pointers = (np.uint64(address) - bases[me] + bases[rank] + offsets).astype(np.uint64)
    mask = np.ascontiguousarray(mask, dtype=bool).reshape(-1)
    other = np.ascontiguousarray(other, dtype).reshape(-1)
    operands = [np.ascontiguousarray(o, dtype).reshape(-1) for o in operands]
    _check_bounds(op, pointers[mask], int(bases[rank]), rank, dtype.itemsize)
    if check is not None:
        check(pointers[mask])
    semantic = getattr(interpreter.MEM_SEMANTIC, _SEM[sem])
    if op in ("load", "load_acquire"):
        return np.asarray(interpreter.load(pointers, mask, other, dtype), dtype).reshape(shape)
    if op == "store":
        interpreter.store(pointers, operands[0], mask)
        return np.zeros(shape, dtype)
    if op == "cas":
        value, cmp = operands  # rma passes (value, cmp)
        old = np.zeros(pointers.shape, dtype)
        if mask.any():
            old[mask] = interpreter.atomic_cas(pointers[mask], cmp[mask], value[mask], semantic)
        return old.reshape(shape)
    value = -operands[0] if op == "sub" else operands[0]
    name = _RMW[op]
    if op == "add" and dtype.kind == "f":
        name = "FADD"
    elif op in ("min", "max") and dtype.kind == "u":
        name = "U" + name
    old = interpreter.atomic_rmw(getattr(interpreter.RMW_OP, name), pointers, value, mask, semantic)
    return np.asarray(old, dtype).reshape(shape)


def _check_bounds(op, pointers, base, rank, itemsize):
    """A wild pointer would crash the process (on GPUs it faults the kernel): raise instead
    (the heap's mapped bytes, as the Triton device API's guard bounds them)."""
    size = runtime_lib.runtime().heap.mapped_size
    if pointers.size and (int(pointers.min()) < base or int(pointers.max()) + itemsize > base + size):
        raise IndexError(f"iris {op}: an index reaches outside rank {rank}'s heap (offsets "
                         f"{int(pointers.min()) - base}..{int(pointers.max()) - base}, heap of {size} bytes)")


# -- operand addresses (a CPU FFI call before the kernel) -------------------------------
_targets: dict = {}
_targets_lock = threading.Lock()


def address_target(count: int, chained: bool, row_words: int, kernel: str) -> str:
    """The FFI target that returns the context row (`row_words` int32) followed by the
    addresses of `count` symmetric operands, checked to lie on the calling rank's heap, and
    starts a launch of `kernel` for the race detector (when it is on).
    Operands: the context row, the arrays, then (`chained`) one ignored operand that
    orders the call after the previous iris kernel."""
    with _targets_lock:
        key = (count, chained, row_words, kernel)
        if key not in _targets:
            _targets[key] = register_cpu_target(
                "iris_pallas_context", lambda ins, outs: _write_row(count, row_words, kernel, ins, outs))
        return _targets[key]


def _write_row(count, row_words, kernel, ins, outs):
    rt = runtime_lib.runtime()
    rank = ctypes.c_int64.from_address(ins[0]).value
    detector = race_detector(rt, rank)
    if detector is not None:  # in stream order: this rank's earlier launches are over
        detector.end()
        detector.begin(kernel)
    ctypes.memmove(outs[0], ins[0], row_words * 4)
    result = (ctypes.c_uint64 * count).from_address(outs[0] + row_words * 4)
    for i, pointer in enumerate(ins[1:1 + count]):
        where = rt.heap.locate(pointer)
        if where is None or where[0] != rank:
            raise NotOnHeapError(
                f"symmetric operand {i} of an iris Pallas kernel is not on rank {rank}'s heap (inside jit it "
                "was copied or computed); pass an array made by iris_jax (zeros, to_heap, ...) straight into "
                "the jitted function. Nothing was run.")
        result[i] = pointer
