"""pvary: a type cast (the value starts varying over the axes), no kernel. It runs on iris so
that its transpose, a psum, does too."""

from __future__ import annotations

from iris_jax.collectives.registry import Rule, register


def _unused(*args, **kwargs):
    raise AssertionError("pvary has no kernel and no steps")  # rules.lower / lower_across return its inputs


register(Rule(name="pvary", primitives=("pvary",), lower=None, plan=_unused, lower_across=_unused))
