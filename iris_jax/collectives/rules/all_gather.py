"""all_gather (and all_gather_invariant, whose result is the same on every member): one row per
operand, G output blocks, moved to `all_gather_dimension`. Linear (lax's transpose). Across
domains: one untiled gather per run of axes, last run first."""

from __future__ import annotations

import jax.numpy as jnp

from iris_core.collectives import kernels as K
from iris_jax.collectives import domains, lowering
from iris_jax.collectives.registry import Rule, register


def _lower(collective, params, config, axes, G, xs):
    rows = lowering.launch_many(K.ALL_GATHER, [x.reshape(1, -1) for x in xs], axes, G, config, what="all_gather",
                                out_invariant=collective.name == "all_gather_invariant",
                                groups=params.get("axis_index_groups"))
    return [_gathered(r, x, G, params["all_gather_dimension"], params["tiled"]) for r, x in zip(rows, xs)]


def _gathered(rows, x, G, axis, tiled):
    out = jnp.moveaxis(rows.reshape(G, *x.shape), 0, axis)
    if tiled:
        return out.reshape(*x.shape[:axis], G * x.shape[axis], *x.shape[axis + 1:])
    return out


def _plan(params, nbytes, sizes, inside, across, config):
    return domains.plan_by_runs("all_gather", tuple(params["axis_name"]), nbytes, sizes, inside, last_run_first=True,
                                bytes_after=lambda size, g: size * g)


def _lower_across(collective, params, config, inside, across, xs):
    return domains.lower_gather_by_runs(collective, params, config, inside, xs)


def _carried(params, ndim):
    d = params["all_gather_dimension"]
    if params["tiled"]:
        return tuple(None if i == d else i for i in range(ndim))
    return tuple(i if i < d else i + 1 for i in range(ndim))


register(Rule(name="all_gather", primitives=("all_gather", "all_gather_invariant"), lower=_lower, plan=_plan,
              lower_across=_lower_across, carried=_carried, runs_groups=True, equal_groups_by_lax=True))
