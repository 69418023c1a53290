"""replace_lax_collectives, explain, configs as values, and the cheap cases (CPU simulator).

What ran is read from the lowered program: on the simulator every iris kernel is a custom
call to `iris_cpu_kernel`, every XLA collective an `all_reduce` / `all_gather` / ... op.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import CollectiveConfig
from tests.jax.helpers import run_python, use_runtime

XLA_COLLECTIVES = re.compile(r"stablehlo\.(all_reduce|all_gather|reduce_scatter|all_to_all|collective_permute)")


def _mesh(shape=(4,), names=("i",)):
    use_runtime(4)
    return jax.make_mesh(shape, names, devices=jax.devices()[:4])


def _x(mesh, rng, shape=(8, 6), spec=None):
    return jax.device_put(jnp.asarray(rng.standard_normal(shape), jnp.float32), NamedSharding(mesh, spec or P("i")))


def kernels(lowered) -> int:
    return lowered.as_text().count("iris_cpu_kernel")


def xla_collectives(lowered) -> int:
    return len(XLA_COLLECTIVES.findall(lowered.as_text()))


# -- replace_lax_collectives ----------------------------------------------------------------
def _lax_program(mesh):
    """lax only: a psum inside scan, a gathered matmul under grad, a nested jit, a remat."""

    @jax.jit
    def library_layer(h, w):  # e.g. a library's own jitted code
        return lax.all_gather(h, "i", axis=0, tiled=True) @ w

    def body(x, w):
        def step(c, _):
            return c + lax.psum(jnp.sin(c), "i"), None

        y, _ = lax.scan(step, x, None, length=2)

        def loss(w):
            out = jax.checkpoint(library_layer)(y, w)
            return jnp.sum(lax.psum_scatter(out, "i", tiled=True) ** 2)

        return y, jax.grad(loss)(w)

    return jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P()), out_specs=(P("i"), P()))


def test_replaced_program_matches_lax_and_runs_only_iris_kernels(rng):
    mesh = _mesh()
    x, w = _x(mesh, rng), jax.device_put(jnp.asarray(rng.standard_normal((6, 8)), jnp.float32))
    program = _lax_program(mesh)
    replaced = iris_jax.replace_lax_collectives(program)
    want = jax.jit(program)(x, w)
    got = replaced(x, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5, atol=1e-5)
    lowered = replaced.lower(x, w)
    assert kernels(lowered) >= 4 and xla_collectives(lowered) == 0, lowered.as_text()
    # the original program, jitted on its own, still runs XLA's collectives (no stale cache)
    plain = jax.jit(program).lower(x, w)
    assert kernels(plain) == 0 and xla_collectives(plain) >= 4


def test_replaced_program_under_transformations(rng):
    mesh = _mesh()
    x, w = _x(mesh, rng), jax.device_put(jnp.asarray(rng.standard_normal((6, 8)), jnp.float32))
    program = _lax_program(mesh)
    loss = lambda f: lambda x, w: jnp.sum(f(x, w)[0] ** 2)  # noqa: E731
    replaced = iris_jax.replace_lax_collectives(program)
    want = jax.jit(jax.grad(loss(program)))(x, w)
    got = jax.jit(jax.grad(loss(replaced)))(x, w)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5)
    assert xla_collectives(jax.jit(jax.grad(loss(replaced))).lower(x, w)) == 0


def test_every_input_lax_takes_runs_on_iris(rng):
    """int8 (carried by the kernels as it is) and axis_index_groups of unequal sizes (a psum over
    groups, which lax takes inside shard_map only with check_vma=False) run on iris like the rest;
    groups of one member only (nothing to send) stay XLA's, which removes them."""
    mesh = _mesh()
    x = _x(mesh, rng)

    def body(v):
        small = lax.psum(v.astype(jnp.int8), "i")
        grouped = lax.psum(v, "i", axis_index_groups=[[0], [1, 2, 3]])
        alone = lax.psum(v, "i", axis_index_groups=[[0], [1], [2], [3]])
        return lax.psum(v, "i") + small.astype(jnp.float32) + grouped + alone

    program = jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False)
    replaced = iris_jax.replace_lax_collectives(program)
    np.testing.assert_array_equal(np.asarray(replaced(x)), np.asarray(jax.jit(program)(x)))
    lowered = replaced.lower(x)
    assert kernels(lowered) == 3 and xla_collectives(lowered) == 1
    rows = iris_jax.explain(program, x)
    assert [(r.op, r.runs_on) for r in rows] == [("psum", "iris"), ("psum", "iris"), ("psum", "XLA"),
                                                 ("psum", "iris")]
    assert "one member" in rows[2].why


def test_explain_table(rng):
    mesh = _mesh()
    x = _x(mesh, rng)
    rows = iris_jax.explain(_lax_program(mesh), x, jax.device_put(jnp.ones((6, 8), jnp.float32)))
    assert {r.op for r in rows} >= {"psum", "all_gather", "psum_scatter"}
    assert all(r.runs_on == "iris" for r in rows)
    text = "\n".join(map(str, rows))
    assert "float32" in text and "iris" in text


# -- cheap cases ------------------------------------------------------------------------------
def test_axis_of_size_one_and_zero_size_launch_nothing(rng):
    mesh = _mesh((4, 1), ("i", "one"))
    x = _x(mesh, rng)
    f = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "one") + iris_jax.all_gather(v, "one", tiled=True),
                              mesh=mesh, in_specs=P("i"), out_specs=P(("i", "one"))))
    assert kernels(f.lower(x)) == 0
    np.testing.assert_allclose(np.asarray(f(x)), 2 * np.asarray(x), rtol=1e-6)
    empty = jax.device_put(jnp.zeros((4, 0), jnp.float32), NamedSharding(mesh, P("i")))
    g = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    assert kernels(g.lower(empty)) == 0 and g(empty).shape == (1, 0)


def test_pytree_is_one_launch_per_dtype(rng):
    mesh = _mesh()
    x = _x(mesh, rng)
    tree = lambda v: {"a": v, "b": v[:, :2] * 3, "c": (v * 2).astype(jnp.bfloat16), "d": (v > 0)}  # noqa: E731

    def run(m):
        return jax.jit(jax.shard_map(lambda v: m.psum(tree(v), "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    assert kernels(run(iris_jax).lower(x)) == 3  # float32 (a, b), bfloat16 (c), int32 (d, a bool summed)
    got, want = run(iris_jax)(x), run(lax)(x)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k], np.float32), np.asarray(want[k], np.float32), rtol=1e-2)
    floats = lambda v: {k: a for k, a in tree(v).items() if k != "d"}  # noqa: E731  (all_gather takes no bool)
    gathered = jax.jit(jax.shard_map(lambda v: iris_jax.all_gather(floats(v), "i", axis=1), mesh=mesh,
                                     in_specs=P("i"), out_specs=P("i")))
    assert kernels(gathered.lower(x)) == 2


# -- configuration ------------------------------------------------------------------------------
def test_config_is_part_of_the_trace(rng):
    """The config travels in the traced program; a jitted function called under another
    use_config retraces (jit's cache key holds it), so no config is silently ignored."""
    mesh = _mesh()
    x = _x(mesh, rng)
    program = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    ring = CollectiveConfig(variant="ring", timeout_s=7.0)
    assert "variant='ring'" not in str(jax.make_jaxpr(program)(x))
    program(x)
    traces = program._cache_size()
    with iris_jax.use_config(ring):
        assert "variant='ring'" in str(jax.make_jaxpr(program)(x))
        np.testing.assert_allclose(np.asarray(program(x)), np.asarray(jax.jit(
            jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)), rtol=1e-5)
    assert program._cache_size() == traces + 1  # retraced for the ring config
    program(x)  # the default config again: its trace is cached
    assert program._cache_size() == traces + 1
    explicit = jax.make_jaxpr(jax.shard_map(lambda v: iris_jax.psum(v, "i", config=ring), mesh=mesh,
                                            in_specs=P("i"), out_specs=P("i")))(x)
    assert "variant='ring'" in str(explicit) and "timeout_s=7.0" in str(explicit)
    replaced = iris_jax.replace_lax_collectives(
        jax.shard_map(lambda u: lax.psum(u, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")), config=ring)
    assert "variant='ring'" in str(jax.make_jaxpr(replaced)(x))


def test_config_validation_and_environment():
    with pytest.raises(ValueError, match="unknown all_reduce variant 'three_shot'"):
        CollectiveConfig(variant="three_shot")
    with pytest.raises(ValueError, match="block must be a power of two"):
        CollectiveConfig(block=1000)
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_PUSH_FROM='16M': expected a byte count"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_PUSH_FROM": "16M"})
    cfg = CollectiveConfig.from_env({"IRIS_COLLECTIVE_TIMEOUT": "5", "IRIS_COLLECTIVE_STREAM_UNTIL": "0"})
    assert (cfg.timeout_s, cfg.stream_until, cfg.variant) == (5.0, 0, "auto")
    assert hash(cfg) == hash(CollectiveConfig(timeout_s=5.0, stream_until=0))


def test_example_runs_unchanged():
    result = run_python(["examples/07_replace_lax_collectives.py"], timeout=600,
                        XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stdout
    assert "same loss and parameters on iris and on XLA" in result.stdout, result.stdout


def test_partially_manual_shard_map_runs_on_iris(rng):
    """Collectives over the manual axis of a partially manual shard_map run as iris kernels
    (tests/jax/test_partially_manual.py has the matrix), without a warning."""
    import warnings

    mesh = _mesh((2, 2), ("dp", "tp"))
    x = _x(mesh, rng, spec=P("dp", "tp"))

    def program(m):
        return jax.jit(jax.shard_map(lambda v: m.psum(v, "tp"), mesh=mesh, in_specs=P(None, "tp"), out_specs=P(),
                                     axis_names={"tp"}))

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = np.asarray(program(iris_jax)(x))
    np.testing.assert_allclose(got, np.asarray(program(lax)(x)), rtol=1e-6)
    assert kernels(program(iris_jax).lower(x)) == 1 and xla_collectives(program(iris_jax).lower(x)) == 0
    (row,) = iris_jax.explain(program(lax), x)
    assert row.runs_on == "iris", row


def test_swapping_by_assignment(monkeypatch):
    """`jax.lax.psum = iris_jax.psum` (and the others) works: iris calls lax's functions where
    they are defined, not through jax.lax, so it does not call itself."""
    use_runtime(4)
    mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    x = jax.device_put(np.arange(4 * 6, dtype=np.float32).reshape(4, 6), NamedSharding(mesh, P("i")))
    f = jax.jit(jax.shard_map(lambda v: (jax.lax.psum(v, "i"), jax.lax.all_gather(v, "i", tiled=True),
                                         jax.lax.ppermute(v, "i", [(k, (k + 1) % 4) for k in range(4)])),
                              mesh=mesh, in_specs=P("i"), out_specs=(P(), P("i"), P("i"))))
    want = [np.asarray(a) for a in f(x)]
    for name in ("psum", "all_gather", "ppermute"):
        monkeypatch.setattr(jax.lax, name, getattr(iris_jax, name))
    f = jax.jit(jax.shard_map(lambda v: (jax.lax.psum(v, "i"), jax.lax.all_gather(v, "i", tiled=True),
                                         jax.lax.ppermute(v, "i", [(k, (k + 1) % 4) for k in range(4)])),
                              mesh=mesh, in_specs=P("i"), out_specs=(P(), P("i"), P("i"))))
    assert "iris_collective" in str(jax.make_jaxpr(f)(x))
    for got, expected in zip(f(x), want):
        np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("name", ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all",
                                  "ppermute", "pshuffle", "pswapaxes", "pbroadcast"])
def test_signatures_are_lax_s(name):
    """Each iris collective takes lax's parameters on this JAX, by the same names, kinds and
    defaults, in the same order (iris's own, such as config=, keyword-only after them)."""
    import inspect

    from iris_jax.compat import lax_parallel

    ours = list(inspect.signature(getattr(iris_jax, name)).parameters.values())
    theirs = list(inspect.signature(getattr(lax_parallel, name)).parameters.values())
    assert [(p.name, p.kind, p.default) for p in ours[:len(theirs)]] == \
        [(p.name, p.kind, p.default) for p in theirs]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in ours[len(theirs):])


def test_all_gather_to_invarying_as_lax():
    use_runtime(4)
    mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    x = jax.device_put(np.arange(4 * 5, dtype=np.float32).reshape(4, 5), NamedSharding(mesh, P("i")))
    outs = {}
    for name, gather in (("lax", lax.all_gather), ("iris", iris_jax.all_gather)):
        f = jax.jit(jax.shard_map(lambda v, gather=gather: gather(v, "i", tiled=True, to="invarying"), mesh=mesh,
                                  in_specs=P("i"), out_specs=P()))  # invarying: replicated, P() type-checks
        outs[name] = np.asarray(f(x))
        if name == "iris":
            assert "iris_collective" in str(jax.make_jaxpr(f)(x))
    np.testing.assert_array_equal(outs["iris"], outs["lax"])
    np.testing.assert_array_equal(outs["iris"], np.arange(20, dtype=np.float32).reshape(4, 5))
