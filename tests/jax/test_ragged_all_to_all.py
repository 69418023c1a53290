"""ragged_all_to_all on iris against lax's semantics (CPU simulator).

XLA:CPU has no ragged-all-to-all, so values are checked against numpy (lax's docstring
written out) and gradients against the same exchange written with lax.all_gather (iris_jax.reference). Outputs
start poisoned: rows nobody writes must keep the output's values. Worlds 1-8, one and several
slices per member, uneven and zero sizes, gaps between slices, every dtype iris runs, several
windows (the operand staged in parts), tuple axes; jit, grad, jvp, vmap, explain,
replace_lax_collectives, lax's errors.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import CollectiveConfig
from iris_jax.reference import ragged_all_to_all as ragged_reference
from tests.jax.helpers import use_runtime

POISON = -7


def exchange(G, S, N, M, rng, zeros=0.3, most=3):
    """Per member: the four offset/size vectors of a consistent exchange (lax's contract:
    send_sizes == all_to_all(recv_sizes)), slices of up to `most` rows (a share `zeros` of them
    empty) packed with random gaps on both sides."""
    sizes = rng.integers(0, most + 1, size=(G, G, S)) * (rng.random((G, G, S)) > zeros)  # [sender, receiver, slice]
    io, ss, oo, rs = (np.zeros((G, G * S), np.int32) for _ in range(4))
    for j in range(G):  # sender j packs its slices into its operand
        at = 0
        for i in range(G):
            for s in range(S):
                at += int(rng.integers(0, 2))
                io[j, i * S + s], ss[j, i * S + s] = at, sizes[j, i, s]
                at += sizes[j, i, s]
        assert at <= N, "operand too short for the drawn sizes"
    for i in range(G):  # receiver i lays out what it receives
        at = 0
        for j in range(G):
            for s in range(S):
                at += int(rng.integers(0, 2))
                oo[j, i * S + s], rs[i, j * S + s] = at, sizes[j, i, s]
                at += sizes[j, i, s]
        assert at <= M, "output too short for the drawn sizes"
    return io, ss, oo, rs


def expected(operand, output, io, ss, oo):
    """lax's docstring, in numpy: slice i * S + s of sender j lands on member i."""
    G, K = io.shape
    S = K // G
    result = output.copy()
    for j in range(G):
        for k in range(K):
            i, n = k // S, ss[j, k]
            result[i, oo[j, k]:oo[j, k] + n] = operand[j, io[j, k]:io[j, k] + n]
    return result


def _want(arrays):
    operand, output, io, ss, oo, _ = arrays
    return expected(operand, output, io, ss, oo)


def _mesh(G, names=("i",), shape=None):
    use_runtime(max(G, 2))
    return jax.make_mesh(shape or (G,), names, devices=jax.devices()[:G],
                         axis_types=(jax.sharding.AxisType.Explicit,) * len(names))


def _smap(f, mesh, axes="i"):
    spec = P(axes)
    return jax.jit(jax.shard_map(lambda *a: f(*[x[0] for x in a])[None], mesh=mesh, in_specs=spec,
                                 out_specs=spec))


def _inputs(G, S, N, M, trailing, dtype, seed=0):
    rng = np.random.default_rng(seed)
    operand = (rng.standard_normal((G, N, *trailing)) * 8).astype(dtype)
    output = np.full((G, M, *trailing), POISON, dtype)
    return (operand, output, *exchange(G, S, N, M, rng))


def _put(mesh, arrays, axes="i"):
    return [jax.device_put(a, NamedSharding(mesh, P(axes))) for a in arrays]


def _run(ragged, mesh, arrays, axes="i", **kwargs):
    f = _smap(lambda *a: ragged(*a, axis_name=axes, **kwargs), mesh, axes)
    return np.asarray(f(*_put(mesh, arrays, axes)))


@pytest.mark.parametrize("G,S", [(1, 1), (2, 1), (3, 2), (4, 1), (4, 3), (8, 1), (8, 2)])
def test_values_against_numpy(G, S):
    arrays = _inputs(G, S, N=G * S * 5 + 4, M=G * S * 5 + 4, trailing=(3,), dtype=np.float32, seed=G * 10 + S)
    got = _run(iris_jax.ragged_all_to_all, _mesh(G), arrays)
    np.testing.assert_array_equal(got, _want(arrays))


@pytest.mark.parametrize("dtype", [np.float32, jnp.bfloat16, np.float16, np.int32])
@pytest.mark.parametrize("trailing", [(), (4, 5), (33,)])
def test_dtypes_and_row_shapes(dtype, trailing):
    arrays = _inputs(4, 2, N=44, M=40, trailing=trailing, dtype=dtype, seed=len(trailing))
    got = _run(iris_jax.ragged_all_to_all, _mesh(4), arrays)
    np.testing.assert_array_equal(got, _want(arrays))


def test_several_windows():
    """The operand staged in windows of a few rows (chunk_bytes): slices straddle windows."""
    arrays = _inputs(4, 2, N=60, M=60, trailing=(8,), dtype=np.float32, seed=3)
    config = CollectiveConfig(chunk_bytes=5 * 8 * 4)  # 5 rows per window
    got = _run(iris_jax.ragged_all_to_all, _mesh(4), arrays, config=config)
    np.testing.assert_array_equal(got, _want(arrays))


def test_every_size_zero_keeps_the_output():
    G = 4
    arrays = list(_inputs(G, 1, N=24, M=24, trailing=(2,), dtype=np.float32))
    arrays[3][:] = 0
    arrays[5][:] = 0
    np.testing.assert_array_equal(_run(iris_jax.ragged_all_to_all, _mesh(G), arrays), arrays[1])


def test_rows_outside_the_output_are_skipped():
    """lax leaves out-of-range slices undefined; iris writes nothing outside the output."""
    G = 2
    operand = np.arange(2 * 6, dtype=np.float32).reshape(2, 6)
    output = np.full((2, 4), POISON, np.float32)
    io = np.array([[0, 2], [0, 2]], np.int32)
    ss = np.array([[2, 4], [1, 1]], np.int32)
    # sender 0's slice for member 1: rows 2..5 of an output of 4 (slices that overlap in an output
    # are undefined, as in lax: none do here)
    oo = np.array([[0, 2], [3, 1]], np.int32)
    rs = np.array([[2, 1], [4, 1]], np.int32)
    got = _run(iris_jax.ragged_all_to_all, _mesh(G), [operand, output, io, ss, oo, rs])
    np.testing.assert_array_equal(got[1], [POISON, 8, 2, 3])
    np.testing.assert_array_equal(got[0], [0, 1, POISON, 6])


def test_tuple_of_axes():
    mesh = _mesh(4, ("a", "b"), (2, 2))
    arrays = _inputs(4, 1, N=24, M=24, trailing=(3,), dtype=np.float32, seed=7)
    got = _run(iris_jax.ragged_all_to_all, mesh, arrays, axes=("a", "b"))
    np.testing.assert_array_equal(got, _want(arrays))


def test_reference_agrees_with_numpy():
    arrays = _inputs(4, 2, N=40, M=40, trailing=(3,), dtype=np.float32, seed=5)
    np.testing.assert_array_equal(_run(ragged_reference, _mesh(4), arrays), _want(arrays))


@pytest.mark.parametrize("G", [2, 4])
def test_gradients_against_lax(G):
    """lax's transpose (a ragged_all_to_all back, and the output's untouched rows) on iris."""
    mesh = _mesh(G)
    operand, output, *vectors = _inputs(G, 2, N=G * 10 + 4, M=G * 10 + 4, trailing=(3,), dtype=np.float32, seed=G)
    output = output / 7
    weights = np.random.default_rng(1).standard_normal(output.shape).astype(np.float32)

    def loss(ragged):
        def per_rank(x, out, io, ss, oo, rs, w):
            return jnp.sum(jnp.sin(ragged(x, out, io, ss, oo, rs, axis_name="i")) * w)[None]
        smap = jax.shard_map(lambda *a: per_rank(*[v[0] for v in a]), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
        return lambda x, out, *rest: smap(x, out, *rest).sum()

    args = _put(mesh, [operand, output, *vectors, weights])
    got = jax.jit(jax.grad(loss(iris_jax.ragged_all_to_all), argnums=(0, 1)))(*args)
    want = jax.jit(jax.grad(loss(ragged_reference), argnums=(0, 1)))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


def test_jvp_and_vmap():
    G = 4
    mesh = _mesh(G)
    operand, output, *vectors = _inputs(G, 1, N=24, M=24, trailing=(2,), dtype=np.float32, seed=9)

    def exchange_of(ragged):
        return lambda x, out, *rest: ragged(x, out, *rest, axis_name="i")

    for ragged in (iris_jax.ragged_all_to_all, ragged_reference):
        f = exchange_of(ragged)
        tangent = jax.jit(jax.shard_map(
            lambda x, out, *rest: jax.jvp(lambda a, b: f(a[0], b[0], *[r[0] for r in rest])[None], (x, out),
                                          (jnp.cos(x), jnp.ones_like(out)))[1],
            mesh=mesh, in_specs=P("i"), out_specs=P("i")))(*_put(mesh, [operand, output, *vectors]))
        batched = jax.jit(jax.shard_map(  # lax batches the offsets and sizes too (its rule needs them so)
            lambda x, out, *rest: jax.vmap(f)(jnp.stack([x[0], 2 * x[0]]), jnp.stack([out[0], out[0]]),
                                              *[jnp.stack([r[0], r[0]]) for r in rest])[None],
            mesh=mesh, in_specs=P("i"), out_specs=P("i")))(*_put(mesh, [operand, output, *vectors]))
        if ragged is iris_jax.ragged_all_to_all:
            found = (np.asarray(tangent), np.asarray(batched))
        else:
            np.testing.assert_allclose(found[0], np.asarray(tangent), rtol=1e-6)
            np.testing.assert_allclose(found[1], np.asarray(batched), rtol=1e-6)


def test_replace_lax_collectives_and_explain():
    G = 4
    mesh = _mesh(G)
    arrays = _inputs(G, 1, N=24, M=24, trailing=(3,), dtype=np.float32, seed=11)

    def step(*a):
        return lax.ragged_all_to_all(*a, axis_name="i")

    f = jax.shard_map(lambda *a: step(*[x[0] for x in a])[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    args = _put(mesh, arrays)
    got = np.asarray(iris_jax.replace_lax_collectives(f)(*args))
    np.testing.assert_array_equal(got, _want(arrays))
    (row,) = iris_jax.explain(f, *args)
    assert (row.op, row.runs_on, row.axes) == ("ragged_all_to_all", "iris", ("i",))
    assert "lax.ragged_all_to_all" not in jax.jit(iris_jax.replace_lax_collectives(f)).lower(*args).as_text()


@pytest.mark.parametrize("N,trailing,windows", [(24, (3,), 1), (1500, (64,), 2)])
def test_takes_the_workspace_class_that_holds_it(N, trailing, windows):
    """A call of one window takes the least workspace size class that holds the window and the
    slice tables, as the other collectives' calls of one chunk do; a call of several windows
    the largest class. explain names the class, the lowering uses it, values equal numpy's."""
    from iris_jax._runtime.workspace import workspaces
    from iris_jax.collectives import lowering

    mesh = _mesh(4)
    arrays = _inputs(4, 2, N=N, M=N, trailing=trailing, dtype=np.float32, seed=N)
    lax_call = jax.shard_map(lambda *a: lax.ragged_all_to_all(*[x[0] for x in a], axis_name="i")[None],
                             mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    args = _put(mesh, arrays)
    (row,) = iris_jax.explain(lax_call, *args)
    largest = workspaces().layout
    window = N * int(np.prod(trailing)) * 4
    assert (window > largest.data_bytes) == (windows > 1)
    want = workspaces().fitting("collective", window) if windows == 1 else largest
    assert row.workspace == lowering.workspace_name(workspaces().key("collective", want))
    replaced = iris_jax.replace_lax_collectives(lax_call)
    with lowering.recording() as launched:
        compiled = replaced.lower(*args).compile()
    assert [lowering.workspace_name(la.workspace) for la in launched] == [row.workspace]
    np.testing.assert_array_equal(np.asarray(compiled(*args)), _want(arrays))


def test_lax_errors_before_anything_runs():
    G = 4
    mesh = _mesh(G)
    operand, output, io, ss, oo, rs = _inputs(G, 1, N=24, M=24, trailing=(), dtype=np.float32)
    with pytest.raises(ValueError, match="multiple of the 4 members"):
        _run(iris_jax.ragged_all_to_all, mesh, [operand, output, io[:, :3], ss[:, :3], oo[:, :3], rs[:, :3]])
    with pytest.raises(ValueError, match="same length"):
        _run(iris_jax.ragged_all_to_all, mesh, [operand, output, io, ss, oo, np.zeros((G, 8), np.int32)])
    with pytest.raises(ValueError, match="integer"):  # lax's own check
        _run(iris_jax.ragged_all_to_all, mesh, [operand, output, io.astype(np.float32), ss, oo, rs])
    with pytest.raises(TypeError, match="share dtype"):
        _run(iris_jax.ragged_all_to_all, mesh, [operand, output.astype(np.int32), io, ss, oo, rs])


GROUPS = {  # members: axis_index_groups (lax's, which XLA runs on GPUs)
    "pairs": (4, ((0, 1), (2, 3))),
    "interleaved": (4, ((0, 2), (1, 3))),
    "degenerate": (2, ((0,), (1,))),
    "one_of_eight": (8, ((0, 3, 5, 6), (1, 2, 4, 7))),
}


def _grouped_inputs(G, groups, S, N, M, trailing, seed):
    """Inputs of a consistent exchange within each group (offsets of len(group) x S entries)."""
    rng = np.random.default_rng(seed)
    size = len(groups[0])
    operand = (rng.standard_normal((G, N, *trailing)) * 8).astype(np.float32)
    output = np.full((G, M, *trailing), POISON, np.float32)
    vectors = [np.zeros((G, size * S), np.int32) for _ in range(4)]
    for group in groups:
        for v, part in zip(vectors, exchange(size, S, N, M, rng)):
            v[list(group)] = part
    return [operand, output, *vectors]


def _grouped_want(arrays, groups):
    operand, output, io, ss, oo, _ = arrays
    want = output.copy()
    for group in groups:
        g = list(group)
        want[g] = expected(operand[g], output[g], io[g], ss[g], oo[g])
    return want


@pytest.mark.parametrize("name", list(GROUPS))
def test_axis_index_groups_against_numpy(name):
    """Each group exchanges within itself (slice k goes to the group's member k // S), a group
    of one member included; explain says it runs on iris."""
    G, groups = GROUPS[name]
    mesh = _mesh(G)
    arrays = _grouped_inputs(G, groups, 2, N=20, M=20, trailing=(3,), seed=len(name))
    got = _run(iris_jax.ragged_all_to_all, mesh, arrays, axis_index_groups=groups)
    np.testing.assert_array_equal(got, _grouped_want(arrays, groups))
    lax_call = jax.shard_map(lambda *a: lax.ragged_all_to_all(*[x[0] for x in a], axis_name="i",
                                                              axis_index_groups=groups)[None],
                             mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    (row,) = iris_jax.explain(lax_call, *_put(mesh, arrays))
    assert (row.runs_on, row.why.endswith(f"over axis_index_groups {groups}")) == ("iris", True)


def test_axis_index_groups_gradient_against_reference():
    """The transpose exchanges the offsets within the groups too (lax's own does so over the axis)."""
    G, groups = GROUPS["interleaved"]
    mesh = _mesh(G)
    operand, output, *vectors = _grouped_inputs(G, groups, 2, N=20, M=20, trailing=(3,), seed=5)
    output = output / 7
    weights = np.random.default_rng(2).standard_normal(output.shape).astype(np.float32)

    def loss(ragged):
        def per_rank(x, out, io, ss, oo, rs, w):
            y = ragged(x, out, io, ss, oo, rs, axis_name="i", axis_index_groups=groups)
            return jnp.sum(jnp.sin(y) * w)[None]
        smap = jax.shard_map(lambda *a: per_rank(*[v[0] for v in a]), mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                             check_vma=False)
        return lambda x, out, *rest: smap(x, out, *rest).sum()

    args = _put(mesh, [operand, output, *vectors, weights])
    got = jax.jit(jax.grad(loss(iris_jax.ragged_all_to_all), argnums=(0, 1)))(*args)
    want = jax.jit(jax.grad(loss(ragged_reference), argnums=(0, 1)))(*args)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-6, atol=1e-6)


def test_lax_operand_errors_come_before_the_unbound_axis():
    """lax checks the offsets' and sizes' types and shapes before the axis: so does iris (JAX's
    own error tests call it outside any shard_map), then names the unbound axis."""
    use_runtime(2)
    operand, output = jnp.arange(6, dtype=jnp.float32), jnp.zeros(7, jnp.float32)
    good, floats = jnp.array([0, 1, 3], jnp.int32), jnp.array([0.0, 1.0, 3.0], jnp.float32)
    lower = jax.jit(iris_jax.ragged_all_to_all, static_argnames="axis_name").lower
    names = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
    for k, name in enumerate(names):
        for bad, problem in [(floats, "must be integer type"), (good[None], r"must be rank 1 .* shape \(1, 3\)"),
                             (good[:0], r"must be rank 1 .* shape \(0,\)")]:
            vectors = [bad if j == k else good for j in range(4)]
            with pytest.raises(ValueError, match=f"ragged_all_to_all {name} {problem}"):
                lower(operand, output, *vectors, axis_name="x")
    with pytest.raises(NameError, match="iris_jax.ragged_all_to_all: unbound axis name: 'x'; no axis is bound"):
        lower(operand, output, good, good, good, good, axis_name="x")
