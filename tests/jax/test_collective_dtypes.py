"""lax's answer for every input lax takes (iris_jax.collectives.dtypes; CPU simulator): every dtype,
bit for bit; 16-bit float sums rounded once per element; constants computed while tracing, as lax's."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import reference
from tests.jax.test_collectives import mesh_of, poison, shard

W = 4
# every dtype lax's collectives take without jax_enable_x64 (the 64-bit ones: test_64_bit_dtypes)
DTYPES = ("bool", "int4", "uint4", "int8", "uint8", "int16", "uint16", "int32", "uint32", "float8_e4m3fn",
          "float8_e5m2", "float8_e4m3b11fnuz", "float16", "bfloat16", "float32", "complex64")


def _values(rng, dtype, shape):
    """Random values of `dtype`: small integers (sums of a few stay in range), normal floats."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if jnp.issubdtype(dtype, jnp.integer):
        low = -8 if jnp.issubdtype(dtype, jnp.signedinteger) else 0
        return jnp.asarray(rng.integers(low, 8, shape)).astype(dtype)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        return jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    return jnp.asarray(rng.standard_normal(shape)).astype(dtype)


def _ops(module, dtype):
    """(name, per-member function, out spec) of every collective lax runs on `dtype` (XLA:CPU has no
    max of complex numbers and lax no sum of bools but psum's, which counts them as int32)."""
    ring = [(i, (i + 1) % W) for i in range(W)]
    ops = [("psum", lambda v: module.psum(v, "x"), P()),
           ("all_gather", lambda v: module.all_gather(v, "x", axis=1), P("x")),
           ("all_to_all", lambda v: module.all_to_all(v, "x", 0, 0, tiled=True), P("x")),
           ("ppermute", lambda v: module.ppermute(v, "x", ring), P("x")),
           ("pbroadcast", lambda v: module.pbroadcast(v, "x", 2) if module is iris_jax  # (no lowering of lax's
            else lax.all_gather(v, "x")[2], P("x")),                                    # on XLA:CPU)
           ("pswapaxes", lambda v: module.pswapaxes(v, "x", 0), P("x"))]
    if not jnp.issubdtype(dtype, jnp.complexfloating):
        ops += [("pmax", lambda v: module.pmax(v, "x"), P()), ("pmin", lambda v: module.pmin(v, "x"), P())]
    if jnp.dtype(dtype) != jnp.bool_:
        ops.append(("psum_scatter", lambda v: module.psum_scatter(v, "x", tiled=True), P("x")))
    return ops


def _run(mesh, f, x, out_spec):
    return np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=out_spec))(x))


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint8)


def _exactly_rounded_sum(x, dtype, axis=0):
    return np.asarray(x, np.float64).sum(axis).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(rng, dtype):
    """Every collective on every dtype lax takes, on iris (no XLA collective is left), bit for bit
    lax's; sums of float16, which XLA:CPU rounds after each member, are the exactly rounded sums."""
    mesh = mesh_of((W,), ("x",))
    x = shard(mesh, _values(rng, dtype, (W * 4, 6)), P("x"))
    poison()
    for (name, iris_op, spec), (_, lax_op, _) in zip(_ops(iris_jax, dtype), _ops(lax, dtype)):
        got, want = _run(mesh, iris_op, x, spec), _run(mesh, lax_op, x, spec)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        if dtype == "float16" and name in ("psum", "psum_scatter"):
            want = _exactly_rounded_sum(np.asarray(x).reshape(W, 4, 6), np.float16)  # both: the [4, 6] sum
        np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name} of {dtype}")
        rows = iris_jax.explain(jax.shard_map(lax_op, mesh=mesh, in_specs=P("x"), out_specs=spec), x)
        assert [r.runs_on for r in rows] == ["iris"] * len(rows), (name, rows)


@pytest.mark.parametrize("dtype", ("bool", "int4", "float8_e4m3fn", "uint16", "bfloat16", "complex64"))
def test_ragged_all_to_all_every_dtype(rng, dtype):
    """ragged_all_to_all moves rows of any dtype (XLA:CPU cannot run lax's: the reference is
    lax's semantics through all_gather, iris_jax.reference)."""
    mesh = mesh_of((W,), ("x",))
    rows = 3
    x = shard(mesh, _values(rng, dtype, (W * W * rows, 2)), P("x"))
    out = shard(mesh, jnp.zeros((W * W * rows, 2), dtype), P("x"))
    offsets = jnp.tile(jnp.arange(W, dtype=jnp.int32) * rows, W)
    sizes = jnp.full((W * W,), rows, jnp.int32)

    def call(f):
        def body(operand, output):
            me = lax.axis_index("x")
            return f(operand, output, offsets[:W], sizes[:W], offsets[:W] * 0 + me * rows, sizes[:W], axis_name="x")
        return _two(mesh, body, x, out)

    got, want = call(iris_jax.ragged_all_to_all), call(reference.ragged_all_to_all)
    np.testing.assert_array_equal(_bits(got), _bits(want))


def _two(mesh, body, a, b):
    return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"),
                                            check_vma=False))(a, b))


def test_64_bit_dtypes(rng):
    """With jax_enable_x64: int64, uint64, float64 and complex128, bit for bit lax's."""
    mesh = mesh_of((W,), ("x",))
    with jax.enable_x64(True):
        for dtype in ("int64", "uint64", "float64", "complex128"):
            x = shard(mesh, _values(rng, dtype, (W * 4, 6)), P("x"))
            for (name, iris_op, spec), (_, lax_op, _) in zip(_ops(iris_jax, dtype), _ops(lax, dtype)):
                got, want = _run(mesh, iris_op, x, spec), _run(mesh, lax_op, x, spec)
                assert got.dtype == want.dtype == jnp.dtype(dtype), name
                np.testing.assert_array_equal(_bits(got), _bits(want), err_msg=f"{name} of {dtype}")


# -- 16-bit float sums: one rounding per element -------------------------------------------------
PATHS = {  # every all-reduce path: variants, streamed, chunked (several chunks per call)
    "one_shot": dict(variant="one_shot"),
    "two_shot": dict(variant="two_shot"),
    "ring": dict(variant="ring"),
    "spinlock": dict(variant="spinlock"),
    "streamed": dict(variant="one_shot", stream_from=0),
    "pushed": dict(variant="one_shot", push_from=0, stream_from=1 << 40, stream_until=0),
    "chunked": dict(variant="one_shot", chunk_bytes=4096, stream_from=1 << 40, stream_until=0),
}


@pytest.mark.parametrize("members", [2, 3, 8])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_sums_are_rounded_once(rng, dtype, members):
    """bfloat16 and float16 psum (every path) and psum_scatter accumulate in float32 and round each
    element once: equal to the exactly rounded sum in at least 99.9% of elements (a float32 sum of a
    few 16-bit values is almost always exact), and for bfloat16 to lax's (XLA:CPU sums bfloat16 in
    float32 too)."""
    mesh = mesh_of((members,), ("x",))
    n = 3000
    x = shard(mesh, _values(rng, dtype, (members * n,)).reshape(members, n), P("x"))
    exact = _exactly_rounded_sum(np.asarray(x), jnp.dtype(dtype))
    poison()
    results = {}
    for path, settings in PATHS.items():
        config = iris_jax.CollectiveConfig(**settings)
        results[path] = _run(mesh, lambda v, c=config: iris_jax.psum(v[0], "x", config=c), x, P())
    scatter = _run(mesh, lambda v: iris_jax.psum_scatter(v[0], "x", tiled=True), x[:, :n // members * members],
                   P("x"))
    results["psum_scatter"] = scatter
    lax_sum = _run(mesh, lambda v: lax.psum(v[0], "x"), x, P()) if dtype == "bfloat16" else None
    for path, got in results.items():
        want = exact[:got.shape[0]]
        assert np.mean(got == want) >= 0.999, (path, np.mean(got == want))
        if lax_sum is not None:
            assert np.mean(got == lax_sum[:got.shape[0]]) >= 0.999, (path, np.mean(got == lax_sum[:got.shape[0]]))


# -- constants: lax's answer while tracing ---------------------------------------------------------
def test_constants_are_laxs(rng):
    """psum / pmean of operands that hold no tracer return what lax's return: `psum(1, axis)` is the
    axis's size as a Python int (a shape, a loop bound, an `if`), `pmean(1, axis)` a float."""
    mesh = mesh_of((2, 2), ("x", "y"))
    seen = {}

    def body(v):
        size = iris_jax.psum(1, ("x", "y"))
        seen.update(size=size, lax_size=lax.psum(1, ("x", "y")), mean=iris_jax.pmean(1, "x"),
                    lax_mean=lax.pmean(1, "x"), tree=iris_jax.psum({"a": 2, "b": 0.5}, "y"),
                    lax_tree=lax.psum({"a": 2, "b": 0.5}, "y"), array=iris_jax.psum(np.ones(3, np.int32), "x"),
                    lax_array=lax.psum(np.ones(3, np.int32), "x"))
        if size > 2:  # Python control flow on it
            v = v + jnp.zeros((1, size), v.dtype)[:, :1]  # and a shape
        return v + sum(range(size))

    x = shard(mesh, np.zeros((4, 1), np.float32), P(("x", "y")))
    out = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y"))))(x)
    np.testing.assert_array_equal(np.asarray(out), np.full((4, 1), 6.0))
    assert type(seen["size"]) is type(seen["lax_size"]) is int and seen["size"] == 4
    assert type(seen["mean"]) is type(seen["lax_mean"]) and seen["mean"] == seen["lax_mean"] == 1
    assert seen["tree"] == seen["lax_tree"] == {"a": 4, "b": 1.0}
    assert type(seen["array"]) is type(seen["lax_array"])
    np.testing.assert_array_equal(seen["array"], seen["lax_array"])
    with jax.enable_x64(True):  # a Python int stays one (lax's int64 constant path)
        jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(("x", "y")), out_specs=P(("x", "y"))))(x)
        assert type(seen["size"]) is int and seen["size"] == 4


def test_nan_loses_a_maximum(rng):
    """pmax / pmin drop a NaN unless every member holds one, as XLA's and NCCL's reductions (and the
    GPU's max.f32, which the simulator follows) do: lax's values, infinities included. (Where every
    member holds NaN, iris gives NaN, as NCCL does; XLA:CPU gives -inf / inf, its reduction's start.)"""
    mesh = mesh_of((W,), ("x",))
    v = rng.standard_normal((W, 8)).astype(np.float32)
    v[0, 1] = v[2, 1] = v[1, 4] = v[0, 6] = np.nan
    v[3, 2], v[1, 3] = np.inf, -np.inf
    x = shard(mesh, v, P("x"))
    for name in ("pmax", "pmin"):
        got = _run(mesh, lambda u, n=name: getattr(iris_jax, n)(u[0], "x"), x, P())
        want = _run(mesh, lambda u, n=name: getattr(lax, n)(u[0], "x"), x, P())
        np.testing.assert_array_equal(got, want)
        assert not np.isnan(got).any()
