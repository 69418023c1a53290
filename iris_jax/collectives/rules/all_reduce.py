"""psum (pmean is a psum and a division), pmax, pmin: the all-reduce kernel kind.

One row per operand ([1, m]); the algorithm is the config's variant where it can run the call
(lowering.effective_variant). psum is linear (lax's transpose); pmax / pmin are differentiable
here (lax's are not): the tangent of the members holding the extremum, averaged over ties.
Across domains: iris inside then XLA across; a psum from `scatter_hierarchy_from` bytes per rank
as psum_scatter inside, psum across on the share, all_gather inside.
"""

from __future__ import annotations

from functools import partial

import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config

from iris_core.collectives import kernels as K
from iris_core.collectives import kinds
from iris_jax.collectives import domains, lowering
from iris_jax.collectives.registry import Rule, register
from iris_jax.compat import lax_parallel as lax

_OPS = {"sum": K.SUM, "max": K.MAX, "min": K.MIN}


def _lower(collective, params, config, axes, G, xs, *, op: str):
    groups = params.get("axis_index_groups")
    if groups is not None and len({len(g) for g in groups}) > 1:
        return _over_unequal_groups(xs, axes, groups, op, config)
    nbytes = sum(x.size for x in xs) * xs[0].dtype.itemsize
    variant = lowering.effective_variant(config.variant, op, xs[0].dtype, nbytes, G, config)
    rows = lowering.launch_many(K.ALL_REDUCE, [x.reshape(1, -1) for x in xs], axes, 1, config, op=_OPS[op],
                                variant=variant, out_invariant=True, groups=params.get("axis_index_groups"),
                                what=f"all_reduce({op})")
    return [r.reshape(x.shape) for r, x in zip(rows, xs)]


def _over_unequal_groups(xs, axes, groups, op: str, config) -> list:
    """lax's reduction over axis_index_groups of unequal sizes (which lax runs for psum, pmax
    and pmin): every member's operand gathered over the whole axes on iris, then each member
    combines its own group's rows, in the group's order and in the accumulator's type (each
    element rounded once, as the kernel's reductions)."""
    members = sum(len(g) for g in groups)
    rows = lowering.launch_many(K.ALL_GATHER, [x.reshape(1, -1) for x in xs], axes, members, config,
                                out_invariant=True, what="all_gather")
    combine = {"sum": jnp.add, "max": jnp.fmax, "min": jnp.fmin}[op]  # a NaN loses, as in the kernel
    group_of = np.zeros(members, np.int32)
    for k, group in enumerate(groups):
        group_of[list(group)] = k
    mine = jnp.asarray(group_of)[lax.axis_index(axes)]
    outs = []
    for gathered, x in zip(rows, xs):
        wide = gathered.astype(kinds.accumulator(x.dtype.name))
        per_group = []
        for group in groups:
            acc = wide[group[0]]
            for i in group[1:]:
                acc = combine(acc, wide[i])
            per_group.append(acc)
        outs.append(jnp.stack(per_group)[mine].astype(x.dtype).reshape(x.shape))
    return outs


def _plan(params, nbytes, sizes, inside, across, config, *, name: str, hierarchical: bool):
    return domains.plan_reduction(name, tuple(params["axes"]), nbytes, sizes, inside, across, config, hierarchical)


def _lower_across(collective, params, config, inside, across, xs, *, hierarchical: bool):
    return domains.lower_reduction(collective, params, config, inside, across, xs, hierarchical)


def _extremum_jvp(x, y, t, params):
    """d pmax: the tangent of the members whose x equals the result y, averaged over them
    (as jnp.max shares the derivative among ties)."""
    axes, groups = params["axes"], params.get("axis_index_groups")
    if groups is not None and jax_config._check_vma.value:
        # lax types the result invariant over the axes although groups differ, so a cotangent
        # reaching it is already summed over every group: no rule can give the groups' own
        raise NotImplementedError("Differentiation rule for 'pmax' / 'pmin' over axis_index_groups is not "
                                  "implemented with check_vma=True (lax's types the result invariant over the axes); "
                                  "use jax.shard_map(..., check_vma=False)")

    def total(v):  # over my group
        return lax.psum(v, axes) if groups is None else lax.psum_p.bind(v, axes=tuple(axes), axis_index_groups=groups)

    holds = (x == y).astype(t.dtype)
    return total(t * holds) / total(holds)


def _variant_detail(params, config) -> str:
    return f"all_reduce variant {config.variant}"


def _one_shot_detail(params, config) -> str:
    return "all_reduce one_shot"


def _rule(name: str, primitives: tuple[str, ...], op: str, hierarchical: bool, **more) -> Rule:
    """The rule of one reduction `op`; `hierarchical`: a large call across domains runs as
    psum_scatter / psum / all_gather (domains.plan_reduction)."""
    return Rule(name=name, primitives=primitives, lower=partial(_lower, op=op),
                plan=partial(_plan, name=name, hierarchical=hierarchical),
                lower_across=partial(_lower_across, hierarchical=hierarchical), runs_groups=True, reduces=op, **more)


register(_rule("psum", ("psum", "psum_invariant"), op="sum", hierarchical=True, detail=_variant_detail))
register(_rule("pmax", ("pmax",), op="max", hierarchical=False, jvp=_extremum_jvp, detail=_one_shot_detail))
register(_rule("pmin", ("pmin",), op="min", hierarchical=False, jvp=_extremum_jvp, detail=_one_shot_detail))
