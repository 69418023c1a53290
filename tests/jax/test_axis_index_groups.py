"""`axis_index_groups` against lax, on the CPU simulator.

What lax takes inside a fully manual shard_map (the same on jax 0.10.2 and 0.12): groups of
the indices of the collective's axes (over a tuple of axes, of lax.axis_index of the tuple)
for pmax, pmin, all_gather, psum_scatter and all_to_all, and for psum / pmean only with
check_vma=False (with it lax raises NotImplementedError); not ppermute or pbroadcast. Its
checks: the groups hold each of 0 .. their total once (ValueError), all_gather / psum_scatter
/ all_to_all need equal sizes (ValueError at lowering), groups that leave members out fail in
XLA's compiler (JaxRuntimeError) and ones naming members beyond the axes index past them
(IndexError). iris runs every equal-sized partition as iris kernels, each group as a mesh
axis's group would, and raises lax's error types while tracing; pmax / pmin / psum over
groups of unequal sizes (which lax runs) stay on XLA under replace_lax_collectives and raise
UnsupportedCollectiveError in the explicit API.

Values are checked with the harness of test_collectives (outputs poisoned first, calls
chained, varying-axes types compared), at worlds 2, 4 and 8, then gradients, jvp, vmap and
scan, errors, replace_lax_collectives / explain, and groups over axes that span domains.
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
from tests.jax.helpers import use_runtime
from tests.jax.test_collectives import BF16, F32, I32, Case, rand, run_cases, shard
from tests.jax.test_replace_lax import kernels, xla_collectives
from tests.jax.test_transforms import _transforms as transforms_of

# every partition of the ranks into groups gets its own workspace (3.3 MiB with this heap), for
# the runtime's life: the tests of many partitions start a runtime of their own (fresh_runtime)
HEAP = 32 << 20


def mesh_of(shape, names):
    """A mesh over the first prod(shape) devices of this module's runtime (over the 8 CPU devices)."""
    use_runtime(8, HEAP)
    return jax.make_mesh(tuple(shape), tuple(names), devices=jax.devices()[:int(np.prod(shape))])


@pytest.fixture
def fresh_runtime():
    """The test's workspaces are freed after it (the runtime shut down; the next test starts one)."""
    yield
    iris_jax.shutdown()


def _grouped_cases(ax, groups, G, full):
    """pmax, pmin, all_gather, psum_scatter and all_to_all over `groups` (G members each)."""
    gk = {"axis_index_groups": groups}

    def case(name, shape, reduces=False, **kwargs):
        return Case(f"{name}({shape}, {kwargs})", shape, lambda v: getattr(iris_jax, name)(v, ax, **kwargs, **gk),
                    lambda v: getattr(lax, name)(v, ax, **kwargs, **gk), reduces)

    cases = [
        case("pmax", (37,)), case("pmin", (3, 5)),
        case("all_gather", (37,)), case("all_gather", (3, 5), axis=1, tiled=True),
        case("psum_scatter", (3, 2 * G), True, scatter_dimension=1, tiled=True),
        case("psum_scatter", (G, 5), True),
        Case("all_to_all((2G, 3), 0, 1, tiled)", (2 * G, 3),
             lambda v: iris_jax.all_to_all(v, ax, 0, 1, tiled=True, **gk),
             lambda v: lax.all_to_all(v, ax, 0, 1, tiled=True, **gk)),
        Case("all_to_all((2, G, 3), 1, 2)", (2, G, 3), lambda v: iris_jax.all_to_all(v, ax, 1, 2, **gk),
             lambda v: lax.all_to_all(v, ax, 1, 2, **gk)),
    ]
    if full:
        cases += [
            case("pmax", ()), case("pmin", (517,)),
            case("all_gather", (2, 3, 4), axis=2), case("all_gather", (300,), tiled=True),
            case("psum_scatter", (37 * G,), True, tiled=True),
            Case("all_to_all((3, 2G), 1, 0, tiled)", (3, 2 * G),
                 lambda v: iris_jax.all_to_all(v, ax, 1, 0, tiled=True, **gk),
                 lambda v: lax.all_to_all(v, ax, 1, 0, tiled=True, **gk)),
        ]
    return cases


def _sum_cases(ax, groups, G, dtype, full):
    """psum / pmean over `groups` (lax takes them with check_vma=False), every all-reduce variant."""
    gk = {"axis_index_groups": groups}
    variants = ["auto", "two_shot", "ring", "spinlock"] + (["atomic"] if jnp.dtype(dtype) != jnp.dtype(BF16) else [])
    cases = [Case(f"psum((300,), {variant})", (300,), lambda v, variant=variant: iris_jax.psum(v, ax, variant=variant,
                                                                                              **gk),
                  lambda v: lax.psum(v, ax, **gk), True,
                  tol=None if variant in ("auto", "two_shot") or jnp.dtype(dtype) != jnp.dtype(BF16) else 2 * G * 2 ** -8)
             for variant in (variants if full else ["auto", "ring"])]
    cases += [Case("psum(3,5)", (3, 5), lambda v: iris_jax.psum(v, ax, **gk), lambda v: lax.psum(v, ax, **gk), True)]
    if jnp.issubdtype(dtype, jnp.floating):
        cases += [Case("pmean(37)", (37,), lambda v: iris_jax.pmean(v, ax, **gk), lambda v: lax.pmean(v, ax, **gk),
                       True, tol=2e-2 if jnp.dtype(dtype) == jnp.dtype(BF16) else None)]
    return cases


# (world, groups, dtype, full): pairs, strided, non-contiguous and unsorted groups, one group in reverse
ONE_D = [
    (2, ((1, 0),), F32, True),
    (4, ((0, 1), (2, 3)), F32, True), (4, ((0, 1), (2, 3)), I32, False),
    (4, ((0, 2), (1, 3)), BF16, False), (4, ((3, 0), (1, 2)), F32, False),
    (8, ((0, 1), (2, 3), (4, 5), (6, 7)), F32, True), (8, ((0, 1), (2, 3), (4, 5), (6, 7)), BF16, False),
    (8, ((0, 2, 4, 6), (1, 3, 5, 7)), F32, False), (8, ((0, 2, 4, 6), (1, 3, 5, 7)), I32, False),
    (8, ((0, 3), (1, 2), (4, 7), (5, 6)), F32, False), (8, ((7, 0, 5, 2), (1, 6, 3, 4)), F32, False),
]


def _id(groups):
    return "_".join("".join(map(str, g)) for g in groups)


@pytest.mark.parametrize("W,groups,dtype,full", ONE_D,
                         ids=[f"W{W}-{_id(g)}-{jnp.dtype(d).name}" for W, g, d, _ in ONE_D])
def test_values_match_lax(W, groups, dtype, full, rng, fresh_runtime):
    mesh = mesh_of((W,), ("i",))
    G = len(groups[0])
    run_cases(mesh, _grouped_cases("i", groups, G, full), dtype, rng)
    run_cases(mesh, _sum_cases("i", groups, G, dtype, full), dtype, rng, check_vma=False)


# 2 x 4 mesh: groups over one axis (with the other's coordinate kept), over a tuple of axes
# (indices of lax.axis_index of the tuple), in both orders
TWO_D = [("y", ((0, 1), (2, 3))), ("y", ((0, 3), (2, 1))), (("x", "y"), ((0, 1, 2, 3), (4, 5, 6, 7))),
         (("x", "y"), ((0, 5), (1, 4), (2, 7), (3, 6))), (("y", "x"), ((0, 1), (2, 3), (4, 5), (6, 7)))]


@pytest.mark.parametrize("axes,groups", TWO_D, ids=[f"{'+'.join(a)}-{_id(g)}" for a, g in TWO_D])
def test_2d_mesh_matches_lax(axes, groups, rng, fresh_runtime):
    mesh = mesh_of((2, 4), ("x", "y"))
    G = len(groups[0])
    run_cases(mesh, _grouped_cases(axes, groups, G, False), F32, rng)
    run_cases(mesh, _sum_cases(axes, groups, G, F32, False), F32, rng, check_vma=False)


# -- where they run ------------------------------------------------------------------------------
def _x(mesh, rng, shape=(16, 6)):
    return jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), NamedSharding(mesh, P("i")))


def test_replace_lax_collectives_runs_groups_on_iris(rng):
    """lax's own equations with groups become iris kernels (no XLA collective is left), with
    lax's values; explain says iris, over which groups."""
    mesh = mesh_of((8,), ("i",))
    x = _x(mesh, rng, (32, 6))
    pairs, quads = ((0, 1), (2, 3), (4, 5), (6, 7)), ((0, 2, 4, 6), (1, 3, 5, 7))

    def body(v):
        a = lax.psum_scatter(v, "i", axis_index_groups=pairs, tiled=True)
        b = lax.all_gather(jnp.sin(a), "i", axis_index_groups=pairs, tiled=True)
        c = lax.pmax(b, "i", axis_index_groups=quads)
        d = lax.all_to_all(c, "i", 0, 0, axis_index_groups=quads, tiled=True)
        return lax.psum(d, "i", axis_index_groups=quads) + c

    program = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)
    replaced = iris_jax.replace_lax_collectives(program)
    np.testing.assert_allclose(np.asarray(replaced(x)), np.asarray(jax.jit(program)(x)), rtol=1e-5, atol=1e-6)
    lowered = replaced.lower(x)
    assert kernels(lowered) == 5 and xla_collectives(lowered) == 0
    rows = iris_jax.explain(program, x)
    assert [r.op for r in rows] == ["psum_scatter", "all_gather", "pmax", "all_to_all", "psum"]
    assert all(r.runs_on == "iris" for r in rows)
    assert f"over axis_index_groups {pairs}" in rows[0].why and f"over axis_index_groups {quads}" in rows[4].why


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=lambda d: jnp.dtype(d).name)
def test_unequal_reduction_groups(rng, dtype):
    """lax runs psum / pmean / pmax / pmin over groups of unequal sizes, and so does iris (the
    operands gathered over the axis, each member combining its group's in the group's order,
    rounded once): bit for bit lax's. Groups of one member only stay on XLA (nothing to send)."""
    mesh = mesh_of((8,), ("i",))
    x = shard(mesh, (rng.standard_normal((8, 6)) * 8).astype(dtype), P("i"))
    uneven, lone, singles = ((0, 1, 2), (3, 4, 5, 6, 7)), ((5,), (0, 1, 2, 3, 4, 6, 7)), tuple((i,) for i in range(8))

    def body(module):
        def f(v):
            parts = [module.pmax(v, "i", axis_index_groups=uneven), module.pmin(v, "i", axis_index_groups=lone),
                     module.psum(v, "i", axis_index_groups=uneven), module.psum(v, "i", axis_index_groups=singles)]
            if dtype != I32:
                parts.append(module.pmean(v, "i", axis_index_groups=lone))
            return jnp.stack(parts)
        return jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P(None, "i"), check_vma=False)

    want = np.asarray(jax.jit(body(lax))(x))
    np.testing.assert_array_equal(np.asarray(jax.jit(body(iris_jax))(x)), want)
    replaced = iris_jax.replace_lax_collectives(body(lax))
    np.testing.assert_array_equal(np.asarray(replaced(x)), want)
    assert xla_collectives(replaced.lower(x)) == 1  # the groups of one
    rows = iris_jax.explain(body(lax), x)
    assert [r.runs_on for r in rows] == ["iris", "iris", "iris", "XLA"] + (["iris"] if dtype != I32 else [])
    assert f"over axis_index_groups {uneven}" in rows[0].why and "one member" in rows[3].why


# -- errors: lax's types, raised while tracing -----------------------------------------------------
def _both_raise(mesh, x, call, error, match=None):
    """`call(module)` raises `error` with lax and with iris (matching `match` for iris)."""
    for module in (lax, iris_jax):
        f = jax.jit(jax.shard_map(lambda v, m=module: call(m, v), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        with pytest.raises(error, match=match if module is iris_jax else None):
            if module is iris_jax:
                f.trace(x)  # before anything is lowered or run
            else:
                f(x)


UNEVEN = ((0, 1, 2), (3, 4, 5, 6, 7))
QUADS = ((0, 2, 4, 6), (1, 3, 5, 7))
PAIRS = ((3, 0), (1, 2))
ERRORS = {
    # name: (call, error, iris's message)
    "all_gather unequal": (lambda m, v: m.all_gather(v, "i", axis_index_groups=UNEVEN), ValueError, "unequal"),
    "psum_scatter unequal": (lambda m, v: m.psum_scatter(v, "i", axis_index_groups=UNEVEN, tiled=True), ValueError,
                             "unequal"),
    "all_to_all unequal": (lambda m, v: m.all_to_all(v, "i", 0, 0, axis_index_groups=UNEVEN, tiled=True), ValueError,
                           "unequal"),
    "not covering": (lambda m, v: m.all_gather(v, "i", axis_index_groups=((0, 1), (2, 3), (4, 5))),
                     jax.errors.JaxRuntimeError, "do not cover"),
    "pmax not covering": (lambda m, v: m.pmax(v, "i", axis_index_groups=((0, 1), (2, 3))),
                          jax.errors.JaxRuntimeError, "do not cover"),
    "beyond the axis": (lambda m, v: m.pmin(v, "i", axis_index_groups=tuple((i, i + 8) for i in range(8))),
                        IndexError, "beyond"),
    "an index twice": (lambda m, v: m.pmax(v, "i", axis_index_groups=((0, 1), (1, 2), (3, 4), (5, 6, 7))),
                       ValueError, "exactly once"),
    "psum under check_vma": (lambda m, v: m.psum(v, "i", axis_index_groups=((0, 1), (2, 3), (4, 5), (6, 7))),
                             NotImplementedError, None),
    "all_gather to invarying": (lambda m, v: m.all_gather(v, "i", axis_index_groups=((0, 1), (2, 3), (4, 5), (6, 7)),
                                                          to="invarying"), NotImplementedError, None),
    "ppermute": (lambda m, v: m.ppermute(v, "i", [(0, 1)], axis_index_groups=((0, 1),)), TypeError, None),
    "pmax jvp under check_vma": (lambda m, v: jax.jvp(lambda u: m.pmax(u, "i", axis_index_groups=QUADS), (v,), (v,))[1],
                                 NotImplementedError, "check_vma=False"),
    "vmap all_to_all": (lambda m, v: jax.vmap(lambda u: m.all_to_all(u, "i", 0, 0, tiled=True,
                                                                     axis_index_groups=((0, 1), (2, 3), (4, 5), (6, 7))),
                                              in_axes=1, out_axes=1)(v), NotImplementedError, None),
}


@pytest.mark.parametrize("name", list(ERRORS))
def test_errors_are_lax_s(name, rng):
    call, error, match = ERRORS[name]
    mesh = mesh_of((8,), ("i",))
    _both_raise(mesh, _x(mesh, rng, (8 * 6, 6)), call, error, match)  # 6 rows: groups of 2 or 3 split them


# -- transformations -------------------------------------------------------------------------------


def _ops(groups):
    gk = {"axis_index_groups": groups}
    gathered = lambda v: lax.all_gather(v, "i", axis=0, **gk)  # noqa: E731
    return {
        # name: (iris op, reference op, check_vma)
        "psum": (lambda v: iris_jax.psum(v, "i", **gk), lambda v: lax.psum(v, "i", **gk), False),
        "pmean": (lambda v: iris_jax.pmean(v, "i", **gk), lambda v: lax.pmean(v, "i", **gk), False),
        # lax cannot differentiate pmax: the max of the gathered group (ties share the derivative);
        # iris can without check_vma (with it, lax types the result invariant over the whole axis)
        "pmax": (lambda v: iris_jax.pmax(v, "i", **gk), lambda v: jnp.max(gathered(v), axis=0), False),
        "pmin": (lambda v: iris_jax.pmin(v, "i", **gk), lambda v: jnp.min(gathered(v), axis=0), False),
        "all_gather": (lambda v: iris_jax.all_gather(v, "i", axis=1, tiled=True, **gk),
                       lambda v: lax.all_gather(v, "i", axis=1, tiled=True, **gk), True),
        "psum_scatter": (lambda v: iris_jax.psum_scatter(v, "i", tiled=True, **gk),
                         lambda v: lax.psum_scatter(v, "i", tiled=True, **gk), True),
        "all_to_all": (lambda v: iris_jax.all_to_all(v, "i", 0, 0, tiled=True, **gk),
                       lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True, **gk), True),
    }


def _transforms(smap):
    """test_transforms's programs, but eager and linearize (covered there for every op)."""
    return {name: make for name, make in transforms_of(smap).items() if name not in ("eager", "linearize")}


def _body(op):
    def f(v):
        y = op(v)
        return (jnp.sum(jnp.sin(y) * jnp.cos(y)) + jnp.sum(y))[None]
    return f


TRANSFORM_CASES = [(W, groups, op, t) for W, groups in ((8, QUADS), (4, PAIRS)) for op in _ops(groups)
                   for t in _transforms(None) if not (op == "all_to_all" and t == "vmap")]  # lax: not implemented


@pytest.mark.parametrize("W,groups,op_name,transform", TRANSFORM_CASES,
                         ids=[f"W{W}-{op}-{t}" for W, _, op, t in TRANSFORM_CASES])
def test_transformations_match_lax(W, groups, op_name, transform, rng):
    mesh = mesh_of((W,), ("i",))
    iris_op, ref_op, check_vma = _ops(groups)[op_name]
    G = len(groups[0])
    shape = (W * 2 * G, 3) + ((2,) if transform == "vmap" else ())
    # distinct values (no ties), so pmax/pmin derivatives are well defined
    values = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) / np.prod(shape) + 0.5
    x = jax.device_put(jnp.asarray(values), NamedSharding(mesh, P("i")))
    smap = lambda f: jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=check_vma)  # noqa: E731
    make = _transforms(smap)[transform]
    program = make(_body(iris_op))
    got = np.asarray(program(x))
    want = np.asarray(make(_body(ref_op))(x))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{op_name} under {transform}")
    assert xla_collectives(program.lower(x)) == 0  # every collective, transposes included, ran on iris


def test_gradient_of_pmax_over_groups_against_finite_differences(rng):
    mesh = mesh_of((8,), ("i",))
    x = _x(mesh, rng, (16, 3))
    f = jax.jit(jax.shard_map(lambda v: jnp.sum(jnp.sin(iris_jax.pmax(v, "i", axis_index_groups=QUADS)))[None],
                              mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    direction = jax.device_put(jnp.asarray(rng.standard_normal((16, 3)), jnp.float32), x.sharding)
    _, tangent = jax.jvp(f, (x,), (direction,))
    eps = 1e-3
    numeric = (np.asarray(f(x + eps * direction)) - np.asarray(f(x - eps * direction))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(tangent), numeric, rtol=1e-2, atol=1e-3)


def test_grouped_and_whole_axis_calls_alternate(rng):
    """Calls over two partitions of one axis and over the whole axis, alternating in one jit:
    each partition has its own workspace, so their epochs and flags never mix."""
    mesh = mesh_of((8,), ("i",))
    x = shard(mesh, rand(rng, (8 * 12,), F32), P("i"))

    def body(mod):
        def f(v):
            for _ in range(2):
                v = mod.psum_scatter(v, "i", axis_index_groups=QUADS, tiled=True)
                v = mod.all_gather(v * 2 + 1, "i", tiled=True)  # the whole axis: 8 x the rows
                v = mod.pmax(v[:12] - v[12:24], "i", axis_index_groups=((0, 1), (2, 3), (4, 5), (6, 7)))
            return v

        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    np.testing.assert_allclose(np.asarray(body(iris_jax)(x)), np.asarray(body(lax)(x)), rtol=1e-5)


def test_groups_over_axes_that_span_domains_run_on_xla(rng):
    """Two domains of four ranks: groups over an axis that spans them run on XLA (no
    composition of groups across domains), with lax's values."""
    use_runtime(8, 64 << 20, domain_size=4)
    mesh = jax.make_mesh((8,), ("i",), devices=jax.devices()[:8])
    x = _x(mesh, rng)

    def body(v):
        return lax.all_gather(v, "i", axis_index_groups=QUADS, tiled=True)

    program = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    replaced = iris_jax.replace_lax_collectives(program)
    np.testing.assert_array_equal(np.asarray(replaced(x)), np.asarray(jax.jit(program)(x)))
    assert kernels(replaced.lower(x)) == 0
    (row,) = iris_jax.explain(program, x)
    assert row.runs_on == "XLA" and "span domains" in row.why
