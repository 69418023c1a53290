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
The decision is made where the devices are known, at lowering (`lower_across`); `plan`
states the same parts for `iris_jax.explain`.
"""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src.lax import parallel as lax_parallel

from iris_jax import lowering

_REDUCTIONS = ("psum", "psum_invariant", "pmax", "pmin")
_GATHERS = ("all_gather", "all_gather_invariant")


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


# -- what runs where (explain) ---------------------------------------------------------------
def plan(name: str, params: dict, nbytes: int, sizes: dict, inside: tuple, across: tuple, config) -> list[Part]:
    """The steps of collective `name` (a lax primitive name) whose axes split into `inside`
    and `across` (`sizes`: the mesh's axis sizes; `nbytes`: per rank)."""
    from iris_jax.rewrite import COLLECTIVES, axes_of

    op, axes = COLLECTIVES[name], axes_of(params)
    if not across:
        return [Part(op, axes, True, "", nbytes)]
    if name == "pbroadcast":
        return [dataclasses.replace(p, why=f"pbroadcast over {axes} as a one-hot psum: {p.why}")
                for p in plan("psum_invariant", {"axes": axes}, nbytes, sizes, inside, across, config)]
    if not inside:
        return [Part(op, axes, False, f"every axis of {axes} crosses domains", nbytes)]
    whole = f"{op} over {axes}"
    if name in _REDUCTIONS:
        if name in ("psum", "psum_invariant") and scatters_hierarchically(nbytes, config):
            share = math.ceil(nbytes / math.prod(sizes[a] for a in inside))
            return [Part("psum_scatter", inside, True, f"{whole} 1/3: inside domains", nbytes),
                    Part(op, across, False, f"{whole} 2/3: across domains, 1/{nbytes // share} of the data", share),
                    Part("all_gather", inside, True, f"{whole} 3/3: inside domains", share)]
        return [Part(op, inside, True, f"{whole} 1/2: inside domains", nbytes),
                Part(op, across, False, f"{whole} 2/2: across domains", nbytes)]
    if name in _GATHERS or name in ("reduce_scatter", "all_to_all"):
        steps = runs(axes, inside)
        if name in _GATHERS:
            steps = steps[::-1]
        parts, size = [], nbytes
        for k, (run, on_iris) in enumerate(steps, 1):
            where = "inside domains" if on_iris else "across domains"
            parts.append(Part(op, run, on_iris, f"{whole} {k}/{len(steps)}: {where}", size))
            g = math.prod(sizes[a] for a in run)
            size = size * g if name in _GATHERS else size // g if name == "reduce_scatter" else size
        return parts
    return [Part(op, axes, False, f"{whole} spans domains and has no hierarchical composition here", nbytes)]


# -- the composition (lowering) ------------------------------------------------------------
def lower_across(collective, params: dict, config, inside: tuple, across: tuple, *xs) -> list:
    """The outputs of the lax `collective` over operands `xs` whose axes span domains (see
    the module docstring); runs at lowering, inside the manual mesh, like lowering.lower."""
    name = collective.name
    if name == "pvary":
        return list(xs)
    if name == "pbroadcast":
        axes = tuple(params["axis_name"])
        source = lax.axis_index(axes) == params["source"]
        masked = [jnp.where(source, x, jnp.zeros_like(x)) for x in xs]
        return lower_across(lax_parallel.psum_invariant_p, {"axes": axes}, config, inside, across, *masked)
    if not inside or name not in (*_REDUCTIONS, *_GATHERS, "reduce_scatter", "all_to_all"):
        return [_xla(collective, x, params) for x in xs]
    if name in _REDUCTIONS:
        nbytes = sum(x.size for x in xs) * xs[0].dtype.itemsize
        if name in ("psum", "psum_invariant") and scatters_hierarchically(nbytes, config):
            return _psum_scattered(collective, params, config, inside, across, xs)
        partial = lowering.lower(collective, {**params, "axes": inside}, config, *xs)
        return [_xla(collective, y, {**params, "axes": across}) for y in partial]
    axes = tuple(params["axis_name"])
    if name == "all_to_all":
        return _all_to_all(collective, params, config, inside, axes, xs)
    if name in _GATHERS:
        d, tiled, G = params["all_gather_dimension"], params["tiled"], math.prod(_sizes(axes))
        ys = list(xs)
        for run, on_iris in runs(axes, inside)[::-1]:  # the last axis varies fastest in the result
            step = {**params, "axis_name": run, "all_gather_dimension": 0, "axis_size": math.prod(_sizes(run)),
                    "tiled": False}
            ys = _run(collective, step, config, on_iris, ys)
        outs = [jnp.moveaxis(y.reshape(G, *x.shape), 0, d) for y, x in zip(ys, xs)]
        return [o.reshape(*x.shape[:d], G * x.shape[d], *x.shape[d + 1:]) if tiled else o for o, x in zip(outs, xs)]
    d, tiled = params["scatter_dimension"], params["tiled"]
    ys = [jnp.moveaxis(x, d, 0) for x in xs]
    for run, on_iris in runs(axes, inside):  # the first axis picks the largest block
        step = {**params, "axis_name": run, "scatter_dimension": 0, "axis_size": math.prod(_sizes(run)),
                "tiled": True}
        ys = _run(collective, step, config, on_iris, ys)
    return [jnp.moveaxis(y, 0, d) if tiled else y.reshape(y.shape[1:]) for y in ys]


def _psum_scattered(collective, params, config, inside, across, xs) -> list:
    """iris psum_scatter inside, XLA psum across on each rank's share, iris all_gather inside."""
    G = math.prod(_sizes(inside))
    rows = [jnp.pad(x.reshape(-1), (0, -x.size % G)).reshape(G, -1) for x in xs]
    scatter = dict(axis_name=inside, scatter_dimension=0, axis_index_groups=None, axis_size=G, tiled=False)
    shares = lowering.lower(lax_parallel.reduce_scatter_p, scatter, config, *rows)
    summed = [_xla(collective, s, {**params, "axes": across}) for s in shares]
    gather = dict(axis_name=inside, all_gather_dimension=0, axis_index_groups=None, axis_size=G, tiled=False)
    gathered = lowering.lower(lax_parallel.all_gather_invariant_p, gather, config, *summed)
    return [g.reshape(-1)[:x.size].reshape(x.shape) for g, x in zip(gathered, xs)]


def _all_to_all(collective, params, config, inside, axes, xs) -> list:
    """One all_to_all per run of axes, each over its own dimension of the chunk index."""
    s, c, G = params["split_axis"], params["concat_axis"], math.prod(_sizes(axes))
    steps = runs(axes, inside)
    counts = [math.prod(_sizes(run)) for run, _ in steps]
    ys = [lowering.split_chunks(x, s, G) for x in xs]  # [G, size / G, ...]: chunk j goes to member j
    ys = [y.reshape(*counts, *y.shape[1:]) for y in ys]
    for k, (run, on_iris) in enumerate(steps):
        ys = _run(collective, {**params, "axis_name": run, "split_axis": k, "concat_axis": k}, config, on_iris, ys)
    return [lowering.concatenated(y.reshape(G, *y.shape[len(counts):]), x, s, c, G) for y, x in zip(ys, xs)]


def _run(collective, params, config, on_iris, xs) -> list:
    if on_iris:
        return lowering.lower(collective, params, config, *xs)
    return [_xla(collective, x, params) for x in xs]


def _xla(collective, x, params):
    out = collective.bind(x, **params)
    return out[0] if collective.multiple_results else out


def _sizes(axes) -> list[int]:
    return [lowering.group_size((a,)) for a in axes]
