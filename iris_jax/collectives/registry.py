"""The rule registry: one Rule per lax collective that iris runs, looked up by primitive name.

Each module of iris_jax.collectives.rules builds its collective's Rule and `register`s it here;
the rewrite, the primitive's rules and the compositions across domains read `rule_of` and hold
no branch on a collective's name. This module imports no rule (the rules package imports them
all, which registers them), so everything above the rules can read the registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from iris_jax.collectives import dtypes
from iris_jax.collectives.lowering import group_size
from iris_jax.config import CollectiveConfig


def axes_of(params: dict) -> tuple:
    """The mesh axes of a lax collective's parameters, as a tuple."""
    axes = params.get("axes", params.get("axis_name"))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _no_detail(params: dict, config: CollectiveConfig) -> str:
    return "collective kernel"


def elementwise(params: dict, ndim: int) -> tuple:
    """Every dimension of the operand is the same dimension of the result."""
    return tuple(range(ndim))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rule:
    """Everything iris knows about one lax collective (iris_jax.collectives.rules says more).

    `lower(collective, params, config, axes, G, xs)` returns the outputs for the operands `xs`
    of one equation (None: a type cast without a kernel, outputs = inputs);
    `plan(params, nbytes, sizes, inside, across, config)` the steps of a call whose axes span
    domains (iris_jax.collectives.domains.Part), `lower_across(collective, params, config, inside, across, xs)`
    their outputs; `jvp(x, y, t, params)` the tangent of one operand `x` (result `y`, tangent
    `t`) where the collective is not linear, and `transpose(collective, ct, params)` the
    cotangent of one operand where lax's rule does not serve: both are traced with their
    collectives on iris (iris_jax.collectives.transforms); `detail(params, config)` what `explain`
    says of a call on iris; `carried(params, ndim)`, per dimension of an operand, the dimension
    of the result it becomes where the collective leaves it alone (None where it gathers,
    scatters or splits along it): only those may stay sharded over the automatic axes of a
    partially manual shard_map.

    A collective of several operands per call (`operands` > 1: ragged_all_to_all's data,
    output, offsets and sizes) makes one call per equation, and lax's own jvp, transpose and
    batching rules apply to the whole call; its `transpose`, if any, replaces lax's with lax's
    signature. Built by keyword (every field named).
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
    equal_groups_by_lax: bool = False  # lax itself refuses axis_index_groups of unequal sizes (ValueError)
    carried: Callable = elementwise
    reduces: str | None = None  # "sum", "max", "min": how it combines members (None: it moves data)

    @property
    def has_kernel(self) -> bool:
        return self.lower is not None


RULES: dict[str, Rule] = {}


def register(rule: Rule) -> Rule:
    """Make `rule` the rule of each of its lax primitives."""
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
    G = group_size(axes, params.get("axis_index_groups"))
    if rule.operands > 1:  # the rule encodes its own data operands (ragged_all_to_all)
        return rule.lower(collective, params, config, axes, G, list(xs))
    encoded, decode = dtypes.encode_all(list(xs), rule.reduces)  # each dtype as the kernels take it
    return decode(rule.lower(collective, params, config, axes, G, encoded))
