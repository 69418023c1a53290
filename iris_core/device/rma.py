"""Remote memory access on the symmetric heap: one translation, every op a thin wrapper.

A pointer into my heap names the same offset on every rank's heap;
`translate(ptr, from_rank, to_rank, heap_bases)` turns it into `to_rank`'s address as
seen from this GPU. Each op below is that translation followed by an ordinary Triton
load, store or atomic. `heap_bases` is a pointer to the W 64-bit heap bases.

Defaults make the obvious cross-GPU use correct: atomics are `acq_rel` at system
scope (a GPU-scoped flag is not guaranteed visible to the peer GPU).
"""

import triton
import triton.language as tl

# Defaults are constexpr objects: a jit-to-jit call passes a plain-string default as a value.
NO_MODIFIER = tl.constexpr("")
ACQ_REL = tl.constexpr("acq_rel")
SYSTEM = tl.constexpr("sys")


@triton.jit
def translate(ptr, from_rank, to_rank, heap_bases, hint: tl.constexpr = None):
    """`ptr` (valid in `from_rank`'s heap) as an address in `to_rank`'s heap.

    `hint` (int or tuple) declares the result contiguous and aligned in blocks of that
    many elements, so loads and stores through it vectorize.
    """
    from_base = tl.load(heap_bases + from_rank)
    to_base = tl.load(heap_bases + to_rank)
    offset = tl.cast(ptr, tl.uint64) - from_base
    to_base_bytes = tl.cast(to_base, tl.pointer_type(tl.int8))
    translated = tl.cast(to_base_bytes + offset, ptr.dtype)
    if hint is not None:
        translated = tl.max_contiguous(tl.multiple_of(translated, hint), hint)
    return translated


@triton.jit
def load(ptr, from_rank, my_rank, heap_bases, mask=None, other=None, cache_modifier: tl.constexpr = NO_MODIFIER,
         volatile: tl.constexpr = False, hint: tl.constexpr = None):
    """Reads `from_rank`'s heap at the offset of my `ptr`."""
    remote = translate(ptr, my_rank, from_rank, heap_bases, hint)
    return tl.load(remote, mask=mask, other=other, cache_modifier=cache_modifier, volatile=volatile)


@triton.jit
def store(ptr, value, to_rank, my_rank, heap_bases, mask=None, cache_modifier: tl.constexpr = NO_MODIFIER,
          hint: tl.constexpr = None):
    """Writes `value` into `to_rank`'s heap at the offset of my `ptr`."""
    remote = translate(ptr, my_rank, to_rank, heap_bases, hint)
    tl.store(remote, value, mask=mask, cache_modifier=cache_modifier)


@triton.jit
def get(from_ptr, to_ptr, from_rank, my_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
        hint: tl.constexpr = None):
    """Copies `from_rank`'s data at `from_ptr` into my memory at `to_ptr`."""
    value = load(from_ptr, from_rank, my_rank, heap_bases, mask, other, load_cache_modifier, False, hint)
    tl.store(to_ptr, value, mask=mask, cache_modifier=store_cache_modifier)


@triton.jit
def put(from_ptr, to_ptr, to_rank, my_rank, heap_bases, mask=None, other=None,
        load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
        hint: tl.constexpr = None):
    """Copies my data at `from_ptr` into `to_rank`'s heap at the offset of `to_ptr`."""
    value = tl.load(from_ptr, mask=mask, other=other, cache_modifier=load_cache_modifier)
    store(to_ptr, value, to_rank, my_rank, heap_bases, mask, store_cache_modifier, hint)


@triton.jit
def copy(src_ptr, dst_ptr, from_rank, to_rank, my_rank, heap_bases, mask=None, other=None,
         load_cache_modifier: tl.constexpr = NO_MODIFIER, store_cache_modifier: tl.constexpr = NO_MODIFIER,
         hint: tl.constexpr = None):
    """Copies `from_rank`'s data at `src_ptr` to `to_rank`'s heap at `dst_ptr`.

    Both pointers are offsets in my heap; the caller should be one of the two ranks.
    """
    value = load(src_ptr, from_rank, my_rank, heap_bases, mask, other, load_cache_modifier, False, hint)
    store(dst_ptr, value, to_rank, my_rank, heap_bases, mask, store_cache_modifier, hint)


@triton.jit
def atomic_add(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomically adds `val` at `to_rank`'s copy of `ptr`; returns the old value."""
    return tl.atomic_add(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_sub(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomically subtracts `val`; returns the old value."""
    return tl.atomic_add(translate(ptr, my_rank, to_rank, heap_bases, hint), -val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xchg(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
                scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomically exchanges; returns the old value."""
    return tl.atomic_xchg(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_xor(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomic bitwise xor; returns the old value."""
    return tl.atomic_xor(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_and(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomic bitwise and; returns the old value."""
    return tl.atomic_and(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_or(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
              scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomic bitwise or; returns the old value."""
    return tl.atomic_or(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_min(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomic minimum; returns the old value."""
    return tl.atomic_min(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_max(ptr, val, to_rank, my_rank, heap_bases, mask=None, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomic maximum; returns the old value."""
    return tl.atomic_max(translate(ptr, my_rank, to_rank, heap_bases, hint), val, mask=mask, sem=sem, scope=scope)


@triton.jit
def atomic_cas(ptr, cmp, val, to_rank, my_rank, heap_bases, sem: tl.constexpr = ACQ_REL,
               scope: tl.constexpr = SYSTEM, hint: tl.constexpr = None):
    """Atomic compare-and-swap; returns the old value."""
    return tl.atomic_cas(translate(ptr, my_rank, to_rank, heap_bases, hint), cmp, val, sem=sem, scope=scope)
