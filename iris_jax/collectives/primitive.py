"""`iris_collective`: a jax.lax collective whose kernels are iris's.

An equation of this primitive is a lax collective equation (`psum_invariant`, `all_gather`,
`ppermute`, ...) with the same operands and parameters, plus a CollectiveConfig. Every rule
but the lowering is lax's own, applied through iris:

* abstract eval: the lax primitive's, so shapes, varying axes, effects and errors are lax's;
* jvp, transpose and batching: iris_jax.collectives.transforms (lax's rules, their collectives
  on iris too);
* lowering: iris kernels (each collective's rule, iris_jax.collectives.rules) on GPUs and on the simulator; XLA's own
  lowering where iris has nothing to do (see iris_jax.collectives.rewrite.placement); over axes that
  span domains, iris inside them and XLA across (iris_jax.collectives.domains); in a partially manual
  shard_map, inside a nested region that makes the automatic axes manual too (`_lower_per_shard`).

One equation may carry several operands of one dtype with the same parameters (a pytree):
their kernels run as one launch. A collective of several operands per call (ragged_all_to_all)
is one call per equation, and lax's jvp, transpose and batching rules apply to it whole.
"""

from __future__ import annotations

import math
from functools import partial

import jax
from jax._src import core
from jax._src.interpreters import partial_eval as pe
from jax.extend.core import Primitive
from jax.interpreters import mlir
from jax.sharding import AxisType, PartitionSpec

from iris_core.collectives.kinds import VARIANT_NAMES
from iris_core.sim import host_collectives
from iris_jax import _runtime, compat
from iris_jax.calls import cpu_lowering
from iris_jax.calls.cpu_execution import runs_collectives_here
from iris_jax.calls.operands import concrete
from iris_jax.calls.triton_call import iris_kernel_effect
from iris_jax.collectives import domains, registry
from iris_jax.collectives.lowering import lowers_on_iris
from iris_jax.collectives.registry import axes_of, rule_of

iris_collective_p = Primitive("iris_collective")
iris_collective_p.multiple_results = True


def freeze(params: dict) -> tuple:
    """lax parameters as a hashable, ordered tuple of (name, value)."""
    return tuple(sorted(params.items()))


def calls(collective, xs) -> list[list]:
    """An equation's operands cut into the lax calls they stand for (iris_jax.collectives.registry: Rule.operands)."""
    n = rule_of(collective.name).operands
    return [list(xs[i:i + n]) for i in range(0, len(xs), n)]


def _lax_bind(collective, xs, params: dict) -> list:
    """One call's operands through the lax primitive itself: its outputs as a list."""
    out = collective.bind(*xs, **params)
    return list(out) if collective.multiple_results else [out]


def whole_call(collective) -> bool:
    """Whether lax's own rules apply to the whole call (several operands per call)."""
    return rule_of(collective.name).operands > 1


def kernel_effects(collective, config) -> set:
    """The effects an equation of `collective` adds to lax's: the iris kernel effect where the
    collective runs a kernel (a type cast such as pvary runs none). Programs with iris kernels
    then carry JAX's runtime tokens, so jax.effects_barrier() waits for every device's kernels
    (a replicated result is ready when its first device's copy is; the tracer reads the events
    of every device's kernel after it). Where the simulator runs the call on the host (`on_host`),
    none: the call is a meeting of the device threads that returns when every member's output is
    written, as lax's collectives are, and carries no token (whose dispatch costs more than the call)."""
    if not rule_of(collective.name).has_kernel or on_host(config):
        return set()
    return {iris_kernel_effect}


def on_host(config) -> bool:
    """Whether the simulator runs calls of `config` on the host (cpu_execution.host_collective): its
    collectives run there (runs_collectives_here), device tracing is off (it records the kernels'
    own events) and the all-reduce algorithm combines in member order (ring, atomic and spinlock
    run their kernels)."""
    rt = _runtime.runtime()
    host_variants = ("auto", *(VARIANT_NAMES[v] for v in host_collectives.ALL_REDUCE_VARIANTS))
    return runs_collectives_here(rt) and not rt.tracing.enabled and config.variant in host_variants


def _abstract_eval(*avals, collective, params, config):
    """lax's shapes and effects, plus the iris kernel's (`kernel_effects`)."""
    outs, effects = [], kernel_effects(collective, config)
    for call in calls(collective, avals):
        out, effect = collective.abstract_eval(*call, **dict(params))
        outs.extend(out if collective.multiple_results else [out])
        effects |= set(effect)
    return outs, effects


iris_collective_p.def_effectful_abstract_eval(_abstract_eval)


def _impl(*xs, **params):
    return jax.jit(lambda *a: iris_collective_p.bind(*a, **params))(*xs)


iris_collective_p.def_impl(_impl)



# -- rematerialization ------------------------------------------------------------------
def _remat(saveable, unks_in, inst_in, eqn):
    """jax.checkpoint's choice for the lax collective the equation stands for: recomputed or
    saved exactly where lax's would be. (JAX's default saves every effectful equation, and the
    iris kernel effect would keep each collective's output alive through the backward pass.)"""
    collective, params = eqn.params["collective"], dict(eqn.params["params"])
    n = len(eqn.outvars)
    needed = [x for x, inst in zip(eqn.invars, inst_in) if type(x) is core.Var and not inst]
    if any(unks_in):  # depends on what the backward pass computes: it runs there
        return None, eqn, [True] * n, [True] * n, needed
    policy = pe.ensure_enum(saveable(collective, *[x.aval for x in eqn.invars], **params))
    if isinstance(policy, pe.RecomputeType):  # forward for its value, again in the backward pass
        return eqn, eqn, [False] * n, [True] * n, needed
    return eqn, None, [False] * n, [False] * n, []  # saved (an offload policy saves in place)


pe.partial_eval_jaxpr_custom_rules[iris_collective_p] = _remat


# -- lowering ---------------------------------------------------------------------------
def _lowering(ctx, *xs, collective, params, config):
    kwargs = dict(params)
    if not lowers_on_iris(ctx, axes_of(kwargs)):
        on_xla = lambda *a: [y for call in calls(collective, a) for y in _lax_bind(collective, call, kwargs)]  # noqa: E731
        return mlir.lower_fun(on_xla, multiple_results=True)(ctx, *xs)
    axis_context = ctx.module_context.axis_context
    manual_mesh = axis_context.mesh.abstract_mesh.update_axis_types(
        {a: jax.sharding.AxisType.Manual for a in axis_context.manual_axes})
    automatic = tuple(a for a in manual_mesh.axis_names if a not in axis_context.manual_axes)
    if automatic and rule_of(collective.name).has_kernel:
        return _lower_per_shard(ctx, xs, manual_mesh, automatic, collective, params, config)
    lower = lowered_on_iris(collective, params, config, concrete(axis_context.mesh))
    # the kernel calls lowered here were made at the collective's line (the simulator's call
    # records name it; lower_fun roots their own tracebacks at this rule)
    with jax.sharding.use_abstract_mesh(manual_mesh), cpu_lowering.calls_made_at(ctx):
        return mlir.lower_fun(lower, multiple_results=True)(ctx, *xs)


def lowered_on_iris(collective, params, config, mesh):
    """The function of an equation's operands that runs it on iris inside the manual `mesh`:
    its rule's kernels, or over axes that span domains its composition (`mesh` None: not
    known, as where `explain` sees only an abstract mesh: its rule's kernels)."""
    kwargs = dict(params)
    across = ()
    if mesh is not None:
        inside, across = domains.split_axes(mesh, axes_of(kwargs), _runtime.runtime())
    if across:
        return partial(domains.lower_across, collective, kwargs, config, inside, across)
    return partial(registry.lower, collective, kwargs, config)


def _lower_per_shard(ctx, xs, manual_mesh, automatic, collective, params, config):
    """The equation inside a partially manual shard_map: lowered in a nested shard_map that
    makes the remaining (automatic) axes manual too, so that each device's kernel sees its own
    shard, as every iris kernel needs (XLA's partitioner can neither replicate a kernel with
    side effects nor shard a custom call it has no rule for). The region's specs follow the
    operands' sharding (`shard_specs`): where they match XLA's choice it costs nothing."""
    rule = rule_of(collective.name)
    if rule.operands > 1:  # (ragged_all_to_all) operands and results do not pair up: replicated over them
        in_specs, out_specs = (PartitionSpec(),) * len(ctx.avals_in), (PartitionSpec(),) * len(ctx.avals_out)
    else:
        in_specs, out_specs = shard_specs(manual_mesh, automatic, partial(rule.carried, dict(params)), ctx.avals_in,
                                          ctx.avals_out)
    explicit = _explicit_axes(manual_mesh, automatic)

    def per_shard(*shards):
        return tuple(iris_collective_p.bind(*shards, collective=collective, params=params, config=config))

    region = jax.shard_map(per_shard, mesh=manual_mesh, in_specs=in_specs, out_specs=out_specs,
                           axis_names=set(automatic), check_vma=False)

    def lowered(*xs):
        # with Explicit axes the operands must have the region's types (jax 0.12 checks), and the
        # results get the types lax's rule gave them (an Explicit axis gathered along is put back)
        xs = [_retyped(x, _explicit_part(spec, explicit), explicit) for x, spec in zip(xs, in_specs)]
        outs = region(*xs)
        return [_retyped(y, _explicit_part(_spec_of(aval), explicit), explicit)
                for y, aval in zip(outs, ctx.avals_out)]

    with jax.sharding.use_abstract_mesh(manual_mesh), compat.concrete_mesh(
            concrete(ctx.module_context.axis_context.mesh)):
        return mlir.lower_fun(lowered, multiple_results=True)(ctx, *xs)


def _explicit_axes(mesh, automatic) -> set:
    return {a for a, t in zip(mesh.axis_names, mesh.axis_types) if a in automatic and t == AxisType.Explicit}


def _spec_of(aval) -> tuple:
    """The entries of an aval's sharding type, one per dimension."""
    spec = tuple(getattr(getattr(aval, "sharding", None), "spec", ()))
    return (spec + (None,) * aval.ndim)[:aval.ndim]


def _explicit_part(spec, explicit) -> tuple:
    return tuple(_explicit_only(entry, explicit) for entry in spec)


def _retyped(x, entries: tuple, explicit):
    """`x` resharded over the Explicit axes as `entries` say, where its type says otherwise."""
    if not explicit or _explicit_part(_spec_of(core.typeof(x)), explicit) == tuple(entries):
        return x
    return jax.sharding.reshard(x, jax.sharding.PartitionSpec(*entries))


def shard_specs(mesh, automatic: tuple, carried, avals_in, avals_out) -> tuple[tuple, tuple]:
    """(in_specs, out_specs) over the `automatic` axes of `mesh` for a collective's operands.

    The rule, per operand: an Explicit axis stays on the dimension its type puts it on; the
    Auto axes together (in mesh order) go on the leading dimension of an operand of rank 2 or
    more where the collective carries it through (`carried(ndim)`: Rule.carried), it holds no
    Explicit axis and its size divides by theirs: the batch dimension of the activations a
    tensor-parallel layer exchanges, which data parallelism splits. Elsewhere, scalars and
    vectors included, the operand is replicated over them: e.g. a layer norm's gradient summed
    over the batch, which XLA reduces over dp anyway (split, it would be gathered again). A
    dimension the collective gathers, scatters or splits along is never sharded over them (an
    Explicit axis there is gathered first). Each result keeps its operand's axes on the dimension the operand's became.
    """
    explicit = _explicit_axes(mesh, automatic)
    auto = tuple(a for a in automatic if a not in explicit)
    auto_size = math.prod(mesh.shape[a] for a in auto)
    in_specs, out_specs = [], []
    for aval_in, aval_out in zip(avals_in, avals_out):
        dims = carried(aval_in.ndim)
        typed = _spec_of(aval_in)
        entries = [_explicit_only(typed[i], explicit) if dims[i] is not None else None for i in range(aval_in.ndim)]
        if auto_size > 1 and aval_in.ndim >= 2 and dims[0] is not None and entries[0] is None \
                and aval_in.shape[0] % auto_size == 0:
            entries[0] = auto if len(auto) > 1 else auto[0]
        out_entries = [None] * aval_out.ndim
        for i, d in enumerate(dims):
            if d is not None:
                out_entries[d] = entries[i]
        in_specs.append(PartitionSpec(*entries))
        out_specs.append(PartitionSpec(*out_entries))
    return tuple(in_specs), tuple(out_specs)


def _explicit_only(entry, explicit):
    """A spec entry with only the Explicit axes of `explicit` (None where none is left)."""
    names = entry if isinstance(entry, tuple) else (entry,) if isinstance(entry, str) else ()
    kept = tuple(a for a in names if a in explicit)
    return None if not kept else kept[0] if len(kept) == 1 else kept


# not cacheable: a cached lowering is emitted as a function of its own, and the CPU lowering
# chains kernel calls in program order only within one block (iris_jax.calls.cpu_lowering)
mlir.register_lowering(iris_collective_p, _lowering, cacheable=False)
