"""iris_jax collectives in real programs: gradients, pytrees, loops, several collectives in
one jit mixed with other work (CPU simulator).

Gradients are taken through losses that are not linear in the collective's output, so
the backward collective depends on the forward one (see test_collectives.after for why
independent iris calls in one jit must be avoided on the simulator).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax.test_collectives import BF16, F32, I32, mesh_of, rand, shard

G = 4
PARTIAL = [(i, i + 1) for i in range(G - 1)]  # member 0 receives nothing
GRAD_CASES = {
    # name: (per-device input shape, iris op, lax op)
    "psum": ((3, 37), lambda v: iris_jax.psum(v, "i"), lambda v: lax.psum(v, "i")),
    "psum_two_shot": ((3, 37), lambda v: iris_jax.psum(v, "i", variant="two_shot"), lambda v: lax.psum(v, "i")),
    "all_gather": ((3, 37), lambda v: iris_jax.all_gather(v, "i", axis=1), lambda v: lax.all_gather(v, "i", axis=1)),
    "all_gather_tiled": ((3, 37), lambda v: iris_jax.all_gather(v, "i", axis=1, tiled=True),
                         lambda v: lax.all_gather(v, "i", axis=1, tiled=True)),
    "psum_scatter": ((3, 2 * G), lambda v: iris_jax.psum_scatter(v, "i", scatter_dimension=1, tiled=True),
                     lambda v: lax.psum_scatter(v, "i", scatter_dimension=1, tiled=True)),
    "psum_scatter_untiled": ((G, 37), lambda v: iris_jax.psum_scatter(v, "i"), lambda v: lax.psum_scatter(v, "i")),
    "all_to_all": ((2 * G, 37), lambda v: iris_jax.all_to_all(v, "i", 0, 1, tiled=True),
                   lambda v: lax.all_to_all(v, "i", 0, 1, tiled=True)),
    # lax cannot differentiate an untiled all_to_all whose split and concat axes differ (its
    # transpose gives the cotangent the wrong shape): the reference gathers instead
    "all_to_all_untiled": ((3, G, 5), lambda v: iris_jax.all_to_all(v, "i", 1, 0),
                           lambda v: jnp.take(lax.all_gather(v, "i"), lax.axis_index("i"), axis=2)),
    "ppermute": ((3, 37), lambda v: iris_jax.ppermute(v, "i", PARTIAL), lambda v: lax.ppermute(v, "i", PARTIAL)),
}


def _grad(mesh, op, check_vma):
    """x, w -> d/dx sum over devices of sum(sin(op(x)) * w)."""
    def body(x, w):
        y = op(x[0])
        return (jnp.sin(y) * w[0].reshape(y.shape))[None]

    f = jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=P("i"), check_vma=check_vma)
    return jax.jit(jax.grad(lambda x, w: jnp.sum(f(x, w))))


@pytest.mark.parametrize("check_vma", [True, False], ids=["check_vma", "no_check_vma"])
@pytest.mark.parametrize("name", list(GRAD_CASES))
def test_gradient_matches_lax(name, check_vma, rng):
    shape, iris_op, lax_op = GRAD_CASES[name]
    mesh = mesh_of((G,), ("i",))
    x = shard(mesh, rand(rng, (G, *shape), F32))
    # the output's shape, from lax, for the weights
    out_shape = jax.eval_shape(jax.shard_map(lambda v: lax_op(v[0])[None], mesh=mesh, in_specs=P("i"),
                                             out_specs=P("i"), check_vma=False), x).shape
    w = shard(mesh, rand(rng, out_shape, F32))
    got = _grad(mesh, iris_op, check_vma)(x, w)
    want = _grad(mesh, lax_op, check_vma)(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)


def test_gradient_inside_shard_map(rng):
    """jax.grad taken inside the shard_map body, of a per-device loss."""
    mesh = mesh_of((G,), ("i",))
    x = shard(mesh, rand(rng, (G, 37), F32))

    def per_device(ps, gather):
        def loss(v):
            s = ps(v, "i")
            g = gather(jnp.sin(s) * v, "i")
            return jnp.sum(jnp.cos(g))

        return lambda v: jax.grad(loss)(v[0])[None]

    run = lambda ps, gather: np.asarray(jax.jit(jax.shard_map(per_device(ps, gather), mesh=mesh, in_specs=P("i"),
                                                              out_specs=P("i"), check_vma=False))(x))
    np.testing.assert_allclose(run(iris_jax.psum, iris_jax.all_gather), run(lax.psum, lax.all_gather),
                               rtol=1e-5, atol=1e-5)


def test_psum_of_a_pytree(rng):
    """A dict of arrays of three dtypes (and a scalar), like lax.psum; leaves stay small, see
    test_collectives_errors.py::test_independent_collectives_in_one_jit."""
    mesh = mesh_of((3,), ("i",))
    tree = {"a": shard(mesh, rand(rng, (3, 37), F32)), "b": shard(mesh, rand(rng, (3, 3, 5), I32)),
            "c": [shard(mesh, rand(rng, (3,), BF16)), shard(mesh, rand(rng, (3, 0), F32))]}

    def run(ps):
        f = jax.jit(jax.shard_map(lambda t: ps(jax.tree.map(lambda v: v[0], t), "i"), mesh=mesh, in_specs=P("i"),
                                  out_specs=P()))
        return jax.device_get(f(tree))

    got, want = run(iris_jax.psum), run(lax.psum)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=1e-2 if
                                   g.dtype == jnp.bfloat16 else 1e-6)


def test_pytrees_through_the_other_collectives(rng):
    mesh = mesh_of((2,), ("i",))
    tree = (shard(mesh, rand(rng, (2, 4, 3), F32)), shard(mesh, rand(rng, (2, 2), I32)))

    def run(mod):
        def body(t):
            t = jax.tree.map(lambda v: v[0], t)
            a = mod.all_gather(t, "i")
            b = mod.psum_scatter(jax.tree.map(lambda v, x: x + jnp.sum(v).astype(x.dtype), a, t), "i", tiled=True)
            c = mod.all_to_all(jax.tree.map(lambda x, y: x * 2 + jnp.sum(y).astype(x.dtype), t, b), "i", 0, 0,
                               tiled=True)
            d = mod.ppermute(jax.tree.map(lambda x, y: x + jnp.sum(y).astype(x.dtype), t, c), "i", [(0, 1), (1, 0)])
            return jax.tree.map(lambda v: v[None], (a, b, c, d))

        return jax.device_get(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(tree))

    got, want = run(iris_jax), run(lax)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)


def test_500_psums_in_a_scan(rng):
    """x <- psum(x) / G + rank, 500 times in lax.scan: no deadlock, no drift from lax."""
    mesh = mesh_of((2,), ("i",))
    x = shard(mesh, rand(rng, (2, 5), F32))

    def run(ps):
        def body(v):
            rank = lax.axis_index("i").astype(v.dtype)
            step = lambda c, _: (ps(c, "i") / 2 + rank, None)
            return lax.scan(step, v, None, length=500)[0]

        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                                check_vma=False))(x))

    got, want = run(iris_jax.psum), run(lax.psum)
    np.testing.assert_array_equal(got, want)  # two members: a + b rounds the same in either order
    mean = np.asarray(x).mean(0) + 500 * 0.5  # the fixed point drifts by mean(rank) per step
    np.testing.assert_allclose(got, np.stack([mean - 0.5, mean + 0.5]), rtol=1e-4)


def test_fori_loop_of_several_collectives(rng):
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 6, 5), F32))

    def run(mod):
        def body(v):
            v = v[0]

            def step(_, c):
                s = mod.psum(c, "i") / 3
                g = mod.all_gather(s[:2], "i", tiled=True)  # (6, 5)
                return mod.psum_scatter(g * 0.5 + c, "i", tiled=True).repeat(3, axis=0) / 3

            return lax.fori_loop(0, 20, step, v)[None]

        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                                check_vma=False))(x))

    np.testing.assert_allclose(run(iris_jax), run(lax), rtol=1e-5, atol=1e-6)


def test_psum_then_all_gather_in_one_jit(rng):
    mesh = mesh_of((4,), ("i",))
    x = shard(mesh, rand(rng, (4, 37), F32))

    def run(mod):
        body = lambda v: mod.all_gather(mod.psum(v[0], "i") * v[0], "i")[None]
        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x))

    np.testing.assert_allclose(run(iris_jax), run(lax), rtol=1e-5, atol=1e-6)


def test_collectives_interleaved_with_other_work(rng):
    """Matmuls, reductions and elementwise work between collectives, on a 2x2 mesh over
    both axes, with the results of one feeding the next."""
    mesh = mesh_of((2, 2), ("x", "y"))
    x = shard(mesh, rand(rng, (2, 2, 8, 8), F32))
    w = rand(rng, (8, 8), F32)

    def run(mod):
        def body(v):
            v = v[0, 0]
            h = jnp.tanh(v @ w)
            h = mod.psum(h, "x") / 2
            h = h @ w.T + jnp.mean(h, axis=0, keepdims=True)
            g = mod.all_gather(h, "y", axis=1, tiled=True)  # (8, 16)
            g = jax.nn.relu(g) - jnp.max(g)
            g = lax.pcast(g, ("x",), to="varying")  # lax.psum_scatter over x needs an x-varying input
            s = mod.psum_scatter(g, ("x", "y"), scatter_dimension=1, tiled=True)  # (8, 4)
            s = jnp.cumsum(s, axis=0)
            t = mod.all_to_all(s, "x", 0, 1, tiled=True)  # (4, 8)
            t = mod.ppermute(t * 2, "y", [(0, 1), (1, 0)])
            return (mod.pmax(t, ("x", "y")) + t)[None, None]

        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y")))(x))

    np.testing.assert_allclose(run(iris_jax), run(lax), rtol=1e-5, atol=1e-5)
