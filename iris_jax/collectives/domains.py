"""Collectives over mesh axes that span domains: iris inside a domain, XLA across.

A domain is a set of ranks whose heaps map each other (one NVLink domain; `Runtime.domains`).
For a collective over mesh axes `axes`, an axis is *inside* when moving along it never leaves
a device's domain, else *across*; a tuple of inside axes is inside too (moving along each
stays in the domain). An iris collective equation then runs as:

* every axis inside: one iris kernel, as without domains;
* every axis across: XLA's collective;
* both: a composition (values equal lax's; floating-point sums add in another order):
  - psum (pmean is a psum and a division): from `config.scatter_hierarchy_from` bytes per rank,
    iris psum_scatter over the inside axes, XLA psum over the across axes on the 1/G_inside
    share, iris all_gather inside (each rank sends 1/G_inside of its bytes across domains);
    below it, iris psum inside, then XLA psum across (two steps instead of three);
  - pmax / pmin: iris inside, then XLA across;
  - all_gather: one untiled gather per run of consecutive axes of one kind, last run first,
    so that members come out in the tuple's order;
  - psum_scatter: one tiled scatter per run, first run first;
  - all_to_all: the split dimension's chunk index viewed as one dimension per run, then one
    all_to_all per run that exchanges along that dimension (split and concat on it), which
    leaves chunk k of the result from member k, as lax concatenates;
  - pbroadcast: a one-hot psum (the source's value, zeros elsewhere), composed as psum is
    (XLA lowers pbroadcast itself on GPUs only);
  - ppermute: XLA (no composition here).

One mesh axis over two domains (a "gpu" axis of 8 over two hosts of 4) is across: lay the
mesh out with one axis per level, e.g. ("node", "gpu"), so that iris runs within the node.
The decision is made where the devices are known, at lowering (`lower_across`); `plan` states
the same parts for `iris_jax.explain`. Each collective's rule (iris_jax.collectives.rules) names
its composition; the compositions are here, and reach the rules through the registry
(iris_jax.collectives.registry), so that this module imports no rule.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax._src.lax import parallel as lax_parallel

from iris_jax.collectives import lowering
from iris_jax.collectives.registry import RULES, axes_of, lower


@dataclasses.dataclass(frozen=True)
class Part:
    """One step of a collective over axes that span domains."""

    op: str  # the user's name: psum, all_gather, psum_scatter, ...
    axes: tuple
    on_iris: bool
    why: str
    nbytes: int  # bytes per rank that this step takes in


def split_axes(mesh, axes, rt) -> tuple[tuple, tuple]:
    """(inside, across): `axes` of the concrete `mesh`, by whether moving along them stays in
    every device's domain (see the module docstring)."""
    if len(rt.domains) == 1:
        return tuple(axes), ()
    names = list(mesh.axis_names)
    domain = np.vectorize(lambda d: rt.domain_of(rt.rank_of(d)), otypes=[int])(mesh.devices)
    inside = tuple(a for a in axes if (domain == np.take(domain, [0], axis=names.index(a))).all())
    return inside, tuple(a for a in axes if a not in inside)


def runs(axes, inside) -> list[tuple[tuple, bool]]:
    """`axes` cut into runs of consecutive axes of one kind: [(run, inside?), ...]."""
    out: list[tuple[tuple, bool]] = []
    for a in axes:
        if out and out[-1][1] == (a in inside):
            out[-1] = (out[-1][0] + (a,), out[-1][1])
        else:
            out.append(((a,), a in inside))
    return out


def scatters_hierarchically(nbytes: int, config) -> bool:
    return nbytes >= config.scatter_hierarchy_from


def lower_across(collective, params: dict, config, inside: tuple, across: tuple, *xs) -> list:
    """The outputs of `collective` over operands whose axes span domains: its rule's composition."""
    rule = RULES[collective.name]
    if not rule.has_kernel:
        return list(xs)
    if params.get("axis_index_groups") is not None:  # no composition of groups across domains
        return lower_on_xla(collective, params, list(xs))
    return rule.lower_across(collective, params, config, inside, across, list(xs))


def plan(primitive_name: str, params: dict, nbytes: int, sizes: dict, inside: tuple, across: tuple,
         config) -> list[Part]:
    """The steps of a call of `primitive_name` over axes split into `inside` and `across`
    (`sizes`: the mesh's axis sizes; `nbytes`: per rank), for `explain`."""
    rule = RULES[primitive_name]
    if not across:
        return [Part(rule.name, axes_of(params), True, "", nbytes)]
    if params.get("axis_index_groups") is not None:
        return [Part(rule.name, axes_of(params), False, "axis_index_groups over axes that span domains", nbytes)]
    return rule.plan(params, nbytes, sizes, inside, across, config)


# -- the compositions: each collective's rule (iris_jax.collectives.rules) picks one -----
# plan_*: the steps for `explain`; lower_*: the program, at lowering, inside the manual mesh.
def plan_on_xla(name: str, axes: tuple, nbytes: int, inside: tuple) -> list[Part]:
    """No composition: XLA runs the whole call."""
    if not inside:
        return [Part(name, axes, False, f"every axis of {axes} crosses domains", nbytes)]
    return [Part(name, axes, False, f"{name} over {axes} spans domains and has no hierarchical composition here",
                 nbytes)]


def lower_on_xla(collective, params, xs) -> list:
    return [_xla(collective, x, params) for x in xs]


def plan_reduction(name: str, axes: tuple, nbytes: int, sizes: dict, inside: tuple, across: tuple, config,
                   hierarchical: bool) -> list[Part]:
    """iris inside then XLA across; a sum from `config.scatter_hierarchy_from` bytes per rank
    (`hierarchical`) as iris psum_scatter inside, XLA psum across on the share, iris all_gather."""
    if not inside:
        return plan_on_xla(name, axes, nbytes, inside)
    whole = f"{name} over {axes}"
    if hierarchical and scatters_hierarchically(nbytes, config):
        share = math.ceil(nbytes / math.prod(sizes[a] for a in inside))
        return [Part("psum_scatter", inside, True, f"{whole} 1/3: inside domains", nbytes),
                Part(name, across, False, f"{whole} 2/3: across domains, 1/{nbytes // share} of the data", share),
                Part("all_gather", inside, True, f"{whole} 3/3: inside domains", share)]
    return [Part(name, inside, True, f"{whole} 1/2: inside domains", nbytes),
            Part(name, across, False, f"{whole} 2/2: across domains", nbytes)]


def lower_reduction(collective, params, config, inside, across, xs, hierarchical: bool) -> list:
    if not inside:
        return lower_on_xla(collective, params, xs)
    nbytes = sum(x.size for x in xs) * xs[0].dtype.itemsize
    if hierarchical and scatters_hierarchically(nbytes, config):
        return _psum_scattered(collective, params, config, inside, across, xs)
    partial = lower(collective, {**params, "axes": inside}, config, *xs)
    return [_xla(collective, y, {**params, "axes": across}) for y in partial]


def plan_by_runs(name: str, axes: tuple, nbytes: int, sizes: dict, inside: tuple, *, last_run_first: bool,
                 bytes_after) -> list[Part]:
    """One step per run of consecutive axes of one kind; `bytes_after(nbytes, g)`: a step's
    bytes per rank out of its input's, over a run of g members."""
    if not inside:
        return plan_on_xla(name, axes, nbytes, inside)
    steps = runs(axes, inside)
    if last_run_first:
        steps = steps[::-1]
    parts, size, whole = [], nbytes, f"{name} over {axes}"
    for k, (run, on_iris) in enumerate(steps, 1):
        where = "inside domains" if on_iris else "across domains"
        parts.append(Part(name, run, on_iris, f"{whole} {k}/{len(steps)}: {where}", size))
        size = bytes_after(size, math.prod(sizes[a] for a in run))
    return parts


def lower_gather_by_runs(collective, params, config, inside, xs) -> list:
    """One untiled gather per run, last run first, so that members come out in the tuple's order."""
    if not inside:
        return lower_on_xla(collective, params, xs)
    axes = tuple(params["axis_name"])
    d, tiled, G = params["all_gather_dimension"], params["tiled"], math.prod(_sizes(axes))
    ys = list(xs)
    for run, on_iris in runs(axes, inside)[::-1]:  # the last axis varies fastest in the result
        step = {**params, "axis_name": run, "all_gather_dimension": 0, "axis_size": math.prod(_sizes(run)),
                "tiled": False}
        ys = _run(collective, step, config, on_iris, ys)
    outs = [jnp.moveaxis(y.reshape(G, *x.shape), 0, d) for y, x in zip(ys, xs)]
    return [o.reshape(*x.shape[:d], G * x.shape[d], *x.shape[d + 1:]) if tiled else o for o, x in zip(outs, xs)]


def lower_scatter_by_runs(collective, params, config, inside, xs) -> list:
    """One tiled scatter per run, first run first (the first axis picks the largest block)."""
    if not inside:
        return lower_on_xla(collective, params, xs)
    axes = tuple(params["axis_name"])
    d, tiled = params["scatter_dimension"], params["tiled"]
    ys = [jnp.moveaxis(x, d, 0) for x in xs]
    for run, on_iris in runs(axes, inside):
        step = {**params, "axis_name": run, "scatter_dimension": 0, "axis_size": math.prod(_sizes(run)),
                "tiled": True}
        ys = _run(collective, step, config, on_iris, ys)
    return [jnp.moveaxis(y, 0, d) if tiled else y.reshape(y.shape[1:]) for y in ys]


def lower_all_to_all_by_runs(collective, params, config, inside, xs) -> list:
    """The split dimension's chunk index as one dimension per run, then one all_to_all per run
    along its own dimension (split and concat on it)."""
    if not inside:
        return lower_on_xla(collective, params, xs)
    axes = tuple(params["axis_name"])
    s, c, G = params["split_axis"], params["concat_axis"], math.prod(_sizes(axes))
    steps = runs(axes, inside)
    counts = [math.prod(_sizes(run)) for run, _ in steps]
    ys = [lowering.split_chunks(x, s, G) for x in xs]  # [G, size / G, ...]: chunk j goes to member j
    ys = [y.reshape(*counts, *y.shape[1:]) for y in ys]
    for k, (run, on_iris) in enumerate(steps):
        ys = _run(collective, {**params, "axis_name": run, "split_axis": k, "concat_axis": k}, config, on_iris, ys)
    return [lowering.concatenated(y.reshape(G, *y.shape[len(counts):]), x, s, c, G) for y, x in zip(ys, xs)]


def _psum_scattered(collective, params, config, inside, across, xs) -> list:
    """iris psum_scatter inside, XLA psum across on each rank's share, iris all_gather inside."""
    G = math.prod(_sizes(inside))
    rows = [jnp.pad(x.reshape(-1), (0, -x.size % G)).reshape(G, -1) for x in xs]
    scatter = dict(axis_name=inside, scatter_dimension=0, axis_index_groups=None, axis_size=G, tiled=False)
    shares = lower(lax_parallel.reduce_scatter_p, scatter, config, *rows)
    summed = [_xla(collective, s, {**params, "axes": across}) for s in shares]
    gather = dict(axis_name=inside, all_gather_dimension=0, axis_index_groups=None, axis_size=G, tiled=False)
    gathered = lower(lax_parallel.all_gather_invariant_p, gather, config, *summed)
    return [g.reshape(-1)[:x.size].reshape(x.shape) for g, x in zip(gathered, xs)]


def _run(collective, params, config, on_iris, xs) -> list:
    if on_iris:
        return lower(collective, params, config, *xs)
    return lower_on_xla(collective, params, xs)


def _xla(collective, x, params):
    out = collective.bind(x, **params)
    return out[0] if collective.multiple_results else out


def _sizes(axes) -> list[int]:
    return [lowering.group_size((a,)) for a in axes]
