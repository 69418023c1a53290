"""psum_scatter (lax's reduce_scatter primitive): the scatter dimension moved first, G rows per
operand, one output block. Linear (lax's transpose). Across domains: one tiled scatter per run
of axes, first run first."""

from __future__ import annotations

import jax.numpy as jnp

from iris_core.collectives import kernels as K
from iris_jax.collectives import domains, lowering
from iris_jax.collectives.registry import Rule, register


def _lower(collective, params, config, axes, G, xs):
    d, tiled = params["scatter_dimension"], params["tiled"]
    moved = [jnp.moveaxis(x, d, 0) for x in xs]
    rows = lowering.launch_many(K.REDUCE_SCATTER, [m.reshape(G, -1) for m in moved], axes, 1, config,
                                groups=params.get("axis_index_groups"), what="psum_scatter")
    outs = []
    for r, m in zip(rows, moved):
        block = r.reshape((m.shape[0] // G, *m.shape[1:]) if tiled else m.shape[1:])
        outs.append(jnp.moveaxis(block, 0, d) if tiled else block)
    return outs


def _plan(params, nbytes, sizes, inside, across, config):
    return domains.plan_by_runs("psum_scatter", tuple(params["axis_name"]), nbytes, sizes, inside,
                                last_run_first=False, bytes_after=lambda size, g: size // g)


def _lower_across(collective, params, config, inside, across, xs):
    return domains.lower_scatter_by_runs(collective, params, config, inside, xs)


def _carried(params, ndim):
    d = params["scatter_dimension"]
    if params["tiled"]:
        return tuple(None if i == d else i for i in range(ndim))
    return tuple(None if i == d else i if i < d else i - 1 for i in range(ndim))


register(Rule(name="psum_scatter", primitives=("reduce_scatter",), lower=_lower, plan=_plan,
              lower_across=_lower_across, carried=_carried, runs_groups=True, equal_groups_by_lax=True,
              reduces="sum"))
