"""`iris_rma`: one Pallas primitive for every remote memory op on a symmetric ref.

    old = iris_rma_p.bind(ctx_ref, ref, *indexers, value, cmp, mask, other, rank, op="add", ...)

Operands (a pytree, `args_tree`): the kernel's context ref, the symmetric ref with its
Pallas indexers, then value / cmp / mask / other (None where the op has none) and the
peer rank. Ops: "load", "load_acquire", "store", the atomics "add", "sub", "xchg", "and",
"or", "xor", "min", "max" and "cas". It returns the loaded or old values (nothing for
"store").

Two meanings:
* GPUs (Pallas's Triton backend): a lowering rule registered into
  `jax._src.pallas.triton.lowering` computes the ref's pointers the way Pallas's own
  load does, translates them to the peer's heap (`bases[rank] + (ptr - bases[me])`,
  bases read from the context) and emits the Triton op, atomics with the given sem and
  scope, the acquire load as non-pure inline PTX (not hoisted out of polling loops).
* Simulator (Pallas interpret mode): a state-discharge rule turns the op into a host
  callback (iris_jax.pallas.simulator) that does it on the rank's heap in shared memory.
  The callback returns the context unchanged as the context's new value, so a kernel's
  remote ops run in program order (XLA:CPU may otherwise start independent callbacks in
  any order).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax import lax, tree_util
from jax._src import core as jax_core
from jax._src import state
from jax._src.state import discharge as state_discharge
from jax.interpreters import mlir

from iris_core.platform import SIMULATOR
from iris_jax.pallas import _compat, simulator

LOADS = ("load", "load_acquire")
RMW_OPS = ("add", "sub", "xchg", "and", "or", "xor", "min", "max")
ATOMICS = (*RMW_OPS, "cas")
OPS = (*LOADS, "store", *ATOMICS)
SEMS = ("relaxed", "acquire", "release", "acq_rel")
SCOPES = ("cta", "gpu", "sys")

_INT32 = (np.dtype(np.int32), np.dtype(np.uint32))
_ATOMIC_DTYPES = {
    "add": (*_INT32, np.dtype(np.float32)), "sub": (*_INT32, np.dtype(np.float32)),
    "xchg": (*_INT32, np.dtype(np.float32)), "cas": _INT32,
    "and": _INT32, "or": _INT32, "xor": _INT32, "min": _INT32, "max": _INT32,
}


@dataclasses.dataclass(frozen=True)
class Operands:
    """The primitive's operands, unflattened."""

    ctx: Any
    ref: Any
    transforms: tuple
    value: Any
    cmp: Any
    mask: Any
    other: Any
    rank: Any


tree_util.register_dataclass(
    Operands, data_fields=["ctx", "ref", "transforms", "value", "cmp", "mask", "other", "rank"], meta_fields=[])

iris_rma_p = jax_core.Primitive("iris_rma")
iris_rma_p.multiple_results = True


def bind(op: str, ctx_ref, ref, transforms, *, rank, value=None, cmp=None, mask=None, other=None,
         slot: int, sem: str = "acq_rel", scope: str = "sys", volatile: bool = False,
         cache_modifier: str | None = None, site: str = ""):
    """Binds iris_rma for one op; returns its result (None for stores). `site`: the kernel's
    source line that made it (the simulator's race reports name it)."""
    flat, tree = tree_util.tree_flatten(Operands(ctx_ref, ref, tuple(transforms), value, cmp, mask, other, rank))
    out = iris_rma_p.bind(*flat, args_tree=tree, op=op, slot=slot, sem=sem, scope=scope, volatile=volatile,
                          cache_modifier=cache_modifier, site=site)
    return out[0] if out else None


def result_shape(ref_aval, transforms) -> tuple[int, ...]:
    """Shape of `ref` read through its Pallas indexers."""
    return tuple(state.TransformedRef(ref_aval, tuple(transforms)).shape)


@iris_rma_p.def_effectful_abstract_eval
def _abstract_eval(*avals_flat, args_tree, op, **_):
    a = tree_util.tree_unflatten(args_tree, avals_flat)
    effects = {state.ReadEffect(0), state.WriteEffect(0), state.ReadEffect(1)}
    if op not in LOADS:
        effects.add(state.WriteEffect(1))
    if op == "store":
        return [], effects
    shape = result_shape(a.ref, a.transforms)
    return [jax_core.ShapedArray(shape, a.ref.dtype)], effects


# -- simulator: state discharge -------------------------------------------------------
def _discharge_rule(in_avals, out_avals, *args_flat, args_tree, op, slot, sem, scope, volatile,
                    cache_modifier, site):
    del cache_modifier  # one host: every access is coherent (scope and volatile: for the race detector)
    a = tree_util.tree_unflatten(args_tree, args_flat)
    ref_aval = tree_util.tree_unflatten(args_tree, in_avals).ref
    size = int(np.prod(ref_aval.shape, dtype=np.int64))
    positions = lax.iota(np.int32, size).reshape(ref_aval.shape)
    index = state_discharge.transform_array(positions, list(a.transforms))
    shape = index.shape
    full = functools.partial(_broadcast, shape=shape)
    value = None if a.value is None else full(jnp.asarray(a.value, ref_aval.dtype))
    cmp = None if a.cmp is None else full(jnp.asarray(a.cmp, ref_aval.dtype))
    mask = jnp.ones(shape, bool) if a.mask is None else full(jnp.asarray(a.mask, bool))
    other = jnp.zeros(shape, ref_aval.dtype) if a.other is None else full(jnp.asarray(a.other, ref_aval.dtype))
    dtype, rank = np.dtype(ref_aval.dtype), jnp.asarray(a.rank, np.int32)
    new_ctx, result = simulator.rma(op, dtype, slot, simulator.Ordering(sem, scope, volatile, site), a.ctx, index,
                                    rank, value, cmp, mask, other)
    new_invals = [None] * len(in_avals)
    new_invals[0] = new_ctx
    return new_invals, ([] if op == "store" else [result])


def _broadcast(x, shape):
    import jax.numpy as jnp

    return jnp.broadcast_to(x, shape)


state_discharge.register_discharge_rule(iris_rma_p)(_compat.discharge_rule(_discharge_rule))


def check(op: str, dtype, sem: str, scope: str) -> None:
    """Raises for an op, dtype, sem or scope this primitive does not support."""
    dtype = np.dtype(dtype)
    if op not in OPS:
        raise ValueError(f"unknown iris op {op!r}; one of {OPS}")
    if sem not in SEMS:
        raise ValueError(f"sem must be one of {SEMS}, got {sem!r}")
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    if op in ATOMICS and dtype not in _ATOMIC_DTYPES[op]:
        raise TypeError(f"atomic_{op} on a symmetric ref supports {[str(d) for d in _ATOMIC_DTYPES[op]]}, "
                        f"not {dtype}")
    if op == "load_acquire" and dtype not in _INT32:
        raise TypeError(f"load_acquire reads int32/uint32 flags, not {dtype}")


# -- a barrier among the threads of one program -----------------------------------------
iris_sync_threads_p = jax_core.Primitive("iris_sync_threads")
iris_sync_threads_p.multiple_results = True


@iris_sync_threads_p.def_effectful_abstract_eval
def _sync_abstract_eval():
    from jax._src.pallas.triton import primitives as triton_primitives

    return [], {triton_primitives.barrier_effect}  # kernel-local: keeps it in the kernel, in order


iris_sync_threads_p.def_impl(lambda: [])  # interpret mode: a program is one thread already
mlir.register_lowering(iris_sync_threads_p, lambda ctx: [], platform=SIMULATOR.jax_platform)
