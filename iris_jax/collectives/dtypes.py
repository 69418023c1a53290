"""What each dtype travels as through the collective kernels.

lax runs its collectives on every dtype; the kernels take the dtypes Triton has pointers for
(`KERNEL_DTYPES`). Every other dtype is carried in one of them, chosen here once for every
collective (iris_jax.collectives.registry.lower applies it around each rule):

- moving data (all_gather, all_to_all, ppermute, pbroadcast, ragged_all_to_all): the same
  bytes, float8 as uint8, bool as uint8 (0 or 1), complex as its real and imaginary parts (a
  trailing axis of two); sub-byte types (int4, ...) widened to a byte and narrowed back, which
  changes no value;
- reducing (psum, pmax, pmin, psum_scatter): bool as uint8 (max and min), sub-byte integers
  widened and narrowed back (sums wrap modulo their width, as lax's), float8 and float4 in
  float32 (each element rounded once, as the 16-bit floats: iris_core.collectives.kinds.accumulator),
  complex sums as the sums of their real and imaginary parts (a trailing axis of two).

Complex numbers have no order: their pmax / pmin are refused (`refusal`), as XLA refuses them.
"""

from __future__ import annotations

from collections.abc import Callable

import jax.numpy as jnp
from jax import lax

KERNEL_DTYPES = frozenset(jnp.dtype(d) for d in (
    jnp.int8, jnp.int16, jnp.int32, jnp.int64, jnp.uint8, jnp.uint16, jnp.uint32, jnp.uint64,
    jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64))
_WORDS = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _bits(dtype) -> int:
    info = jnp.finfo(dtype) if jnp.issubdtype(dtype, jnp.floating) else jnp.iinfo(dtype)
    return info.bits


def refusal(dtype, op: str | None) -> tuple[str, type[Exception]] | None:
    """Why a collective that reduces with `op` (None: moves data) cannot run over `dtype`, and
    the error lax gives for it; None where it can."""
    dtype = jnp.dtype(dtype)
    if op in ("max", "min") and jnp.issubdtype(dtype, jnp.complexfloating):
        return f"{op} of {dtype.name}: complex numbers have no order (XLA refuses it too)", TypeError
    if op == "sum" and dtype == jnp.bool_:
        return "a sum of bool (lax's add refuses bool; psum counts bools as int32)", TypeError
    return None


def encode(x, op: str | None) -> tuple[object, Callable]:
    """`x` as the kernels take it, for a collective that reduces with `op` ("sum", "max", "min")
    or moves data (None), and the function that turns a result back into `x`'s dtype. Results
    keep the operand's leading dimensions (a carried trailing axis is the last)."""
    dtype = jnp.dtype(x.dtype)
    if dtype in KERNEL_DTYPES:
        return x, _same
    if dtype == jnp.bool_:
        return x.astype(jnp.uint8), lambda y: y.astype(jnp.bool_)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1), lambda y: lax.complex(y[..., 0], y[..., 1])
    if _bits(dtype) < 8:  # int4, uint4, float4: a byte each, values unchanged
        wide = jnp.float32 if jnp.issubdtype(dtype, jnp.floating) else jnp.int8 if jnp.issubdtype(
            dtype, jnp.signedinteger) else jnp.uint8
        return x.astype(wide), lambda y: y.astype(dtype)
    if op is not None and jnp.issubdtype(dtype, jnp.floating):  # float8: combined in float32
        return x.astype(jnp.float32), lambda y: y.astype(dtype)
    word = _WORDS[dtype.itemsize]
    return lax.bitcast_convert_type(x, word), lambda y: lax.bitcast_convert_type(y, dtype)


def _same(y):
    return y


def encode_all(xs: list, op: str | None) -> tuple[list, Callable]:
    """`encode` of each of `xs`, and the function that decodes a list of results, one per operand."""
    pairs = [encode(x, op) for x in xs]
    return [p[0] for p in pairs], lambda ys: [decode(y) for (_, decode), y in zip(pairs, ys)]


