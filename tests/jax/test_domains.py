"""Domains on the simulator: ranks split by `init(domain_size=...)`, collectives over axes
that span domains composed from iris inside them and XLA across (iris_jax.collectives.domains): psum,
pmean, pmax, all_gather, psum_scatter, all_to_all and pbroadcast against lax, under jit,
grad, vmap and jvp.

Meshes of 2x2 and 2x4 CPU devices with the domain boundary on either axis: `layout`
"node" puts consecutive ranks along the "gpu" axis (so "gpu" stays inside a domain and
"node" crosses), "gpu" the transpose. A spy on the group table checks that no iris kernel
is ever lowered over a group that spans domains.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import CollectiveConfig
from iris_jax.calls import operands
from tests.jax.helpers import use_runtime
from tests.jax.test_replace_lax import kernels, xla_collectives

BOTH = ("node", "gpu")
WORLD = 8  # every test on one runtime of 8 ranks (one pool of simulator workers); 2x2 meshes use 4 of them
SCATTERED = CollectiveConfig(scatter_hierarchy_from=0)  # psum as psum_scatter / psum / all_gather


def domain_mesh(shape, boundary: str, domain_size: int) -> Mesh:
    """A ("node", "gpu") mesh whose `boundary` axis crosses domains of `domain_size` ranks."""
    n = shape[0] * shape[1]
    use_runtime(WORLD, domain_size=domain_size)
    devices = np.array(jax.devices()[:n])
    grid = devices.reshape(shape) if boundary == "node" else devices.reshape(shape[::-1]).T
    return Mesh(grid, BOTH)


CASES = {  # id: (mesh shape, axis that crosses domains, ranks per domain)
    "2x2-node": ((2, 2), "node", 2),
    "2x2-gpu": ((2, 2), "gpu", 2),
    "2x4-node": ((2, 4), "node", 4),
    "2x4-gpu": ((2, 4), "gpu", 2),
}


@pytest.fixture
def groups(monkeypatch):
    """Every group an iris kernel is lowered for (ranks of its members), checked to lie in one
    domain."""
    seen = []
    real = operands.group_table

    def spy(ctx, group_axes, *rest):
        table = real(ctx, group_axes, *rest)
        rt = iris_jax.runtime()
        for row in table:
            members = [int(r) for r in row[1:-2]]
            assert len({rt.domain_of(r) for r in members}) == 1, f"kernel over {group_axes} spans domains: {members}"
            seen.append(tuple(members))
        return table

    monkeypatch.setattr(operands, "group_table", spy)
    return seen


def sharded(mesh, rng, shape, dtype=jnp.float32):
    x = rng.standard_normal(shape) * 4
    return jax.device_put(jnp.asarray(x, dtype), NamedSharding(mesh, P(BOTH)))


def every_collective(lib, config=None):
    """One of each supported collective over both axes (in both tuple orders), and over each."""
    kw = {} if lib is lax else {"config": config}

    def f(x):
        return (lib.psum(x, BOTH, **kw), lib.psum(x, BOTH[::-1], **kw), lib.pmean(x, BOTH, **kw),
                lib.pmax(x, BOTH[::-1], **kw), lib.psum(x, "node", **kw), lib.psum(x, "gpu", **kw),
                lib.all_gather(x, BOTH, axis=1, tiled=True, **kw), lib.all_gather(x, BOTH[::-1], **kw),
                lib.psum_scatter(x, BOTH, scatter_dimension=0, tiled=True, **kw),
                lib.psum_scatter(x, BOTH[::-1], scatter_dimension=1, tiled=True, **kw),
                lib.all_to_all(x, BOTH, 0, 0, tiled=True, **kw), lib.all_to_all(x, BOTH[::-1], 1, 0, tiled=True, **kw))

    return f


def run(mesh, f, x):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH)))(x)


@pytest.mark.parametrize("case", list(CASES))
def test_collectives_equal_lax(case, groups):
    shape, boundary, domain_size = CASES[case]
    mesh = domain_mesh(shape, boundary, domain_size)
    n = shape[0] * shape[1]
    x = sharded(mesh, np.random.default_rng(0), (n * n, 2 * n))
    config = SCATTERED if case.startswith("2x4") else None  # both psum compositions, one per mesh size
    got, want = run(mesh, every_collective(iris_jax, config), x), run(mesh, every_collective(lax), x)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-4)
    assert groups, "no iris kernel ran"
    inside = "gpu" if boundary == "node" else "node"
    assert len(set(groups[0])) == mesh.shape[inside]


@pytest.mark.parametrize("case", ["2x2-node", "2x4-gpu"])
def test_grad_equals_lax(case, groups):
    shape, boundary, domain_size = CASES[case]
    mesh = domain_mesh(shape, boundary, domain_size)
    n = shape[0] * shape[1]
    x = sharded(mesh, np.random.default_rng(1), (n * n, 4))

    def loss(lib, config=None):
        kw = {} if lib is lax else {"config": config}

        def f(x):
            y = lib.psum(jnp.sin(x), BOTH, **kw) * lib.pmean(x, BOTH[::-1], **kw)
            g = lib.all_gather(x, BOTH, axis=0, tiled=True, **kw)
            s = lib.psum_scatter(x * x, BOTH, scatter_dimension=0, tiled=True, **kw)
            a = lib.all_to_all(jnp.sin(x), BOTH[::-1], 0, 1, tiled=True, **kw)
            return jnp.sum(y * y) + jnp.sum(jnp.cos(g)) + jnp.sum(s) + jnp.sum(a * a[:, ::-1].T.reshape(a.shape))

        return jax.jit(jax.grad(lambda x: jnp.sum(jax.shard_map(
            lambda v: f(v)[None], mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH))(x))))

    np.testing.assert_allclose(np.asarray(loss(iris_jax, SCATTERED)(x)), np.asarray(loss(lax)(x)),
                               rtol=1e-4, atol=1e-4)
    assert groups


def test_vmap_and_jvp_equal_lax(groups):
    mesh = domain_mesh((2, 2), "gpu", 2)
    x = sharded(mesh, np.random.default_rng(7), (16, 6))

    def f(lib):
        def body(v):
            g = jax.vmap(lambda r: lib.all_gather(r, BOTH, tiled=True))(v)
            p = jax.vmap(lambda r: lib.psum(r, BOTH[::-1]))(v)
            t = jax.jvp(lambda r: lib.psum_scatter(jnp.sin(r), BOTH, scatter_dimension=1, tiled=True),
                        (v[:, :4],), (v[:, :4],))[1]
            return g, p, t

        return body

    for g, w in zip(run(mesh, f(iris_jax), x), run(mesh, f(lax), x)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    assert groups


def test_replace_lax_collectives_composes(groups):
    mesh = domain_mesh((2, 2), "node", 2)
    x = sharded(mesh, np.random.default_rng(2), (16, 8), jnp.int32)
    f = jax.shard_map(every_collective(lax), mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH))
    for g, w in zip(iris_jax.replace_lax_collectives(f)(x), jax.jit(f)(x)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))  # int32: exact
    assert groups


@pytest.mark.parametrize("axes", [BOTH, ("gpu",)])  # "gpu" crosses domains here
def test_pbroadcast_is_a_one_hot_psum(axes, groups):
    """lax.pbroadcast, which XLA lowers on GPUs only, against the one-hot psum it equals."""
    mesh = domain_mesh((2, 4), "gpu", 2)
    x = sharded(mesh, np.random.default_rng(6), (16, 3))
    got = run(mesh, lambda v: iris_jax.pbroadcast(v, axes, 3 if axes == BOTH else 1), x)
    want = run(mesh, lambda v: lax.psum(jnp.where(lax.axis_index(axes) == (3 if axes == BOTH else 1), v, 0 * v),
                                        axes), x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert len(groups) == (8 if axes == BOTH else 0)  # one kernel inside the domains, of 8 partitions


def _lowered(mesh, f, x):
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH))).lower(x)


@pytest.mark.parametrize("op, config, want", [
    (lambda x, c: iris_jax.psum(x, BOTH, config=c), None, (1, 1)),
    (lambda x, c: iris_jax.psum(x, BOTH, config=c), SCATTERED, (2, 1)),
    (lambda x, c: iris_jax.all_gather(x, BOTH, config=c), None, (1, 1)),
    (lambda x, c: iris_jax.psum(x, "gpu", config=c), None, (1, 0)),
    (lambda x, c: iris_jax.psum(x, "node", config=c), None, (0, 1)),
    (lambda x, c: iris_jax.all_to_all(x, BOTH, 0, 0, tiled=True, config=c), None, (1, 1)),
    (lambda x, c: iris_jax.ppermute(x, BOTH, [(i, (i + 1) % 4) for i in range(4)], config=c), None, (0, 1)),
], ids=["psum", "psum-scattered", "all_gather", "inside", "across", "all_to_all", "ppermute"])
def test_what_runs_where(op, config, want, groups):
    """(iris kernels, XLA collectives) in the lowered program; explain() names the same steps."""
    mesh = domain_mesh((2, 2), "node", 2)
    x = sharded(mesh, np.random.default_rng(3), (16, 8))
    lowered = _lowered(mesh, lambda v: op(v, config), x)
    assert (kernels(lowered), xla_collectives(lowered)) == want
    rows = iris_jax.explain(jax.shard_map(lambda v: op(v, config), mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH)), x)
    assert [r.runs_on for r in rows].count("iris") == want[0]
    assert [r.runs_on for r in rows].count("XLA") == want[1]
    assert all(r.axes == ("gpu",) for r in rows if r.runs_on == "iris")


def test_explain_names_the_steps():
    mesh = domain_mesh((2, 2), "node", 2)
    x = sharded(mesh, np.random.default_rng(4), (16, 8))
    f = jax.shard_map(lambda v: (iris_jax.psum(v, BOTH, config=SCATTERED), iris_jax.all_to_all(v, BOTH, 0, 0),
                                 iris_jax.ppermute(v, BOTH, [(0, 1), (1, 0)])),
                      mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH))
    rows = iris_jax.explain(f, x)
    assert [(r.op, r.axes, r.runs_on) for r in rows] == [
        ("psum_scatter", ("gpu",), "iris"), ("psum", ("node",), "XLA"), ("all_gather", ("gpu",), "iris"),
        ("all_to_all", ("node",), "XLA"), ("all_to_all", ("gpu",), "iris"), ("ppermute", BOTH, "XLA")]
    assert "2/3: across domains, 1/2 of the data" in rows[1].why and rows[1].nbytes == 4 * 8 * 4 // 2
    assert "no hierarchical composition" in rows[5].why


def test_one_axis_over_two_domains_runs_on_xla(groups):
    use_runtime(WORLD, domain_size=2)
    mesh = Mesh(np.array(jax.devices()[:4]), ("i",))
    x = jax.device_put(jnp.arange(32.0).reshape(8, 4), NamedSharding(mesh, P("i")))
    f = jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    lowered = jax.jit(f).lower(x)
    assert (kernels(lowered), xla_collectives(lowered)) == (0, 1)
    (row,) = iris_jax.explain(f, x)
    assert row.runs_on == "XLA" and "crosses domains" in row.why
    np.testing.assert_allclose(np.asarray(jax.jit(f)(x)), np.asarray(
        jax.jit(jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)))
    assert not groups


def test_kernel_over_a_spanning_group_is_refused():
    """The low-level path: a collective kernel launched over both axes fails at lowering."""
    from iris_core.collectives import kernels as K
    from iris_jax.collectives import lowering

    mesh = domain_mesh((2, 2), "node", 2)
    x = sharded(mesh, np.random.default_rng(5), (16, 8))

    def f(v):
        return lowering.launch(K.ALL_REDUCE, v.reshape(1, -1), BOTH, 1, CollectiveConfig()).reshape(v.shape)

    with pytest.raises(iris_jax.CrossDomainError, match=r"spans domains: ranks 0 and 2 .*\(domains \[\[0, 1\], \[2, 3\], "):
        _lowered(mesh, f, x)


def test_device_barrier_is_refused_across_domains():
    use_runtime(WORLD, domain_size=4)
    mesh = Mesh(np.array(jax.devices()[:WORLD]), ("i",))
    x = jax.device_put(jnp.zeros((WORLD,)), NamedSharding(mesh, P("i")))
    f = jax.shard_map(lambda v: iris_jax.device_barrier(v)[1], mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(iris_jax.CrossDomainError, match="device_barrier .* spans domains: ranks 0 and 4"):
        jax.jit(f)(x)


def test_runtime_domains():
    rt = use_runtime(WORLD, domain_size=2)
    assert rt.domains == ((0, 1), (2, 3), (4, 5), (6, 7)) and [rt.domain_of(r) for r in range(4)] == [0, 0, 1, 1]
    with pytest.raises(iris_jax.IrisError, match="domain_size=2; init\\(domain_size=4\\) conflicts"):
        iris_jax.init(domain_size=4)
    rt = use_runtime(WORLD)
    assert rt.domains == (tuple(range(WORLD)),)
    with pytest.raises(iris_jax.RankMismatchError, match="must be >= 1 and divide the world size 8"):
        use_runtime(WORLD, domain_size=3)
