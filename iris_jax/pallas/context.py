"""`PallasContext`: what an iris Pallas kernel receives before its refs.

    def kernel(ctx, inbox_ref, x_ref, o_ref):
        peer = (ctx.rank + 1) % ctx.world_size
        ctx.store(inbox_ref.at[pl.ds(0, 8)], x_ref[...], to_rank=peer)
        ctx.atomic_add(flags_ref.at[0], 1, to_rank=peer, sem="release")

Remote ops take a ref of a symmetric operand (declared with `symmetric=` in
iris_jax.pallas.pallas_call), optionally indexed Pallas-style (`ref.at[...]` or `idx=`),
and reach the same elements of that array on another rank's heap. Defaults are correct
across GPUs: atomics `sem="acq_rel"`, `scope="sys"`.
"""

from __future__ import annotations

import sys
from typing import Any

import jax.numpy as jnp
from jax import lax
from jax._src import source_info_util
from jax._src.state import primitives as state_primitives

from iris_core.errors import IrisError
from iris_core.sim import races
from iris_jax.pallas import primitives


class PallasContext:
    """The iris context inside a Pallas kernel: rank, world size and remote ops.

    Attributes:
      rank: this device's rank (an int32 scalar read at run time: one compiled kernel
        serves every device).
      world_size: ranks in total (a Python int).
    """

    def __init__(self, ctx_ref, world_size: int, symmetric_refs: tuple):
        self._ref = ctx_ref
        self.world_size = world_size
        self._symmetric = symmetric_refs

    @property
    def rank(self):
        return self._ref[0]

    # -- plumbing --------------------------------------------------------------
    def _target(self, ref, idx, what: str):
        base, transforms = state_primitives.get_ref_and_transforms(ref, idx, what)
        for slot, candidate in enumerate(self._symmetric):
            if candidate is base:
                return base, transforms, slot
        raise IrisError(
            f"ctx.{what} needs a ref of a symmetric operand (one of the indices passed as symmetric= to "
            "iris_jax.pallas.pallas_call); this ref is an ordinary block. Declare the operand symmetric "
            "and pass a heap array (iris_jax.zeros, to_heap, ...).")

    def _rma(self, op, ref, idx, rank, *, sem="acq_rel", scope="sys", **operands):
        base, transforms, slot = self._target(ref, idx, op if op in primitives.LOADS + ("store",) else f"atomic_{op}")
        primitives.check(op, base.dtype, sem, scope)
        return primitives.bind(op, self._ref, base, transforms, rank=_rank(rank), slot=slot, sem=sem,
                               scope=scope, site=_kernel_line(), **operands)

    # -- loads and stores ------------------------------------------------------
    def load(self, ref, from_rank, *, idx=None, mask=None, other=None, volatile: bool = False,
             cache_modifier: str | None = None):
        """Reads `ref[idx]` from `from_rank`'s heap."""
        return self._rma("load", ref, idx, from_rank, mask=mask, other=other, volatile=volatile,
                         cache_modifier=cache_modifier)

    def store(self, ref, value, to_rank, *, idx=None, mask=None, cache_modifier: str | None = None) -> None:
        """Writes `value` into `ref[idx]` on `to_rank`'s heap."""
        self._rma("store", ref, idx, to_rank, value=value, mask=mask, cache_modifier=cache_modifier)

    def load_acquire(self, ref, from_rank=None, *, idx=None, scope: str = "sys"):
        """Reads int32 flags with acquire semantics (`ld.acquire.sys` on GPUs): never hoisted
        out of a polling loop, and later reads see what the writer released before the flag.
        `from_rank` defaults to this rank."""
        return self._rma("load_acquire", ref, idx, self.rank if from_rank is None else from_rank, scope=scope)

    def wait(self, ref, value, from_rank=None, *, idx=None, scope: str = "sys"):
        """Polls the int32 flag `ref[idx]` (scalar) until it is >= `value`; returns what it read."""
        def poll(_):
            return self.load_acquire(ref, from_rank, idx=idx, scope=scope)

        first = poll(None)
        return lax.while_loop(lambda seen: seen < value, poll, first)

    def get(self, ref, from_rank, *, idx=None, mask=None, other=None):
        """Alias of `load` (Iris's name: remote load, local use)."""
        return self.load(ref, from_rank, idx=idx, mask=mask, other=other)

    def put(self, ref, value, to_rank, *, idx=None, mask=None) -> None:
        """Alias of `store` (Iris's name: local value, remote store)."""
        self.store(ref, value, to_rank, idx=idx, mask=mask)

    def sync_threads(self) -> None:
        """Waits for every thread of this program (bar.sync on GPUs). Put it between a block
        store and the flag that publishes it: a release orders only its own thread's writes."""
        primitives.iris_sync_threads_p.bind()

    # -- atomics ---------------------------------------------------------------
    def atomic_add(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        """Adds `value` into `ref[idx]` on `to_rank`'s heap; returns the old values."""
        return self._rma("add", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_sub(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("sub", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_xchg(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("xchg", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_and(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("and", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_or(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("or", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_xor(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("xor", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_min(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("min", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_max(self, ref, value, to_rank, *, idx=None, mask=None, sem="acq_rel", scope="sys"):
        return self._rma("max", ref, idx, to_rank, value=value, mask=mask, sem=sem, scope=scope)

    def atomic_cas(self, ref, cmp, value, to_rank, *, idx=None, sem="acq_rel", scope="sys"):
        """Compare-and-swap on `to_rank`'s heap; returns the old values."""
        return self._rma("cas", ref, idx, to_rank, cmp=cmp, value=value, sem=sem, scope=scope)


def _kernel_line() -> str:
    """The kernel's source line being traced: the innermost frame outside JAX and iris (JAX's
    own source info names the pallas_call's line here, not the kernel's)."""
    frame = sys._getframe(1)
    while frame is not None and not source_info_util.is_user_filename(frame.f_code.co_filename):
        frame = frame.f_back
    return "" if frame is None else races.source_line(frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name)


def _rank(rank: Any):
    return jnp.asarray(rank, jnp.int32)
