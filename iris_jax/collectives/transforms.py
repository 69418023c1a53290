"""The `iris_collective` primitive's jvp, transpose and batching rules: lax's own, run on iris.

* jvp: the linear collectives map tangents through themselves; pmax/pmin (which lax cannot
  differentiate) give the tangent of the members holding the extremum, averaged over ties
  (their rule's `jvp`);
* transpose and batching: lax's rule (or the collective's rule's `transpose` where lax's does
  not serve), run by `iris_jax.collectives.rewrite.run_on_iris`, so the collectives that lax's
  rule emits (psum_scatter for all_gather, psum for pvary, ...) are iris collectives too.

They live apart from the primitive because they re-enter the rewrite, which binds the
primitive: importing this module registers them (iris_jax.collectives does).
"""

from __future__ import annotations

from functools import partial

from jax._src import core
from jax._src.interpreters import ad, batching

from iris_jax.collectives.primitive import freeze, iris_collective_p, whole_call
from iris_jax.collectives.registry import rule_of
from iris_jax.collectives.rewrite import run_on_iris


# -- autodiff ---------------------------------------------------------------------------
def _is_linear(collective) -> bool:
    return collective in ad.primitive_transposes


def _zero_like(x):
    aval = core.typeof(x)
    return ad.Zero(aval.to_tangent_aval())


def _jvp(primals, tangents, *, collective, params, config):
    if whole_call(collective):
        return _lax_jvp(primals, tangents, collective, dict(params), config)
    outs = iris_collective_p.bind(*primals, collective=collective, params=params, config=config)
    if _is_linear(collective):
        live = [i for i, t in enumerate(tangents) if type(t) is not ad.Zero]
        live_outs = iris_collective_p.bind(*[tangents[i] for i in live], collective=collective, params=params,
                                           config=config) if live else []
        tangents_out = [_zero_like(o) for o in outs]
        for i, t in zip(live, live_outs):
            tangents_out[i] = t
        return outs, tangents_out
    jvp = rule_of(collective.name).jvp
    if jvp is None:
        raise NotImplementedError(f"Differentiation rule for '{collective.name}' not implemented")
    kwargs = dict(params)
    return outs, [run_on_iris(partial(jvp, params=kwargs), (x, y, t), config, merge=False)
                  if type(t) is not ad.Zero else _zero_like(y) for x, y, t in zip(primals, outs, tangents)]


def _lax_jvp(primals, tangents, collective, kwargs, config):
    """lax's jvp rule, its collectives on iris (the tangents of integer operands are zeros)."""
    outs = iris_collective_p.bind(*primals, collective=collective, params=freeze(kwargs), config=config)
    live = [i for i, t in enumerate(tangents) if type(t) is not ad.Zero]
    if not live:
        return outs, [_zero_like(o) for o in outs]

    def jvp(primals, live_tangents):
        full = list(tangents)
        for i, t in zip(live, live_tangents):
            full[i] = t
        _, out_tangent = ad.primitive_jvps[collective](primals, full, **kwargs)
        return list(out_tangent) if collective.multiple_results else [out_tangent]

    return outs, run_on_iris(jvp, (list(primals), [tangents[i] for i in live]), config, merge=False)


def _lax_transpose(cts, args, collective, kwargs, config):
    """lax's transpose rule of the whole call (or the collective's rule's, which has lax's
    signature), its collectives on iris."""
    undefined = [ad.is_undefined_primal(a) for a in args]
    if all(type(ct) is ad.Zero for ct in cts):
        return [ad.Zero(a.aval) if u else None for a, u in zip(args, undefined)]
    rule = rule_of(collective.name).transpose or ad.primitive_transposes[collective]
    known = [a for a, u in zip(args, undefined) if not u]

    def transpose(cts, known):
        known = iter(known)
        full = [a if u else next(known) for a, u in zip(args, undefined)]
        found = rule(cts if collective.multiple_results else cts[0], *full, **kwargs)
        return [t if u else None for t, u in zip(found, undefined)]

    return run_on_iris(transpose, ([ad.instantiate_zeros(ct) for ct in cts], known), config, merge=False)


def _transpose(cts, *args, collective, params, config):
    if whole_call(collective):
        return _lax_transpose(cts, args, collective, dict(params), config)
    override = rule_of(collective.name).transpose
    rule = ad.primitive_transposes.get(collective)
    kwargs = dict(params)

    def one(ct, arg):
        if type(ct) is ad.Zero:
            return ad.Zero(arg.aval.to_ct_aval()) if hasattr(arg.aval, "to_ct_aval") else ad.Zero(arg.aval)
        if override is not None:  # where lax's rule does not serve (iris_jax.collectives.rules)
            return run_on_iris(lambda c: override(collective, c, kwargs), (ct,), config, merge=False)
        if collective.multiple_results:
            return run_on_iris(lambda c: rule([c], arg, **kwargs)[0], (ct,), config, merge=False)
        return run_on_iris(lambda c: rule(c, arg, **kwargs)[0], (ct,), config, merge=False)

    return [one(ct, arg) for ct, arg in zip(cts, args)]


ad.primitive_jvps[iris_collective_p] = _jvp
ad.primitive_transposes[iris_collective_p] = _transpose


# -- vmap -------------------------------------------------------------------------------
def _batch(axis_data, vals, dims, *, collective, params, config):
    rule = batching.fancy_primitive_batchers[collective]
    kwargs = dict(params)
    if whole_call(collective):
        found = {}

        def batched(*vals):
            out, out_dim = rule(axis_data, list(vals), list(dims), **kwargs)
            found["dims"] = list(out_dim) if collective.multiple_results else [out_dim]
            return list(out) if collective.multiple_results else [out]

        return run_on_iris(batched, tuple(vals), config, merge=False), found["dims"]
    outs, out_dims = [], []
    for v, d in zip(vals, dims):
        found = {}

        def batched(v, d=d):
            out, out_dim = rule(axis_data, [v], [d], **kwargs)
            if collective.multiple_results:
                out, out_dim = out[0], out_dim[0]
            found["dim"] = out_dim
            return out

        outs.append(run_on_iris(batched, (v,), config, merge=False))
        out_dims.append(found["dim"])
    return outs, out_dims


batching.fancy_primitive_batchers[iris_collective_p] = _batch
