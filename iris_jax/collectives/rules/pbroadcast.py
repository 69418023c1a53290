"""pbroadcast: every member gets member `source`'s operand (one row per operand). iris runs it
even where there is nothing to send (a group of one, zero-size), returning the operand: XLA
lowers pbroadcast on GPUs only. Its transpose: the source gets the sum of the cotangents, every
other member zero (lax's rule fills with an array, which fails for non-scalars). Across domains:
a one-hot psum (the source's value, zeros elsewhere), composed as psum is."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from iris_core.collectives import kernels as K
from iris_jax.collectives import domains, lowering
from iris_jax.collectives.registry import Rule, register, rule_of
from iris_jax.compat import lax_parallel


def _lower(collective, params, config, axes, G, xs):
    if G == 1 or not any(x.size for x in xs):  # nothing to send (see rewrite.placement)
        return list(xs)
    rows = lowering.launch_many(K.BROADCAST, [x.reshape(1, -1) for x in xs], axes, 1, config,
                                sources=[params["source"]] * G, what="pbroadcast")
    return [r.reshape(x.shape) for r, x in zip(rows, xs)]


def _transpose(collective, ct, params):
    total = lax_parallel.psum(ct, params["axis_name"])
    source = lax_parallel.axis_index(params["axis_name"]) == params["source"]
    return jnp.where(source, total, jnp.zeros_like(total))


def _plan(params, nbytes, sizes, inside, across, config):
    axes = tuple(params["axis_name"])
    return [dataclasses.replace(p, why=f"pbroadcast over {axes} as a one-hot psum: {p.why}")
            for p in rule_of("psum_invariant").plan({"axes": axes}, nbytes, sizes, inside, across, config)]


def _lower_across(collective, params, config, inside, across, xs):
    axes = tuple(params["axis_name"])
    source = lax_parallel.axis_index(axes) == params["source"]
    masked = [jnp.where(source, x, jnp.zeros_like(x)) for x in xs]
    return domains.lower_across(lax_parallel.psum_invariant_p, {"axes": axes}, config, inside, across, *masked)


register(Rule(name="pbroadcast", primitives=("pbroadcast",), lower=_lower, plan=_plan, lower_across=_lower_across,
              sends_when_trivial=True,
              transpose=_transpose))
