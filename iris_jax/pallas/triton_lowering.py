"""GPU meaning of iris_rma: a rule registered into Pallas's Triton lowering.

The symmetric ref arrives as its root `!tt.ptr` plus block info; Pallas's own helpers
turn the indexers into a tensor of pointers. We then translate them to the peer's heap
(`bases[rank] + (ptr - bases[me])`, one translation for every op; bases from the
context words, each an int64) and emit an ordinary Triton load, store or atomic.
The helpers used here have the same signatures in jax 0.10.2, 0.11.2 and 0.12, but for the
pointer helper (iris_jax.pallas._compat.pointers_from_indices).
"""

from __future__ import annotations

import numpy as np
from jax import tree_util
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import arith
from jax._src.lib.triton import dialect as tt
from jax._src.pallas.triton import lowering as pl_triton
from jax._src.state import indexing

from iris_core.heap.context_layout import HEADER_WORDS
from iris_jax.pallas import _compat
from iris_jax.pallas.primitives import iris_rma_p, iris_sync_threads_p

_SEM = {"relaxed": "RELAXED", "acquire": "ACQUIRE", "release": "RELEASE", "acq_rel": "ACQUIRE_RELEASE"}
_SCOPE = {"cta": "CTA", "gpu": "GPU", "sys": "SYSTEM"}
_RMW = {"add": "ADD", "sub": "ADD", "xchg": "XCHG", "and": "AND", "or": "OR", "xor": "XOR", "min": "MIN",
        "max": "MAX"}


def _i64():
    return ir.IntegerType.get_signless(64)


def _context_word(ctx_ptr, index):
    """Loads 64-bit word `index` (an i32 value) of the context at `ctx_ptr` (!tt.ptr<i32>)."""
    words = tt.bitcast(tt.PointerType.get(_i64(), 1), ctx_ptr)
    return pl_triton._load(tt.addptr(words.type, words, index))


def translate(ctx_ptr, pointers, rank):
    """`pointers` (a pointer or a tensor of them into my heap) moved to `rank`'s heap."""
    i32 = ir.IntegerType.get_signless(32)
    me = arith.trunci(i32, _context_word(ctx_ptr, pl_triton._i32_constant(0)))
    base_me = _context_word(ctx_ptr, arith.addi(me, pl_triton._i32_constant(HEADER_WORDS)))
    base_to = _context_word(ctx_ptr, arith.addi(rank, pl_triton._i32_constant(HEADER_WORDS)))
    delta = arith.subi(base_to, base_me)
    if isinstance(pointers.type, ir.RankedTensorType):
        shape = ir.RankedTensorType(pointers.type).shape
        ints_type = ir.RankedTensorType.get(shape, _i64())
        delta = tt.splat(ints_type, delta)
    else:
        ints_type = _i64()
    ints = arith.addi(tt.ptr_to_int(ints_type, pointers), delta)
    return tt.int_to_ptr(pointers.type, ints)


def _pointers(ctx, ref_ptr, transforms, ref_aval):
    block_info = ctx.block_infos[1]
    if len(transforms) > 1 or any(not isinstance(t, indexing.NDIndexer) for t in transforms):
        raise NotImplementedError("iris ops on a Pallas ref take at most one indexer (ref.at[...] once)")
    indexer = transforms[0] if transforms else indexing.NDIndexer.make_trivial_indexer(ref_aval.shape)
    shape = tuple(indexer.get_indexer_shape_static())
    pointers, in_bounds = _compat.pointers_from_indices(ref_ptr, block_info, indexer)
    return pointers, in_bounds, shape


def _operand(value, aval, shape, dtype=None):
    value = pl_triton._ensure_ir_value(value, aval)
    if dtype is not None:
        value = pl_triton._ir_cast(value, pl_triton._dtype_to_ir_type(np.dtype(dtype)), signed=True)
    return pl_triton._bcast_to(value, shape)


def _lowering(ctx, *args_flat, args_tree, op, slot, sem, scope, volatile, cache_modifier, site):
    del slot, site  # the simulator's; GPUs translate the ref's own pointer
    a = tree_util.tree_unflatten(args_tree, args_flat)
    avals = tree_util.tree_unflatten(args_tree, ctx.avals_in)
    dtype = np.dtype(avals.ref.dtype)
    pointers, in_bounds, shape = _pointers(ctx, a.ref, a.transforms, avals.ref)
    rank = _operand(a.rank, avals.rank, ())
    pointers = translate(a.ctx, pointers, rank)
    mask = None if a.mask is None else _operand(a.mask, avals.mask, shape)
    if in_bounds is not None:
        mask = in_bounds if mask is None else arith.andi(mask, in_bounds)
    if op == "load":
        other = None if a.other is None else _operand(a.other, avals.other, shape, dtype)
        return [pl_triton._load(pointers, mask=mask, other=other, cache_modifier=cache_modifier,
                                is_volatile=volatile)]
    if op == "load_acquire":
        return [_load_acquire(pointers, scope)]
    value = _operand(a.value, avals.value, shape, dtype)
    if op == "store":
        pl_triton._store(pointers, value, mask=mask, cache_modifier=cache_modifier)
        return []
    semantic = getattr(tt.MemSemantic, _SEM[sem])
    sync_scope = getattr(tt.MemSyncScope, _SCOPE[scope])
    if op == "cas":
        cmp = _operand(a.cmp, avals.cmp, shape, dtype)
        return [tt.atomic_cas(value.type, pointers, cmp, value, sem=semantic, scope=sync_scope)]
    if op == "sub":
        zero = pl_triton._full(value.type, 0)
        value = arith.subf(zero, value) if dtype.kind == "f" else arith.subi(zero, value)
    name = _RMW[op]
    if op == "add" and dtype.kind == "f":
        name = "FADD"
    elif op in ("min", "max") and dtype.kind == "u":
        name = "U" + name
    return [pl_triton._atomic_rmw(getattr(tt.RMWOp, name), pointers, value, mask=mask, semantic=semantic,
                                  sync_scope=sync_scope)]


def _load_acquire(pointers, scope):
    """`ld.acquire.<scope>` through non-pure inline PTX: the compiler may neither drop nor
    hoist it, so it can poll a flag in a loop."""
    scope = {"cta": "cta", "gpu": "gpu", "sys": "sys"}[scope]
    i32 = ir.IntegerType.get_signless(32)
    if isinstance(pointers.type, ir.RankedTensorType):
        result = ir.RankedTensorType.get(ir.RankedTensorType(pointers.type).shape, i32)
    else:
        result = i32
    value = tt.elementwise_inline_asm([result], f"ld.acquire.{scope}.global.b32 $0, [$1];", "=r,l", False, 1,
                                      [pointers])
    value = value if isinstance(value, ir.Value) else value[0]
    return value  # int32 and uint32 share the signless i32 type


pl_triton.register_lowering(iris_rma_p)(_lowering)


@pl_triton.register_lowering(iris_sync_threads_p)
def _sync_threads(ctx):
    from jax._src.lib.mlir.dialects import gpu

    del ctx
    gpu.barrier()
    return []
