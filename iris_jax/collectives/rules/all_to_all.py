"""all_to_all: chunk i of the split dimension goes to member i (G rows per operand), the chunks
received concatenated along `concat_axis`. Its transpose is the same primitive with the axes
swapped (lax's goes through lax.all_to_all, which reshapes the cotangent of an untiled call once
more: a wrong shape where split and concat axes differ). Across domains: the chunk index viewed as
one dimension per run of axes, one all_to_all per run."""

from __future__ import annotations

from iris_core.collectives import kernels as K
from iris_jax.collectives import domains, lowering
from iris_jax.collectives.registry import Rule, register


def _lower(collective, params, config, axes, G, xs):
    s, c = params["split_axis"], params["concat_axis"]
    chunks = [lowering.split_chunks(x, s, G) for x in xs]
    rows = lowering.launch_many(K.ALL_TO_ALL, [ch.reshape(G, -1) for ch in chunks], axes, G, config,
                                groups=params.get("axis_index_groups"), what="all_to_all")
    return [lowering.concatenated(r.reshape(ch.shape), x, s, c, G) for r, ch, x in zip(rows, chunks, xs)]


def _transpose(collective, ct, params):
    """The primitive with its axes swapped (in its own, already reshaped, layout)."""
    swapped = {**params, "split_axis": params["concat_axis"], "concat_axis": params["split_axis"]}
    return collective.bind(ct, **swapped)


def _plan(params, nbytes, sizes, inside, across, config):
    return domains.plan_by_runs("all_to_all", tuple(params["axis_name"]), nbytes, sizes, inside,
                                last_run_first=False, bytes_after=lambda size, g: size)


def _lower_across(collective, params, config, inside, across, xs):
    return domains.lower_all_to_all_by_runs(collective, params, config, inside, xs)


def _carried(params, ndim):
    return tuple(None if i in (params["split_axis"], params["concat_axis"]) else i for i in range(ndim))


register(Rule(name="all_to_all", primitives=("all_to_all",), lower=_lower, plan=_plan, lower_across=_lower_across,
              transpose=_transpose, carried=_carried, runs_groups=True, equal_groups_by_lax=True))
