"""Every iris collective under every JAX transformation, against lax (CPU simulator).

The op x transformation matrix: psum, pmean, pmax, pmin, all_gather, psum_scatter,
all_to_all, ppermute, pbroadcast under jit, grad, jvp, linearize, vmap, remat + grad, scan,
eager shard_map; on 1-D meshes of 2, 3 and 4 ranks and over each axis and the tuple of axes
of a 2 x 2 mesh. The body is nonlinear in the collective's output (sin * cos), so gradients
run the collective's transpose on data that depends on the forward result. References: the
same body with jax.lax; where lax has no rule or no CPU lowering (pmax/pmin derivatives,
pbroadcast), the same op written with lax.all_gather (whose max shares the derivative
among ties, as iris's pmax does).
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


def _ops(G):
    ring = [(i, (i + 1) % G) for i in range(G)]
    gathered = lambda v, a: lax.all_gather(v, a, axis=0)  # noqa: E731
    return {
        # name: (iris op, reference op), each f(v, axes)
        "psum": (iris_jax.psum, lax.psum),
        "pmean": (iris_jax.pmean, lax.pmean),
        "pmax": (iris_jax.pmax, lambda v, a: jnp.max(gathered(v, a), axis=0)),
        "pmin": (iris_jax.pmin, lambda v, a: jnp.min(gathered(v, a), axis=0)),
        "all_gather": (lambda v, a: iris_jax.all_gather(v, a, axis=1, tiled=True),
                       lambda v, a: lax.all_gather(v, a, axis=1, tiled=True)),
        "psum_scatter": (lambda v, a: iris_jax.psum_scatter(v, a, scatter_dimension=0, tiled=True),
                         lambda v, a: lax.psum_scatter(v, a, scatter_dimension=0, tiled=True)),
        "all_to_all": (lambda v, a: iris_jax.all_to_all(v, a, 0, 0, tiled=True),
                       lambda v, a: lax.all_to_all(v, a, 0, 0, tiled=True)),
        "ppermute": (lambda v, a: iris_jax.ppermute(v, a, ring), lambda v, a: lax.ppermute(v, a, ring)),
        "pbroadcast": (lambda v, a: iris_jax.pbroadcast(v, a, G - 1), lambda v, a: gathered(v, a)[G - 1]),
    }


OPS = list(_ops(2))


def _transforms(smap):
    """name -> (make the program from a per-device body, input shape change)"""
    def scan(f):
        def body(v):
            step = lambda c, _: (c + jnp.sum(f(v + c[0])), None)  # noqa: E731
            return lax.scan(step, v[:1, 0] * 0, None, length=2)[0]
        return jax.jit(smap(body))

    return {
        "jit": lambda f: jax.jit(smap(f)),
        "eager": lambda f: smap(f),
        "grad": lambda f: jax.jit(jax.grad(lambda x: smap(f)(x).sum())),
        "jvp": lambda f: jax.jit(lambda x: jax.jvp(smap(f), (x,), (jnp.cos(x),))[1]),
        "linearize": lambda f: jax.jit(lambda x: jax.linearize(smap(f), x)[1](jnp.sin(x))),
        "vmap": lambda f: jax.jit(jax.vmap(smap(f), in_axes=2, out_axes=1)),
        "remat_grad": lambda f: jax.jit(jax.grad(lambda x: smap(jax.checkpoint(f))(x).sum())),
        "scan": scan,
    }


TRANSFORMS = list(_transforms(None))


def _body(op, axes):
    def f(v):
        y = op(v, axes)
        return (jnp.sum(jnp.sin(y) * jnp.cos(y)) + jnp.sum(y))[None]
    return f


def _check(mesh, axes, op_name, transform, rng, rows_per_device=2):
    G = int(np.prod([mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,))]))
    iris_op, ref_op = _ops(G)[op_name]
    names = tuple(mesh.axis_names)
    spec = P(names)
    devices = mesh.devices.size
    shape = (devices * rows_per_device * G, 3) + ((2,) if transform == "vmap" else ())
    # distinct values (no ties), so pmax/pmin derivatives are well defined
    values = rng.permutation(np.prod(shape)).reshape(shape).astype(np.float32) / np.prod(shape) + 0.5
    x = jax.device_put(jnp.asarray(values), NamedSharding(mesh, spec))
    smap = lambda f: jax.shard_map(f, mesh=mesh, in_specs=spec, out_specs=spec)  # noqa: E731
    make = _transforms(smap)[transform]
    got = np.asarray(make(_body(iris_op, axes))(x))
    want = np.asarray(make(_body(ref_op, axes))(x))
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5, err_msg=f"{op_name} under {transform}")


@pytest.mark.parametrize("transform", TRANSFORMS)
@pytest.mark.parametrize("op_name", OPS)
def test_matrix_world_4(op_name, transform, rng):
    use_runtime(4)
    _check(jax.make_mesh((4,), ("i",), devices=jax.devices()[:4]), "i", op_name, transform, rng)


@pytest.mark.parametrize("transform", ["jit", "grad", "jvp", "vmap"])
@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("W", [2, 3])
def test_matrix_worlds_2_and_3(W, op_name, transform, rng):
    use_runtime(W)
    _check(jax.make_mesh((W,), ("i",), devices=jax.devices()[:W]), "i", op_name, transform, rng)


@pytest.mark.parametrize("transform", ["jit", "grad", "jvp", "vmap"])
@pytest.mark.parametrize("op_name", OPS)
@pytest.mark.parametrize("axes", ["x", "y", ("x", "y")], ids=["x", "y", "xy"])
def test_matrix_2d_mesh(axes, op_name, transform, rng):
    use_runtime(4)
    _check(jax.make_mesh((2, 2), ("x", "y"), devices=jax.devices()[:4]), axes, op_name, transform, rng)


# -- control flow and custom derivatives --------------------------------------------------------
def _mesh4():
    use_runtime(4)
    return jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])


def _x(mesh, rng, shape=(8, 5)):
    return jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), NamedSharding(mesh, P("i")))


def _both(mesh, body, x, **kwargs):
    """body(collectives module-like namespace) run with iris and with lax, jitted."""
    run = lambda m: np.asarray(jax.jit(jax.shard_map(body(m), mesh=mesh, in_specs=P("i"), out_specs=P("i"),  # noqa: E731
                                                      **kwargs))(x))
    return run(iris_jax), run(lax)


def test_cond_and_while(rng):
    mesh = _mesh4()

    def body(m):
        def f(v):
            uniform = m.psum(jnp.sum(v), "i") > 0  # every member takes the same branch
            v = lax.cond(uniform, lambda u: m.psum(u, "i"), lambda u: m.pmax(u, "i") * 2, v)
            return lax.while_loop(lambda c: c[1] < 3, lambda c: (m.pmean(c[0] * 1.5, "i"), c[1] + 1), (v, 0))[0]
        return f

    got, want = _both(mesh, body, _x(mesh, rng))
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_inside_custom_vjp_and_custom_jvp(rng):
    """Collectives inside custom_vjp's fwd/bwd and custom_jvp's rule, differentiated."""
    mesh = _mesh4()

    def make(m):
        @jax.custom_vjp
        def f(v):
            return m.psum(v, "i")

        f.defvjp(lambda v: (m.psum(v, "i"), v), lambda v, ct: (m.all_gather(ct, "i", tiled=True)[: v.shape[0]] + v,))

        @jax.custom_jvp
        def g(v):
            return jnp.sin(m.pmean(v, "i"))

        g.defjvp(lambda p, t: (g(p[0]), jnp.cos(m.pmean(p[0], "i")) * m.pmean(t[0], "i")))

        def loss(v):
            return jnp.sum(f(v) * g(v))

        return lambda v: jax.grad(loss)(v)

    got, want = _both(mesh, make, _x(mesh, rng))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_no_check_vma(rng):
    """check_vma=False: psum's transpose is a psum again (lax's semantics without types)."""
    mesh = _mesh4()

    def body(m):
        return lambda v: jax.grad(lambda u: jnp.sum(jnp.sin(m.psum(u, "i"))))(v)

    got, want = _both(mesh, body, _x(mesh, rng), check_vma=False)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_pmax_derivative_against_finite_differences(rng):
    mesh = _mesh4()
    x = _x(mesh, rng, (8, 3))
    f = jax.jit(jax.shard_map(lambda v: jnp.sum(jnp.sin(iris_jax.pmax(v, "i")))[None], mesh=mesh,
                              in_specs=P("i"), out_specs=P("i")))
    direction = jax.device_put(jnp.asarray(rng.standard_normal((8, 3)), jnp.float32), x.sharding)
    _, tangent = jax.jvp(f, (x,), (direction,))
    eps = 1e-3
    numeric = (np.asarray(f(x + eps * direction)) - np.asarray(f(x - eps * direction))) / (2 * eps)
    np.testing.assert_allclose(np.asarray(tangent), numeric, rtol=1e-2, atol=1e-3)


def test_bool_psum_counts_as_int32(rng):
    mesh = _mesh4()
    got, want = _both(mesh, lambda m: (lambda v: m.psum(v > 0, "i")), _x(mesh, rng))
    assert got.dtype == want.dtype == np.int32
    np.testing.assert_array_equal(got, want)



@pytest.mark.parametrize("mode", ["kernels", "host"])
@pytest.mark.parametrize("transform", ["jit", "grad", "jvp", "remat_grad", "scan"])
@pytest.mark.parametrize("op_name", ["psum", "pbroadcast"])
def test_rewritten_jaxprs_carry_the_kernel_effect(op_name, transform, mode):
    """Every equation and jaxpr that holds an iris kernel carries its effect (JAX's type check,
    jax_enable_checks, compares them): also the jaxprs that the rewrite put kernels into after
    they were traced with lax's collectives (replace_lax_collectives over jit, scan, remat, and
    the transposes' own jaxprs), so the effect reaches the program. The simulator's collectives
    on the host run no kernel: then nothing carries it, and the program type-checks as well."""
    from jax._src import core

    from iris_jax.calls.triton_call import iris_kernel_effect

    use_runtime(4, sim_collectives=mode)
    mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4], axis_types=(jax.sharding.AxisType.Explicit,))
    smap = lambda f: jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i"))  # noqa: E731
    lax_op = _ops(4)[op_name][1]
    body = _body(lambda v, a: jax.jit(lax_op, static_argnums=1)(v, a), "i")  # a jit around lax's collective
    program = iris_jax.replace_lax_collectives(_transforms(smap)[transform](body))
    x = jax.device_put(jnp.ones((8, 3), jnp.float32), NamedSharding(mesh, P("i")))
    closed = jax.make_jaxpr(program)(x)
    core.check_jaxpr(closed.jaxpr)
    assert (iris_kernel_effect in closed.effects) == (mode == "kernels")
