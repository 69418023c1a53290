"""ppermute: member `src` sends its operand to member `dst` for each pair of `perm` (one row per
operand, one output block; members that receive nothing get zeros). lax's checks and errors
(unique sources and destinations, indices in [-G, G), and on jax 0.12 the axes' order).
Linear (lax's transpose). Across domains: XLA (no composition here)."""

from __future__ import annotations

from iris_core.collectives import kernels as K
from iris_jax import compat
from iris_jax.collectives import domains, lowering
from iris_jax.collectives.registry import Rule, register


def _lower(collective, params, config, axes, G, xs):
    perm = [(src % G, dst % G) for src, dst in params["perm"]]
    if len({s for s, _ in perm}) != len(perm) or len({d for _, d in perm}) != len(perm):
        raise ValueError(f"ppermute sources and destinations must be unique, got {params['perm']}.")  # lax's
    bad = [i for pair in params["perm"] for i in pair if not -G <= i < G]
    if bad:  # lax then indexes its group with them (IndexError), negative ones from the end
        raise ValueError(f"ppermute indices must lie in [-{G}, {G}) for a group of {G} members, got {bad[0]} "
                         f"in {params['perm']}.")
    if compat.ppermute_axis_order_checked() and lowering.out_of_mesh_order(axes):
        raise RuntimeError(compat.PPERMUTE_ORDER_MESSAGE)  # lax's, where this JAX checks it
    member = lowering.group_positions(axes)
    sources = [-1] * G
    for src, dst in perm:
        sources[member[dst]] = member[src]
    rows = lowering.launch_many(K.PPERMUTE, [x.reshape(1, -1) for x in xs], axes, 1, config, sources=sources,
                                what="ppermute")
    return [r.reshape(x.shape) for r, x in zip(rows, xs)]


def _plan(params, nbytes, sizes, inside, across, config):
    return domains.plan_on_xla("ppermute", tuple(params["axis_name"]), nbytes, inside)


def _lower_across(collective, params, config, inside, across, xs):
    return domains.lower_on_xla(collective, params, xs)


register(Rule(name="ppermute", primitives=("ppermute",), lower=_lower, plan=_plan, lower_across=_lower_across))
