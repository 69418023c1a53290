"""Iris collectives inside a partially manual shard_map (CPU simulator).

`jax.shard_map(f, mesh=mesh, ..., axis_names={"tp"})` leaves the other mesh axes to the
compiler; collectives over the manual axes run as iris kernels, lowered in a nested shard_map
over the automatic axes (iris_jax.collectives.primitive), and collectives over an automatic axis stay on
XLA. Checked against the same program with jax.lax: every op, on 2 x 2 and 2 x 4 meshes with
the manual axis first or second; the transformations; Auto, Explicit and mixed axis types; the
mesh contexts users make (jax.set_mesh, the legacy `with mesh:`, none); and in the compiled
program of a tensor-parallel step with data parallelism left to XLA, no XLA collective that
lax's version of the step does not have.
"""

from __future__ import annotations

import collections
import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax.helpers import use_runtime
from tests.jax.test_transforms import _transforms as transforms_of

AUTO, EXPLICIT = AxisType.Auto, AxisType.Explicit
# an XLA collective of the compiled program: its result's type, its kind
HLO_COLLECTIVE = re.compile(r"=\s*(\([^=]*?\)|\S+)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                            r"(?:-start)?\(")


def _ops(G):
    """name -> f(module, v, axis): the op with iris_jax's or lax's collectives."""
    ring = [(i, (i + 1) % G) for i in range(G)]
    return {
        "psum": lambda m, v, a: m.psum(v, a),
        "pmean": lambda m, v, a: m.pmean(v, a),
        "pmax": lambda m, v, a: m.pmax(v, a),
        "pmin": lambda m, v, a: m.pmin(v, a),
        "all_gather": lambda m, v, a: m.all_gather(v, a, axis=1, tiled=True),
        "all_gather_untiled": lambda m, v, a: m.all_gather(v, a, axis=0),
        "psum_scatter": lambda m, v, a: m.psum_scatter(v, a, scatter_dimension=0, tiled=True),
        "psum_scatter_untiled": lambda m, v, a: m.psum_scatter(v.reshape(G, -1, *v.shape[1:]), a),
        "all_to_all": lambda m, v, a: m.all_to_all(v, a, 0, 1, tiled=True),
        "ppermute": lambda m, v, a: m.ppermute(v, a, ring),
        # a tuple: lax.pbroadcast (jax 0.10.2) reads a string axis name as a tuple of letters
        "pbroadcast": lambda m, v, a: m.pbroadcast(v, (a,), G - 1),
    }


OPS = list(_ops(2))
# pmax/pmin: lax cannot differentiate them; pbroadcast: XLA:CPU cannot lower lax's
NOT_ON_LAX = {"pmax": {"grad", "jvp", "remat_grad"}, "pmin": {"grad", "jvp", "remat_grad"}, "pbroadcast": "all"}


def _mesh(shape, names, types=(AUTO, AUTO)):
    use_runtime(int(np.prod(shape)))
    return jax.make_mesh(shape, names, axis_types=types, devices=jax.devices()[:int(np.prod(shape))])


def _transforms(smap):
    """test_transforms's programs, but eager and linearize (covered there for every op)."""
    return {name: make for name, make in transforms_of(smap).items() if name not in ("eager", "linearize")}


def _body(module, op, axis):
    def f(v):
        y = op(module, v, axis)
        return (jnp.sum(jnp.sin(y) * jnp.cos(y)) + jnp.sum(y))[None]
    return f


def _run_both(mesh, manual, op_name, transform, rng, x_spec=None, reference_mesh=None, tested=iris_jax):
    """(the iris program, its result, lax's result, x) of op `op_name` over `manual` under
    `transform`, in a shard_map that makes only `manual` manual; x is sharded over the other
    axis too (`x_spec`). lax runs on `reference_mesh` (default: the same mesh)."""
    (auto,) = [a for a in mesh.axis_names if a != manual]
    G = mesh.shape[manual]
    op = _ops(G)[op_name]
    shape = (2 * G * G * mesh.shape[auto], 2 * mesh.shape[auto]) + ((2,) if transform == "vmap" else ())
    values = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) / np.prod(shape) + 0.5

    def program(mesh, module, axis_names):
        x = jax.device_put(jnp.asarray(values), NamedSharding(mesh, x_spec or P(manual, auto)))
        smap = lambda f: jax.shard_map(f, mesh=mesh, in_specs=P(manual), out_specs=P(manual),  # noqa: E731
                                       axis_names=axis_names)
        return _transforms(smap)[transform](_body(module, op, manual)), x

    got, x = program(mesh, tested, {manual})
    reference = reference_mesh or mesh
    skip = NOT_ON_LAX.get(op_name, ())
    if skip == "all" or transform in skip:  # the reference: the same program in a fully manual shard_map
        want, x_ref = program(reference, iris_jax, set(mesh.axis_names))
    else:
        want, x_ref = program(reference, lax, {manual})
    return got, np.asarray(got(x)), np.asarray(want(x_ref)), x


def _check(mesh, manual, op_name, transform, rng, **kwargs):
    program, got, want, x = _run_both(mesh, manual, op_name, transform, rng, **kwargs)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{op_name} under {transform}")
    assert "iris_cpu_kernel" in program.lower(x).as_text(), f"{op_name} under {transform} did not run on iris"


# -- every op, on 2 x 2 and 2 x 4, the manual axis first or second -----------------------------
@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("manual", ["first", "second"])
@pytest.mark.parametrize("shape", [(2, 2), (2, 4)], ids=["2x2", "2x4"])
def test_every_op(shape, manual, op_name, rng):
    mesh = _mesh(shape, ("a", "b") if manual == "first" else ("b", "a"))  # "a" is manual
    _check(mesh, "a", op_name, "jit", rng)


# -- the transformations --------------------------------------------------------------------------
@pytest.mark.parametrize("transform", ["grad", "jvp", "vmap", "remat_grad", "scan"])
@pytest.mark.parametrize("op_name", OPS)
def test_transformations(op_name, transform, rng):
    _check(_mesh((2, 2), ("dp", "tp")), "tp", op_name, transform, rng)


@pytest.mark.parametrize("transform", ["grad", "vmap"])
@pytest.mark.parametrize("op_name", ["psum", "all_gather", "psum_scatter", "all_to_all"])
def test_transformations_2x4(op_name, transform, rng):
    _check(_mesh((2, 4), ("dp", "tp")), "tp", op_name, transform, rng)


# -- axis types ---------------------------------------------------------------------------------
TYPES = {"explicit": (EXPLICIT, EXPLICIT), "mixed_explicit_dp": (EXPLICIT, AUTO), "mixed_explicit_tp": (AUTO, EXPLICIT)}


@pytest.mark.parametrize("transform", ["jit", "grad"])
@pytest.mark.parametrize("op_name", ["psum", "pmax", "all_gather", "all_gather_untiled", "psum_scatter",
                                     "psum_scatter_untiled", "all_to_all", "ppermute"])
@pytest.mark.parametrize("dp_on", [0, 1])
@pytest.mark.parametrize("types", list(TYPES))
def test_axis_types(types, dp_on, op_name, transform, rng):
    """Explicit axes: the nested region's specs come from the operand's type (x sharded over
    dp on dimension `dp_on`; where an op gathers along it, that dimension is gathered first).
    The values must be lax's on the same devices with Auto axes (they do not depend on the axis
    types). With Explicit dp, JAX fails in several of these with lax's own collectives (0.10.2
    in lax's lowering, 0.12 in lax's abstract evaluation of a transpose): iris gives the values
    there or, where the failure is in lax's rules, which iris applies, the same error."""
    if transform == "grad" and op_name == "pmax":
        pytest.skip("lax cannot differentiate pmax (covered by test_transformations)")
    mesh = _mesh((2, 2), ("dp", "tp"), TYPES[types])
    spec = P(("tp", "dp")) if dp_on == 0 else P("tp", "dp")
    try:
        program, got, want, x = _run_both(mesh, "tp", op_name, transform, rng, x_spec=spec,
                                          reference_mesh=_mesh((2, 2), ("dp", "tp")))
    except Exception as e:  # noqa: BLE001
        with pytest.raises(type(e)):  # lax's own program on this mesh fails alike
            _run_both(mesh, "tp", op_name, transform, rng, x_spec=spec, tested=lax)
        return
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{op_name} under {transform}")
    assert "iris_cpu_kernel" in program.lower(x).as_text()


# -- meshes as users make them ---------------------------------------------------------------------
def _context(name, mesh):
    """(the context, whether shard_map is given mesh=); jax.set_mesh takes effect when called,
    so each is made only here. (jax.sharding.use_mesh, set_mesh's predecessor, is gone from
    every JAX release iris supports.)"""
    import contextlib

    return {"none": lambda: (contextlib.nullcontext(), True), "set_mesh": lambda: (jax.set_mesh(mesh), False),
            "set_mesh_and_mesh_argument": lambda: (jax.set_mesh(mesh), True),
            "legacy_with_mesh": lambda: (mesh, True)}[name]()


@pytest.mark.parametrize("manual", ["partially", "fully"])
@pytest.mark.parametrize("context", ["none", "set_mesh", "set_mesh_and_mesh_argument", "legacy_with_mesh"])
@pytest.mark.parametrize("types", ["auto", "explicit", "mixed"])
def test_mesh_contexts(types, context, manual, rng):
    mesh = _mesh((2, 2), ("dp", "tp"), {"auto": (AUTO, AUTO), "explicit": (EXPLICIT, EXPLICIT),
                                        "mixed": (EXPLICIT, AUTO)}[types])
    x = jax.device_put(jnp.asarray(rng.standard_normal((8, 4)), jnp.float32), NamedSharding(mesh, P("dp", "tp")))
    spec = P(None, "tp") if manual == "partially" else P("dp", "tp")
    ring = [(0, 1), (1, 0)]

    def run(m):
        ctx, mesh_argument = _context(context, mesh)
        kwargs = dict(mesh=mesh) if mesh_argument else {}
        if manual == "partially":
            kwargs["axis_names"] = {"tp"}
        body = lambda v: (m.psum(v, "tp"), m.ppermute(v, "tp", ring))  # noqa: E731
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # `with mesh:` is deprecated since jax 0.10.1
            with ctx:
                f = jax.jit(jax.shard_map(body, in_specs=spec, out_specs=(P(*spec[:-1]), spec), **kwargs))
                return [np.asarray(y) for y in f(x)], kernels(f.lower(x))

    (got, launched), (want, _) = run(iris_jax), run(lax)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6)
    assert launched == 2


def test_nested_shard_map_under_set_mesh(rng):
    """A shard_map over dp nested in one over tp (its mesh: the outer one's abstract mesh) finds
    its devices in jax.set_mesh's context; without a context iris says so."""
    mesh = _mesh((2, 2), ("dp", "tp"))
    x = jax.device_put(jnp.asarray(rng.standard_normal((8, 4)), jnp.float32), NamedSharding(mesh, P("dp", "tp")))

    def program(m):
        def inner(v):
            return m.psum(v, "tp") + m.psum(v, "dp")

        def body(v):
            return jax.shard_map(inner, in_specs=P("dp"), out_specs=P("dp"), axis_names={"dp"})(m.psum(v, "tp"))
        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"),
                                     axis_names={"tp"}))

    want = np.asarray(program(lax)(x))
    with jax.set_mesh(mesh):
        f = program(iris_jax)
        np.testing.assert_allclose(np.asarray(f(x)), want, rtol=1e-6)
        assert kernels(f.lower(x)) == 3
    with pytest.raises(iris_jax.IrisError, match="jax.set_mesh"):
        program(iris_jax)(x)


def kernels(lowered) -> int:
    return len(re.findall(r"iris_cpu_kernel_\d+", lowered.as_text()))


# -- no added communication: the compiled step of examples/08 --------------------------------------
def _example():
    """examples/08_tp_fsdp_transformer.py as a module (its setup leaves this process's JAX as it is)."""
    import importlib.util
    import os
    import sys

    from tests.jax.helpers import REPO

    examples = os.path.join(REPO, "examples")
    if examples not in sys.path:
        sys.path.insert(0, examples)
    spec = importlib.util.spec_from_file_location("tp_fsdp_example", os.path.join(examples, "08_tp_fsdp_transformer.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hlo_collectives(compiled) -> collections.Counter:
    """(kind, result type without layouts) of every XLA collective of a compiled program."""
    return collections.Counter((kind, re.sub(r"\{[^}]*\}", "", shape))
                               for shape, kind in HLO_COLLECTIVE.findall(compiled.as_text()))


@pytest.mark.parametrize("shape", [(2, 2), (2, 4)], ids=["2x2", "2x4"])
def test_compiled_step_adds_no_collective(shape):
    """A tensor-parallel (manual tp) + FSDP (automatic dp) training step: under
    replace_lax_collectives the compiled program has no XLA collective (by kind and result
    type) that lax's version of the step has not (the nested regions' specs match what XLA
    chose: no reshard), the tp collectives are iris kernels, and the values are lax's."""
    example = _example()
    mesh = _mesh(shape, ("dp", "tp"))
    B, S, D, heads, F = 4, 8, 16, 4, 32
    params = example.init(mesh, D, heads, F, jnp.float32)
    keys = jax.random.split(jax.random.key(1), 2)
    x, y = (jax.device_put(jax.random.normal(k, (B, S, D)), NamedSharding(mesh, example.BATCH)) for k in keys)
    step = lambda params, x, y: example.train_step(params, x, y, mesh)  # noqa: E731
    on_xla, on_iris = jax.jit(step), iris_jax.replace_lax_collectives(step)
    lowered_xla, lowered_iris = on_xla.lower(params, x, y), on_iris.lower(params, x, y)
    xla, iris = hlo_collectives(lowered_xla.compile()), hlo_collectives(lowered_iris.compile())
    assert not iris - xla, f"collectives iris's step has and lax's has not: {dict(iris - xla)} (lax's: {dict(xla)})"
    assert sum(xla.values()) > sum(iris.values())  # the tp ones left XLA
    # 2 all_gathers and 2 psum_scatters forward, the same backward, and the layer norms' psums (jax 0.12
    # merges those two into one launch)
    assert kernels(lowered_iris) >= 9
    (p_xla, loss_xla), (p_iris, loss_iris) = on_xla(params, x, y), on_iris(params, x, y)
    np.testing.assert_allclose(float(loss_iris), float(loss_xla), rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(np.asarray(p_iris[name]), np.asarray(p_xla[name]), rtol=1e-5, atol=1e-6)
    rows = iris_jax.explain(step, params, x, y)
    assert len(rows) == 10 and all(row.runs_on == "iris" and row.axes == ("tp",) for row in rows), rows


def test_replace_lax_collectives_at_any_depth(rng):
    """A lax program whose collectives sit in a nested jit, a cond, a remat and a scan inside a
    partially manual shard_map: every one on iris under replace_lax_collectives, lax's values."""
    mesh = _mesh((2, 2), ("dp", "tp"))
    x = jax.device_put(jnp.asarray(rng.standard_normal((8, 4)), jnp.float32), NamedSharding(mesh, P("dp", "tp")))

    @jax.jit
    def library(h):
        return lax.all_gather(h, "tp", axis=1, tiled=True)

    def body(v):
        g = library(v)
        c = lax.cond(jnp.sum(g) > 0, lambda a: lax.psum(a, "tp"), lambda a: -lax.psum(a, "tp"), v)
        r = jax.checkpoint(lambda a: lax.psum_scatter(a, "tp", scatter_dimension=0, tiled=True))(c)
        s, _ = lax.scan(lambda carry, _: (carry + lax.ppermute(carry, "tp", [(0, 1), (1, 0)]), None), r, None, length=2)
        return jnp.sum(g) + jnp.sum(s) + jnp.zeros_like(v)

    f = jax.shard_map(body, mesh=mesh, in_specs=P(None, "tp"), out_specs=P(None, "tp"), axis_names={"tp"})
    program = jax.grad(lambda x: jnp.sum(jnp.sin(f(x))))
    on_iris = iris_jax.replace_lax_collectives(program)
    # the gradient passes float32 sums of 32 terms through cos: their rounding, which follows how XLA
    # fused each program, reaches 1.4e-5 for some inputs (the random x depends on the tests run before)
    np.testing.assert_allclose(np.asarray(on_iris(x)), np.asarray(jax.jit(program)(x)), rtol=1e-4, atol=1e-6)
    rows = iris_jax.explain(program, x)
    assert rows and all(row.runs_on == "iris" for row in rows), rows
    assert kernels(on_iris.lower(x)) >= 5


@pytest.mark.parametrize("types", ["explicit", "mixed_explicit_dp"])
def test_compiled_step_adds_no_collective_explicit(types):
    """The same with an Explicit dp axis (the region's specs from the operands' types): a
    Megatron MLP (column- then row-parallel, psum over tp) on a dp-sharded batch, under grad."""
    mesh = _mesh((2, 2), ("dp", "tp"), TYPES[types])
    rng = np.random.default_rng(5)
    x = jax.device_put(rng.standard_normal((8, 16)).astype(np.float32), NamedSharding(mesh, P("dp")))
    w1 = jax.device_put(rng.standard_normal((16, 32)).astype(np.float32), NamedSharding(mesh, P(None, "tp")))
    w2 = jax.device_put(rng.standard_normal((32, 16)).astype(np.float32), NamedSharding(mesh, P("tp", None)))

    def loss(params, x):
        def layer(x, w1, w2):
            return lax.psum(jax.nn.relu(x @ w1) @ w2, "tp")
        y = jax.shard_map(layer, mesh=mesh, in_specs=(P(), P(None, "tp"), P("tp", None)), out_specs=P(),
                          axis_names={"tp"})(x, *params)
        return jnp.mean(y ** 2)

    program = jax.grad(loss)
    on_xla, on_iris = jax.jit(program), iris_jax.replace_lax_collectives(program)
    xla = hlo_collectives(on_xla.lower((w1, w2), x).compile())
    iris = hlo_collectives(on_iris.lower((w1, w2), x).compile())
    assert not iris - xla, f"collectives iris's step has and lax's has not: {dict(iris - xla)} (lax's: {dict(xla)})"
    assert kernels(on_iris.lower((w1, w2), x)) >= 1
    for a, b in zip(on_iris((w1, w2), x), on_xla((w1, w2), x)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-5)
