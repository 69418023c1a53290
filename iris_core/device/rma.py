"""Remote memory access on the symmetric heap: one translation, every op a thin wrapper.

A pointer into my heap names the same offset on every rank's heap;
`translate(ptr, from_rank, to_rank, heap_bases)` turns it into `to_rank`'s address as
seen from this GPU. Each op below is that translation followed by an ordinary Triton
load, store or atomic. `heap_bases` is a pointer to the W 64-bit heap bases of the
context (iris_core.heap.context_layout), preceded by the world size and the heap size.

The heap guard (on by default; IRIS_HEAP_GUARD=0 compiles it out): every lane whose
pointer lies outside the caller's heap (its mapped bytes: the bound word of the caller's
status line, current as the heap grows; every op takes it as `bound=`, which a Context reads once
at initialize, else each op reads it), and every lane of an op whose rank is outside
[0, world_size), is masked off, so nothing outside a heap is touched, and the failure is
reported in the caller's status word (iris_core.heap.status; the host raises
NotOnHeapError after the call). Ops without a mask (atomic_cas) and the pointers
`translate` returns go to the target's sink line instead. Under the simulator the op
raises NotOnHeapError at once, naming the kernel, op, rank and offset (iris_core.sim.checks,
which in checked mode also holds each access to the live allocation it falls in).

Defaults make the obvious cross-GPU use correct: atomics are `acq_rel` at system
scope (a GPU-scoped flag is not guaranteed visible to the peer GPU).
"""

import os

import triton
import triton.language as tl

from iris_core.compat import interpreting
from iris_core.heap import status

# Defaults are constexpr objects: a jit-to-jit call passes a plain-string default as a value.
NO_MODIFIER = tl.constexpr("")
ACQ_REL = tl.constexpr("acq_rel")
SYSTEM = tl.constexpr("sys")

GUARD = tl.constexpr(os.environ.get("IRIS_HEAP_GUARD", "1") != "0")
STATUS_OFFSET = tl.constexpr(status.STATUS_OFFSET)
SINK_OFFSET = tl.constexpr(status.SINK_OFFSET)
BOUND_OFFSET = tl.constexpr(status.BOUND_OFFSET)
RANK_MASK = tl.constexpr(status.RANK_MASK)
RANK_SHIFT = tl.constexpr(status.RANK_SHIFT)
OFFSET_MASK = tl.constexpr(status.OFFSET_MASK)
# op codes of the status word (status.OPS)
OP_TRANSLATE = tl.constexpr(status.OP_CODES["translate"])
OP_LOAD = tl.constexpr(status.OP_CODES["load"])
OP_STORE = tl.constexpr(status.OP_CODES["store"])
OP_GET = tl.constexpr(status.OP_CODES["get"])
OP_PUT = tl.constexpr(status.OP_CODES["put"])
OP_COPY = tl.constexpr(status.OP_CODES["copy"])
OP_ATOMIC_ADD = tl.constexpr(status.OP_CODES["atomic_add"])
OP_ATOMIC_SUB = tl.constexpr(status.OP_CODES["atomic_sub"])
OP_ATOMIC_XCHG = tl.constexpr(status.OP_CODES["atomic_xchg"])
OP_ATOMIC_XOR = tl.constexpr(status.OP_CODES["atomic_xor"])
OP_ATOMIC_AND = tl.constexpr(status.OP_CODES["atomic_and"])
OP_ATOMIC_OR = tl.constexpr(status.OP_CODES["atomic_or"])
OP_ATOMIC_MIN = tl.constexpr(status.OP_CODES["atomic_min"])
OP_ATOMIC_MAX = tl.constexpr(status.OP_CODES["atomic_max"])
OP_ATOMIC_CAS = tl.constexpr(status.OP_CODES["atomic_cas"])


@triton.constexpr_function
def _status_head(op, rank_error):
    """The status word's bits other than the rank and the offset (iris_core.heap.status)."""
    return status.ERROR_BIT | op << status.OP_SHIFT | (status.RANK_ERROR_BIT if rank_error else 0)


@triton.constexpr_function
def _hint_dims(hint):
    """0 for an int hint, else the number of dimensions it names."""
    hint = hint.value if isinstance(hint, tl.constexpr) else hint
    return 0 if isinstance(hint, int) else len(hint)


@triton.constexpr_function
def _plain_value(value):
    """A constexpr's value (Triton's own tuples stay iterable)."""
    while isinstance(value, tl.constexpr):
        value = value.value
    return value


@triton.constexpr_function
def _hint_at(hint, dim):
    """The hint's int along `dim` (an int hint: itself). A tuple hint passed through a
    constexpr parameter arrives as constexpr((16,)), which tl.multiple_of refuses."""
    hint = _plain_value(hint)
    return hint if isinstance(hint, int) else _plain_value(hint[_plain_value(dim)])


@triton.constexpr_function
def _run_length(hint, dim, element_bytes):
    """Lanes (along `dim`) that lie in one 256-byte-aligned block where `hint` declares
    aligned runs: the guard's verdict is the same for all of them (heap bases and sizes
    are multiples of 256), so the mask keeps the runs whole and accesses stay vectorized."""
    return max(1, min(_hint_at(hint, dim), status.RESERVED_BYTES // _plain_value(element_bytes)))


@triton.jit
def _address(to_base, offset, ptr, hint: tl.constexpr):
    """`to_base + offset` as a pointer like `ptr`, declared contiguous and aligned in runs of
    `hint` (None, an int, or one int per dimension: Triton's tuple or a constexpr-wrapped
    Python one). The hints go on the op made here: Triton drops them on a function's argument."""
    translated = tl.cast(tl.cast(to_base, tl.pointer_type(tl.int8)) + offset, ptr.dtype)
    if hint is None:
        return translated
    elif _hint_dims(hint) == 0:
        return tl.max_contiguous(tl.multiple_of(translated, _hint_at(hint, 0)), _hint_at(hint, 0))
    elif _hint_dims(hint) == 1:
        return tl.max_contiguous(tl.multiple_of(translated, (_hint_at(hint, 0),)), (_hint_at(hint, 0),))
    else:
        translated = tl.multiple_of(translated, (_hint_at(hint, 0), _hint_at(hint, 1)))
        return tl.max_contiguous(translated, (_hint_at(hint, 0), _hint_at(hint, 1)))


@triton.jit
def _record(bad, offset, rank, rank_ok, from_base, OP: tl.constexpr):
    """Writes the status word of each `bad` lane into the caller's status line: op, rank,
    offset (plain stores to one word: one of them stays)."""
    rank_bits = (rank.to(tl.int64) & RANK_MASK) << RANK_SHIFT
    head = tl.where(rank_ok, _status_head(OP, False), _status_head(OP, True)) | rank_bits
    word = head | (offset.to(tl.int64, bitcast=True) & OFFSET_MASK)
    status_word = tl.cast(from_base + STATUS_OFFSET, tl.pointer_type(tl.int64))
    tl.store(status_word + (offset * 0), word, mask=bad)


if interpreting():

    def _report(bad, offset, rank, rank_ok, from_base, from_rank, heap_size, access, OP, ELEMENT):
        """Simulator: raises NotOnHeapError before the access (and, in checked mode, holds
        every access to its live allocation)."""
        from iris_core.sim import checks, replay  # lazy: the simulator's modules load only when a kernel runs under it

        replay.host_step(checks.check_access, bad, offset, rank, rank_ok, from_base, from_rank, heap_size, access, OP,
                         ELEMENT)

else:

    @triton.jit
    def _report(bad, offset, rank, rank_ok, from_base, from_rank, heap_size, access, OP: tl.constexpr,
                ELEMENT: tl.constexpr):
        _record(bad, offset, rank, rank_ok, from_base, OP)


@triton.jit
def _plain(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr):
    """The translation alone (IRIS_HEAP_GUARD=0)."""
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    offset = tl.cast(ptr, tl.uint64) - from_base
    return _address(to_base, offset, ptr, hint)


@triton.jit
def bound_of(base):
    """The guard's bound: the bytes mapped on every rank, from the status line of the heap at `base`
    (iris_core.heap.status)."""
    return tl.load(tl.cast(base + BOUND_OFFSET, tl.pointer_type(tl.int64)))


@triton.jit
def _guarded(ptr, from_rank, to_rank, heap_bases, mask, hint: tl.constexpr, OP: tl.constexpr,
             CHECK_FROM: tl.constexpr = False, bound=None):
    """(to_rank's address of `ptr`, the lanes that may be accessed, to_rank's sink line).

    A lane may be accessed when it is in `mask`, `to_rank` is a rank and `ptr` lies in
    from_rank's heap (so the result lies in to_rank's); the other lanes of `mask` are
    reported. The ops pass the caller's own rank (read from the context) as from_rank:
    it is checked only with CHECK_FROM."""
    world = tl.load(heap_bases - 2).to(tl.uint32)
    rank = tl.cast(to_rank, tl.int32)
    rank_ok = rank.to(tl.uint32) < world
    source = tl.cast(from_rank, tl.int32)
    if CHECK_FROM:
        source_ok = source.to(tl.uint32) < world
        rank = tl.where(source_ok, rank, source)  # the rank reported: the bad one
        rank_ok = rank_ok & source_ok
        source = tl.where(source_ok, source, 0)
    from_base = tl.load(heap_bases + source)
    to_base = tl.load(heap_bases + tl.where(rank_ok, tl.cast(to_rank, tl.int32), 0))
    # what is mapped on every rank, not the context's upper bound: read from memory, current after a growth
    # (a Context reads it once, at initialize, and passes it: one load per kernel, not per op)
    if bound is None:
        heap_size = bound_of(from_base)
    else:
        heap_size = bound
    offset = tl.cast(ptr, tl.uint64) - from_base  # wraps below the base: one unsigned compare
    ELEMENT: tl.constexpr = ptr.dtype.element_ty.primitive_bitwidth // 8
    ok = (offset <= heap_size - ELEMENT) & rank_ok
    if hint is not None:
        if _hint_dims(hint) == 0:
            ok = tl.max_constancy(ok, _run_length(hint, 0, ELEMENT))
        elif _hint_dims(hint) == 1:
            ok = tl.max_constancy(ok, (_run_length(hint, 0, ELEMENT),))
        else:
            ok = tl.max_constancy(ok, (_run_length(hint, 0, ELEMENT), _run_length(hint, 1, ELEMENT)))
    if mask is None:
        access = ok
        bad = ok == 0
    else:
        access = mask & ok
        bad = access != mask
    _report(bad, offset, rank, rank_ok, from_base, source, heap_size, access, OP, ELEMENT)
    translated = _address(to_base, offset, ptr, hint)
    sink = tl.cast(tl.cast(to_base, tl.pointer_type(tl.int8)) + SINK_OFFSET, ptr.dtype)
    return translated, access, sink


@triton.jit
def _redirected(ptr, from_rank, to_rank, heap_bases, mask, hint: tl.constexpr, OP: tl.constexpr,
                CHECK_FROM: tl.constexpr = False, bound=None):
    """The translated pointer, with the lanes the guard refuses sent to to_rank's sink line
    (for accesses that cannot be masked)."""
    if GUARD:
        translated, access, sink = _guarded(ptr, from_rank, to_rank, heap_bases, mask, hint, OP, CHECK_FROM, bound)
        return tl.where(access, translated, sink)
    else:
        return _plain(ptr, from_rank, to_rank, heap_bases, hint)


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr = None, mask=None, bound=None):
    """`ptr` (valid in `from_rank`'s heap) as an address in `to_rank`'s heap.

    Args:
      ptr: pointer (or block of pointers) into `from_rank`'s heap.
      from_rank: the rank whose heap `ptr` points into (usually my own rank).
      to_rank: the rank whose heap the result points into.
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      hint: an int, or one int per dimension: the result is contiguous and aligned in runs of
        that many elements, so accesses through it stay vectorized (None: no claim).
      mask: lanes to check with the heap guard (None: all).

    Returns:
      The translated pointer(s). With the heap guard on, lanes outside `from_rank`'s heap (or
      all lanes, for a rank out of range) are reported and point to `to_rank`'s sink line.
    """
    return _redirected(ptr, from_rank, to_rank, heap_bases, mask, hint, OP_TRANSLATE, True, bound)


@triton.jit
def _load(ptr, from_rank, my_rank, heap_bases, mask, other, cache_modifier: tl.constexpr, volatile: tl.constexpr,
          hint: tl.constexpr, OP: tl.constexpr, bound=None):
    if GUARD:
        remote, access, _ = _guarded(ptr, my_rank, from_rank, heap_bases, mask, hint, OP, bound=bound)
        return tl.load(remote, mask=access, other=other, cache_modifier=cache_modifier, volatile=volatile)
    else:
        remote = _plain(ptr, my_rank, from_rank, heap_bases, hint)
        return tl.load(remote, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)


@triton.jit
def _store(ptr, value, to_rank, my_rank, heap_bases, mask, cache_modifier: tl.constexpr, hint: tl.constexpr,
           OP: tl.constexpr, bound=None):
    if GUARD:
        remote, access, _ = _guarded(ptr, my_rank, to_rank, heap_bases, mask, hint, OP, bound=bound)
        tl.store(remote, value, mask=access, cache_modifier=cache_modifier)
    else:
        tl.store(_plain(ptr, my_rank, to_rank, heap_bases, hint), value, mask=mask, cache_modifier=cache_modifier)


@triton.jit
def _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem: tl.constexpr, scope: tl.constexpr,
            hint: tl.constexpr, OP: tl.constexpr, bound=None):
    """One remote atomic read-modify-write (OP says which); returns the old value."""
    if GUARD:
        remote, access, _ = _guarded(ptr, my_rank, to_rank, heap_bases, mask, hint, OP, bound=bound)
    else:
        remote = _plain(ptr, my_rank, to_rank, heap_bases, hint)
        access = mask
    if OP == OP_ATOMIC_ADD:
        return tl.atomic_add(remote, val, mask=access, sem=sem, scope=scope)
    elif OP == OP_ATOMIC_SUB:
        return tl.atomic_add(remote, -val, mask=access, sem=sem, scope=scope)
    elif OP == OP_ATOMIC_XCHG:
        return tl.atomic_xchg(remote, val, mask=access, sem=sem, scope=scope)
    elif OP == OP_ATOMIC_XOR:
        return tl.atomic_xor(remote, val, mask=access, sem=sem, scope=scope)
    elif OP == OP_ATOMIC_AND:
        return tl.atomic_and(remote, val, mask=access, sem=sem, scope=scope)
    elif OP == OP_ATOMIC_OR:
        return tl.atomic_or(remote, val, mask=access, sem=sem, scope=scope)
    elif OP == OP_ATOMIC_MIN:
        return tl.atomic_min(remote, val, mask=access, sem=sem, scope=scope)
    else:
        return tl.atomic_max(remote, val, mask=access, sem=sem, scope=scope)


@triton.jit
def load(ptr, from_rank, my_rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = NO_MODIFIER,
         volatile: tl.constexpr = False, hint: tl.constexpr = None, bound=None):
    """Reads `from_rank`'s heap at the offset of my `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      from_rank: the rank to read from (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      other: the value of masked-off lanes.
      cache_modifier: Triton's load cache modifier ("": the default; ".cg" reads L2 only).
      volatile: read memory every time (a value another rank changes).
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The values, shaped like `ptr`.
    """
    return _load(ptr, from_rank, my_rank, heap_bases, mask, other, cache_modifier, volatile, hint, OP_LOAD, bound=bound)


@triton.jit
def store(ptr, value, to_rank, my_rank, heap_bases, mask=None, cache_modifier: tl.constexpr = NO_MODIFIER,
          hint: tl.constexpr = None, bound=None):
    """Writes `value` into `to_rank`'s heap at the offset of my `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      value: what to store, shaped like `ptr` (or a scalar).
      to_rank: the rank to write to (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      cache_modifier: Triton's store cache modifier ("": the default).
      hint: alignment of runs of `ptr` (see `translate`).
    """
    _store(ptr, value, to_rank, my_rank, heap_bases, mask, cache_modifier, hint, OP_STORE, bound=bound)


@triton.jit
def get(from_ptr, to_ptr, from_rank, my_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
        hint: tl.constexpr = None, bound=None):
    """Copies `from_rank`'s data at `from_ptr` into my memory at `to_ptr`.

    Args:
      from_ptr: pointer(s) into a heap array, read on `from_rank`'s heap.
      to_ptr: pointer(s) into my own memory (heap or not), written locally.
      from_rank: the rank to read from.
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all).
      other: the value masked-off lanes read (they are not stored).
      load_cache_modifier: Triton's cache modifier of the remote load.
      store_cache_modifier: Triton's cache modifier of the local store.
      hint: alignment of runs of `from_ptr` (see `translate`).
    """
    value = _load(from_ptr, from_rank, my_rank, heap_bases, mask, other, load_cache_modifier, False, hint, OP_GET,
                  bound=bound)
    tl.store(to_ptr, value, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, to_rank, my_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
        hint: tl.constexpr = None, bound=None):
    """Copies my data at `from_ptr` into `to_rank`'s heap at the offset of `to_ptr`.

    Args:
      from_ptr: pointer(s) into my own memory (heap or not), read locally.
      to_ptr: pointer(s) into a heap array, written on `to_rank`'s heap.
      to_rank: the rank to write to.
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all).
      other: the value masked-off lanes read (they are not stored).
      load_cache_modifier: Triton's cache modifier of the local load.
      store_cache_modifier: Triton's cache modifier of the remote store.
      hint: alignment of runs of `to_ptr` (see `translate`).
    """
    value = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
    _store(to_ptr, value, to_rank, my_rank, heap_bases, mask, store_cache_modifier, hint, OP_PUT, bound=bound)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, my_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
         hint: tl.constexpr = None, bound=None):
    """Copies `from_rank`'s data at `src_ptr` into `to_rank`'s heap at `dst_ptr`.

    Both pointers are offsets in my heap; the caller should be one of the two ranks.

    Args:
      src_ptr: pointer(s) into a heap array, read on `from_rank`'s heap.
      dst_ptr: pointer(s) into a heap array, written on `to_rank`'s heap.
      from_rank: the rank to read from.
      to_rank: the rank to write to.
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all).
      other: the value masked-off lanes read (they are not stored).
      load_cache_modifier: Triton's cache modifier of the load.
      store_cache_modifier: Triton's cache modifier of the store.
      hint: alignment of runs of the pointers (see `translate`).
    """
    value = _load(src_ptr, from_rank, my_rank, heap_bases, mask, other, load_cache_modifier, False, hint, OP_COPY,
                  bound=bound)
    _store(dst_ptr, value, to_rank, my_rank, heap_bases, mask, store_cache_modifier, hint, OP_COPY, bound=bound)


@triton.jit
def atomic_add(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically adds `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_ADD, bound=bound)


@triton.jit
def atomic_sub(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically subtracts `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_SUB, bound=bound)


@triton.jit
def atomic_xchg(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
                scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically exchanges with `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_XCHG, bound=bound)


@triton.jit
def atomic_xor(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically xors with `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_XOR, bound=bound)


@triton.jit
def atomic_and(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically ands with `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_AND, bound=bound)


@triton.jit
def atomic_or(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
              scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically ors with `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_OR, bound=bound)


@triton.jit
def atomic_min(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically takes the minimum with `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_MIN, bound=bound)


@triton.jit
def atomic_max(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically takes the maximum with `val` at `to_rank`'s copy of `ptr`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      val: the operand, of `ptr`'s element type (a scalar or a block like `ptr`).
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      mask: lanes that take part (None: all); masked-off lanes are neither accessed nor errors.
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value at `to_rank`'s copy before the operation (undefined in masked-off lanes).
    """
    return _atomic(ptr, val, to_rank, my_rank, heap_bases, mask, sem, scope, hint, OP_ATOMIC_MAX, bound=bound)


@triton.jit
def atomic_cas(ptr, cmp, val, to_rank, my_rank, heap_bases, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None, bound=None):
    """Atomically compares `to_rank`'s copy of `ptr` with `cmp` and, where equal, stores `val`.

    Args:
      ptr: pointer (or block of pointers) into a heap array of my heap.
      cmp: the expected value.
      val: the value stored where the current value equals `cmp`.
      to_rank: the rank whose heap is updated (may be my own).
      my_rank: the calling rank (`ctx.rank`).
      heap_bases: pointer to the W 64-bit heap bases (`ctx.heap_bases`).
      sem: memory ordering: "relaxed", "acquire", "release" or "acq_rel" (the default).
      scope: "sys" (the default: visible to other GPUs and the host), "gpu" or "cta".
      hint: alignment of runs of `ptr` (see `translate`).

    Returns:
      The value before the operation. It takes no mask: with the heap guard on, a refused
      lane goes to the target's sink line.
    """
    remote = _redirected(ptr, my_rank, to_rank, heap_bases, None, hint, OP_ATOMIC_CAS, bound=bound)
    return tl.atomic_cas(remote, cmp, val, sem=sem, scope=scope)
