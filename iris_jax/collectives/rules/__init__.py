"""One rule per lax collective that iris runs: what iris knows about it, in one place.

As JAX's own `jax/_src/lax/parallel.py` keeps each collective's rules side by side, each module
here describes one collective (or a family sharing a kernel kind): the lax primitives it covers,
the name users know it by, how its operands become the collective kernel's [blocks, m] rows and
back (`lower`), its autodiff where lax's own rule does not serve (`jvp`, `transpose`), its steps
where its axes span domains (`plan` for `explain`, `lower_across` for the program), and what
`explain` says when it runs on iris. The rewrite (iris_jax.collectives.rewrite), the primitive's rules
(iris_jax.collectives.primitive) and the compositions across domains (iris_jax.collectives.domains) read these rules
and hold no branch on a collective's name; the kernel launch itself is iris_jax.collectives.lowering's.

A new collective is a module here and its `register(...)` line below.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from iris_jax.collectives.lowering import group_size
from iris_jax.config import CollectiveConfig


def axes_of(params: dict) -> tuple:
    axes = params.get("axes", params.get("axis_name"))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _no_detail(params: dict, config: CollectiveConfig) -> str:
    return "collective kernel"


def elementwise(params: dict, ndim: int) -> tuple:
    """Every dimension of the operand is the same dimension of the result."""
    return tuple(range(ndim))


@dataclasses.dataclass(frozen=True)
class Rule:
    """Everything iris knows about one lax collective (see the module docstring).

    `lower(collective, params, config, axes, G, xs)` returns the outputs for the operands `xs`
    of one equation (None: a type cast without a kernel, outputs = inputs);
    `plan(params, nbytes, sizes, inside, across, config)` the steps of a call whose axes span
    domains (iris_jax.collectives.domains.Part), `lower_across(collective, params, config, inside, across, xs)`
    their outputs; `jvp(primals, outs, tangents, params, config)` the tangents where the
    collective is not linear; `transpose(collective, ct, params, config)` a cotangent where lax's
    rule does not serve; `detail(params, config)` what `explain` says of a call on iris;
    `carried(params, ndim)`, per dimension of an operand, the dimension of the result it becomes
    where the collective leaves it alone (None where it gathers, scatters or splits along it):
    only those may stay sharded over the automatic axes of a partially manual shard_map.

    A collective of several operands per call (`operands` > 1: ragged_all_to_all's data,
    output, offsets and sizes) makes one call per equation, and lax's own jvp, transpose and
    batching rules apply to the whole call; its `transpose`, if any, replaces lax's with lax's
    signature.
    """

    name: str
    primitives: tuple[str, ...]
    lower: Callable | None
    plan: Callable
    lower_across: Callable
    sends_when_trivial: bool = False  # iris runs even a group of one or a zero-size call (it returns x)
    operands: int = 1  # lax operands per call; 1: an equation's operands are a pytree, one call each
    jvp: Callable | None = None
    transpose: Callable | None = None
    detail: Callable = _no_detail
    runs_groups: bool = False  # lower runs lax's axis_index_groups (each group a sub-group of members)
    carried: Callable = elementwise

    @property
    def has_kernel(self) -> bool:
        return self.lower is not None


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    for primitive in rule.primitives:
        RULES[primitive] = rule
    return rule


def rule_of(primitive_name: str) -> Rule | None:
    """The rule of the lax primitive named so (None: iris does not run it)."""
    return RULES.get(primitive_name)


def lower(collective, params: dict, config: CollectiveConfig, *xs) -> list:
    """The outputs of the lax `collective` with `params` over the operands `xs` (one launch),
    at lowering time, inside the manual mesh of the shard_map."""
    rule = RULES[collective.name]
    if not rule.has_kernel:
        return list(xs)
    axes = axes_of(params)
    return rule.lower(collective, params, config, axes, group_size(axes, params.get("axis_index_groups")), list(xs))


def lower_across(collective, params: dict, config: CollectiveConfig, inside: tuple, across: tuple, *xs) -> list:
    """The outputs of `collective` over operands whose axes span domains (iris_jax.collectives.domains)."""
    from iris_jax.collectives import domains

    rule = RULES[collective.name]
    if not rule.has_kernel:
        return list(xs)
    if params.get("axis_index_groups") is not None:  # no composition of groups across domains
        return domains.lower_on_xla(collective, params, list(xs))
    return rule.lower_across(collective, params, config, inside, across, list(xs))


def plan(primitive_name: str, params: dict, nbytes: int, sizes: dict, inside: tuple, across: tuple,
         config: CollectiveConfig) -> list:
    """The steps of a call of `primitive_name` over axes split into `inside` and `across`
    (`sizes`: the mesh's axis sizes; `nbytes`: per rank), for `explain`."""
    from iris_jax.collectives.domains import Part

    rule = RULES[primitive_name]
    if not across:
        return [Part(rule.name, axes_of(params), True, "", nbytes)]
    if params.get("axis_index_groups") is not None:
        return [Part(rule.name, axes_of(params), False, "axis_index_groups over axes that span domains", nbytes)]
    return rule.plan(params, nbytes, sizes, inside, across, config)


# every collective iris runs, in the order of lax's documentation
from iris_jax.collectives.rules import (  # noqa: E402  (each module registers its rule)
    all_gather,
    all_reduce,
    all_to_all,
    pbroadcast,
    ppermute,
    psum_scatter,
    pvary,
    ragged_all_to_all,
)

__all__ = ["RULES", "Rule", "all_gather", "all_reduce", "all_to_all", "elementwise", "lower", "lower_across",
           "pbroadcast", "plan", "ppermute", "psum_scatter", "pvary", "ragged_all_to_all", "register", "rule_of"]
