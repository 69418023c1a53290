"""Rematerialization as lax's: under jax.checkpoint, iris collectives are recomputed or saved
exactly where lax's are (CPU simulator).

`saved_residuals` of a program with iris's collectives (called directly, and through
replace_lax_collectives) lists the same values as the same program with lax's, for the default
policy and the named ones; gradients agree. The linear collectives only: lax cannot
differentiate pmax / pmin, so there is no lax program to compare with.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax._src.ad_checkpoint import saved_residuals
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax.helpers import use_runtime

G = 4
RING = [(i, (i + 1) % G) for i in range(G)]
OPS = {  # name: f(module, v) with module jax.lax or iris_jax
    "psum": lambda m, v: m.psum(v, "i"),
    "pmean": lambda m, v: m.pmean(v, "i"),
    "all_gather": lambda m, v: m.all_gather(v, "i", axis=0, tiled=True),
    "psum_scatter": lambda m, v: m.psum_scatter(v, "i", scatter_dimension=0, tiled=True),
    "all_to_all": lambda m, v: m.all_to_all(v, "i", 0, 0, tiled=True),
    "ppermute": lambda m, v: m.ppermute(v, "i", RING),
}
POLICIES = {
    "default": None,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
    "everything_saveable": jax.checkpoint_policies.everything_saveable,
    "checkpoint_dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_with_no_batch_dims": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_only_these_names": jax.checkpoint_policies.save_only_these_names("h"),
}


def _program(op, module, policy, replace=False):
    """grad-ready: the collective twice (on the input and on its own result), a named value
    and a dot, under jax.checkpoint with `policy`, in a shard_map over 4 ranks."""
    def body(v):
        y = op(module, v)
        h = checkpoint_name(jnp.sin(y), "h")
        z = op(module, h * y)
        return (jnp.dot(z.reshape(-1), jnp.cos(z).reshape(-1)) + jnp.sum(y))[None]

    if replace:
        body = iris_jax.replace_lax_collectives(body)
    mesh = jax.make_mesh((G,), ("i",), devices=jax.devices()[:G], axis_types=(jax.sharding.AxisType.Explicit,))
    smap = jax.shard_map(jax.checkpoint(body, policy=policy), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    return lambda x: smap(x).sum(), mesh


def _residuals(f, x) -> list[str]:
    return sorted(str(aval) for aval, _ in saved_residuals(f, x))


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("op", OPS)
def test_saved_residuals_match_lax(op, policy):
    use_runtime(G)
    f_lax, mesh = _program(OPS[op], lax, POLICIES[policy])
    x = jax.device_put(jnp.arange(64 * 4, dtype=jnp.float32).reshape(64, 4) / 97, NamedSharding(mesh, P("i")))
    expected = _residuals(f_lax, x)
    assert _residuals(_program(OPS[op], iris_jax, POLICIES[policy])[0], x) == expected
    assert _residuals(_program(OPS[op], lax, POLICIES[policy], replace=True)[0], x) == expected


@pytest.mark.parametrize("policy", ["default", "everything_saveable", "save_only_these_names"])
@pytest.mark.parametrize("op", OPS)
def test_rematerialized_gradients_match_lax(op, policy):
    use_runtime(G)
    f_lax, mesh = _program(OPS[op], lax, POLICIES[policy])
    f_iris, _ = _program(OPS[op], iris_jax, POLICIES[policy])
    x = jax.device_put(jnp.asarray(np.random.default_rng(0).standard_normal((64, 4)), jnp.float32),
                       NamedSharding(mesh, P("i")))
    np.testing.assert_allclose(jax.jit(jax.grad(f_iris))(x), jax.jit(jax.grad(f_lax))(x), rtol=2e-5, atol=2e-5)


def test_all_gather_under_default_checkpoint_saves_only_the_input():
    """The case a sequence-parallel model meets: the gathered activations are recomputed in
    the backward pass, not kept."""
    use_runtime(G)
    mesh = jax.make_mesh((G,), ("i",), devices=jax.devices()[:G], axis_types=(jax.sharding.AxisType.Explicit,))
    x = jax.device_put(jnp.ones(G), NamedSharding(mesh, P("i")))
    found = {}
    for module in (lax, iris_jax):
        gather = lambda v, m=module: m.all_gather(v, "i")  # noqa: E731
        f = jax.checkpoint(jax.shard_map(lambda v, g=gather: g(v) * g(v), mesh=mesh, in_specs=P("i"),
                                         out_specs=P(), check_vma=False))
        found[module] = _residuals(lambda v, f=f: f(v).sum(), x)
    assert found[iris_jax] == found[lax] == ["float32[4@i]"]
