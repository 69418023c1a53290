"""lax collectives on iris: the jaxpr rewrite behind every iris collective.

`run_on_iris(fn, args, config)` traces `fn` to a jaxpr, turns each lax collective equation
that iris can run into an `iris_collective` equation (iris_jax.collectives.primitive), at any depth
(shard_map, jit, scan, cond, while, remat, custom_jvp/custom_vjp bodies), and evaluates the
result. The public collectives (`iris_jax.psum` = lax.psum run this way, ...) and
`replace_lax_collectives` are this one mechanism; `explain` shows its decisions.

Where iris does not run a collective (placement): positional axes, what lax refuses too (a
pmax of complex numbers, a psum_scatter of bools: iris_jax.collectives.dtypes.refusal;
`axis_index_groups` that do not partition the axes' members, or of unequal sizes where lax
needs equal ones), collectives over axes that are not manual shard_map axes (an automatic axis
of a partially manual shard_map), and calls with nothing to send (a group of one member,
zero-size arrays), which XLA removes. The explicit API raises for positional axes
(UnsupportedCollectiveError) and for what lax refuses (lax's own error type; `strict`);
replace_lax_collectives leaves them to XLA. Every dtype lax takes runs on iris
(iris_jax.collectives.dtypes), and so do groups that partition the members, each group as a
mesh axis's would (groups of unequal sizes: iris_jax.collectives.rules.all_reduce).
An iris equation over axes that span domains is split at lowering, where the devices are
known: iris inside each domain, XLA across (iris_jax.collectives.domains; `explain` shows the steps where
the shard_map names its mesh).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import jax
from jax import tree_util
from jax._src import core, source_info_util
from jax._src.lib import xla_client
from jax.sharding import PartitionSpec

from iris_jax import _runtime
from iris_jax.calls.triton_call import IrisKernelEffect, vary
from iris_jax.collectives import domains, dtypes, lowering
from iris_jax.collectives.primitive import freeze, iris_collective_p, kernel_effects, lowered_on_iris, shard_specs
from iris_jax.collectives.registry import Rule, axes_of, rule_of
from iris_jax.compat import ClosedJaxpr, closed_jaxpr, is_closed_jaxpr, is_jaxpr, shard_map_manual_axes
from iris_jax.config import CollectiveConfig, default_config
from iris_jax.sync import guarded_call


class UnsupportedCollectiveError(TypeError):
    """The explicit iris API was asked for a collective iris does not run."""


# -- where each collective runs ---------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Scope:
    """The mesh around an equation: axis sizes, which axes are manual, and the concrete mesh
    where a shard_map names one (None: known only at lowering)."""

    sizes: tuple = ()  # ((axis, size), ...)
    manual: frozenset = frozenset()
    mesh: object = None

    @classmethod
    def current(cls) -> Scope:
        mesh = jax.sharding.get_abstract_mesh()
        if mesh is None or mesh.empty:
            return cls()
        return cls(tuple(mesh.shape.items()), frozenset(getattr(mesh, "manual_axes", ()) or ()))

    def inside_shard_map(self, params) -> Scope:
        mesh = params["mesh"]
        newly = shard_map_manual_axes(params)
        newly = frozenset(newly) if newly is not None else frozenset(mesh.axis_names)
        concrete = mesh if isinstance(mesh, jax.sharding.Mesh) else self.mesh
        return Scope(tuple(mesh.shape.items()), self.manual | newly, concrete)


def placement(name: str, params: dict, aval, scope: Scope) -> tuple[str | None, type[Exception] | None]:
    """(why XLA runs this collective or None for iris, what the explicit API raises for it:
    UnsupportedCollectiveError, lax's own error type where lax refuses the call too, or None
    where the caller has nothing to fix)."""
    rule = rule_of(name)
    if not rule.has_kernel:  # a type cast: runs on iris so that its transpose does too
        return None, None
    axes = axes_of(params)
    if any(isinstance(a, int) for a in axes):
        return "positional (integer) axes", UnsupportedCollectiveError
    refused = dtypes.refusal(aval.dtype, rule.reduces)
    if refused is not None:
        return refused
    sizes = dict(scope.sizes)
    if any(a not in scope.manual for a in axes):
        return f"axes {axes} are not all manual shard_map axes here", None
    groups = params.get("axis_index_groups")
    members = math.prod(sizes[a] for a in axes)
    if groups is not None and not rule.runs_groups:
        return f"axis_index_groups on {rule.name}", UnsupportedCollectiveError
    if groups is not None:
        problem = groups_problem(rule, groups, members)
        if problem is not None:
            return problem
        members = max(len(g) for g in groups)
    if not rule.sends_when_trivial and members == 1:
        return "a group of one member: nothing to send (XLA removes it)", None
    if not rule.sends_when_trivial and aval.size == 0:
        return "zero-size: nothing to send (XLA removes it)", None
    return None, None


def groups_problem(rule: Rule, groups: tuple, members: int) -> tuple[str, type[Exception]] | None:
    """Why iris does not run `rule`'s collective over `axis_index_groups` of axes of `members` members, and the
    error the explicit API raises: lax's where lax refuses them as well (at lowering or
    compilation, where iris raises while tracing), else UnsupportedCollectiveError. None: iris runs them.
    (lax itself checks that the groups hold each of 0 .. their total exactly once.)"""
    total = sum(len(g) for g in groups)
    fix = "; pass groups that together hold each index of the axes once"
    if total > members:  # lax indexes the axis with them
        return f"axis_index_groups {groups} name members beyond the {members} of the axes{fix}", IndexError
    if total < members:
        return (f"axis_index_groups {groups} do not cover the {members} members of the axes (XLA refuses it){fix}",
                jax.errors.JaxRuntimeError)
    if len({len(g) for g in groups}) > 1 and rule.equal_groups_by_lax:
        return (f"axis_index_groups {groups} of unequal sizes (lax's {rule.name} needs equal ones); pass groups "
                "of equal size", ValueError)
    return None


# -- the rewrite ------------------------------------------------------------------------
class Decision(NamedTuple):
    """Where the rewrite put one collective equation (what `explain` reports): lax's primitive
    `name` and `params`, its first operand's `aval`, the `reason` it stays on XLA (None: it runs
    on iris), the mesh `scope` around it, the `config` it runs with, and on iris the kernel
    launches that lowering its equation makes (`planned_launches`; one equation may carry
    several collectives of a pytree, which then share them)."""
    name: str
    params: dict
    aval: core.AbstractValue
    reason: str | None
    scope: Scope
    config: CollectiveConfig
    launches: tuple = ()


@dataclasses.dataclass
class _Rewriter:
    config: CollectiveConfig
    strict: bool
    merge: bool = True
    decisions: list[Decision] = dataclasses.field(default_factory=list)
    memo: dict = dataclasses.field(default_factory=dict)
    plan: bool = False  # record each iris equation's launches (`explain`)
    launches: dict = dataclasses.field(default_factory=dict)  # an iris equation's outvar -> its launches
    decided: list = dataclasses.field(default_factory=list)  # per decision: its equation's first outvar

    def closed(self, closed: ClosedJaxpr, scope: Scope) -> ClosedJaxpr:
        return closed_jaxpr(self.jaxpr(closed.jaxpr, scope), closed.consts)

    def jaxpr(self, jaxpr: core.Jaxpr, scope: Scope) -> core.Jaxpr:
        key = (id(jaxpr), scope)
        if key not in self.memo:
            eqns = [self.eqn(e, scope) for e in jaxpr.eqns]
            effects = with_kernel_effects(jaxpr.effects, [e.effects for e in eqns])
            eqns = merge_launches(eqns) if self.merge else eqns
            if self.plan:
                for e in eqns:
                    if e.primitive is iris_collective_p and rule_of(e.params["collective"].name).has_kernel:
                        launches = tuple(planned_launches(e, scope))
                        self.launches.update((v, launches) for v in e.outvars)
            self.memo[key] = (jaxpr, jaxpr.replace(eqns=eqns, effects=effects))
        return self.memo[key][1]

    def eqn(self, eqn, scope: Scope):
        name = eqn.primitive.name
        rule = rule_of(name)
        if rule is not None:
            aval = eqn.invars[0].aval
            reason, refusal = placement(name, eqn.params, aval, scope)
            self.decisions.append(Decision(name, eqn.params, aval, reason, scope, self.config))
            self.decided.append(eqn.outvars[0])
            if reason is None:
                params = dict(collective=eqn.primitive, params=freeze(eqn.params), config=self.config)
                added = kernel_effects(eqn.primitive, self.config)
                return eqn.replace(primitive=iris_collective_p, params=params,
                                   effects=with_kernel_effects(eqn.effects, [added]))
            if self.strict and refusal is UnsupportedCollectiveError:
                raise UnsupportedCollectiveError(
                    f"iris_jax.{rule.name}: unsupported {reason}; use jax.lax.{rule.name} "
                    "(or iris_jax.replace_lax_collectives, which leaves such calls to XLA)")
            if self.strict and refusal is not None:  # lax refuses the call too, later
                raise refusal(f"iris_jax.{rule.name}: {reason}")
            return eqn
        if eqn.primitive is iris_collective_p:
            self.decisions.append(Decision(eqn.params["collective"].name, dict(eqn.params["params"]),
                                           eqn.invars[0].aval, None, scope, eqn.params["config"]))
            self.decided.append(eqn.outvars[0])
            return eqn
        inner = scope.inside_shard_map(eqn.params) if name == "shard_map" else scope
        params = {k: self.param(v, inner) for k, v in eqn.params.items()}
        if all(params[k] is v for k, v in eqn.params.items()):
            return eqn
        return eqn.replace(params=params, effects=with_kernel_effects(eqn.effects, _body_effects(params)))

    def param(self, value, scope: Scope):
        if is_closed_jaxpr(value):
            return self.closed(value, scope)
        if isinstance(value, core.Jaxpr):
            return self.jaxpr(value, scope)
        if isinstance(value, tuple) and any(is_jaxpr(v) for v in value):
            return tuple(self.param(v, scope) for v in value)
        return value


def with_kernel_effects(effects, held: list):
    """`effects` (of an equation or a jaxpr) with the iris kernel effects among `held` (the effects
    of what it holds: its body's, or its equations'). The rewrite puts kernels into jaxprs traced
    without them; every primitive that holds a jaxpr (jit, scan, while, cond, shard_map, remat,
    custom_jvp/custom_vjp) carries its body's effects of this kind, as tracing would have given
    it, and JAX's checks (jax_enable_checks) compare the two."""
    added = {e for found in held for e in found if isinstance(e, IrisKernelEffect)} - set(effects)
    return effects if not added else type(effects)(set(effects) | added)


def _body_effects(params: dict) -> list:
    """The effects of each jaxpr among an equation's parameters."""
    found = []
    for value in params.values():
        for v in value if isinstance(value, tuple) else (value,):
            if isinstance(v, ClosedJaxpr):
                found.append(v.jaxpr.effects)
            elif isinstance(v, core.Jaxpr):
                found.append(v.effects)
    return found


def merge_launches(eqns: list) -> list:
    """Iris equations of one collective, parameters and dtype whose operands do not depend on
    each other become one equation (one kernel launch for a pytree). Each is held back until
    an equation needs one of its results."""
    out, open_groups, owner = [], {}, {}

    def flush(key):
        group = open_groups.pop(key)
        for e in group:
            for v in e.outvars:
                owner.pop(v, None)
        if len(group) == 1:
            out.append(group[0])
        else:
            out.append(group[0].replace(invars=[v for e in group for v in e.invars],
                                        outvars=[v for e in group for v in e.outvars],
                                        effects=frozenset().union(*[e.effects for e in group])))

    for eqn in eqns:
        for key in {owner[v] for v in eqn.invars if isinstance(v, core.Var) and v in owner}:
            flush(key)
        rule = rule_of(eqn.params["collective"].name) if eqn.primitive is iris_collective_p else None
        if rule is not None and rule.has_kernel and rule.operands == 1:
            p = eqn.params
            key = (p["collective"], p["params"], p["config"], tuple(v.aval.dtype for v in eqn.invars))
            open_groups.setdefault(key, []).append(eqn)
            for v in eqn.outvars:
                owner[v] = key
        else:
            out.append(eqn)
    for key in list(open_groups):
        flush(key)
    return out


def run_on_iris(fn: Callable, args: tuple, config: CollectiveConfig | None = None, *, strict: bool = True,
                merge: bool = True, decisions: list | None = None):
    """`fn(*args)` with its lax collectives on iris (see the module docstring).

    `merge=False` keeps one launch per collective: transformation rules need it, since a
    launch merged from a primal and a tangent collective would make both tangents.
    """
    config = config or default_config()
    flat, tree = tree_util.tree_flatten(args)
    closed, out_shape = jax.make_jaxpr(lambda *a: fn(*tree_util.tree_unflatten(tree, a)), return_shape=True)(*flat)
    rewriter = _Rewriter(config, strict, merge, plan=decisions is not None)
    closed = rewriter.closed(closed, Scope.current())
    if decisions is not None:
        decisions.extend(d._replace(launches=rewriter.launches.get(v, ())) if d.reason is None else d
                         for d, v in zip(rewriter.decisions, rewriter.decided))
    out = core.eval_jaxpr(_called_from_here(closed.jaxpr), closed.consts, *flat)
    return tree_util.tree_unflatten(tree_util.tree_structure(out_shape), out)


def planned_launches(eqn, scope: Scope) -> list[lowering.Launched]:
    """The kernel launches that lowering the iris equation `eqn` makes, found by tracing its
    lowering (iris_jax.collectives.primitive.lowered_on_iris) over the scope's mesh: the launch
    plans it records are the ones the compiled program runs (nothing is compiled or allocated).
    In a partially manual shard_map the operands are the shards the lowering gives each device."""
    collective, params, config = eqn.params["collective"], eqn.params["params"], eqn.params["config"]
    names = tuple(a for a, _ in scope.sizes)
    mesh = scope.mesh or jax.sharding.AbstractMesh(tuple(n for _, n in scope.sizes), names)
    avals_in = [v.aval for v in eqn.invars]
    automatic = tuple(a for a in names if a not in scope.manual)
    rule = rule_of(collective.name)
    shapes = [a.shape for a in avals_in]
    if automatic and rule.operands == 1:
        in_specs, _ = shard_specs(mesh, automatic, functools.partial(rule.carried, dict(params)), avals_in,
                                  [v.aval for v in eqn.outvars])
        shapes = [_shard_shape(a.shape, spec, dict(scope.sizes)) for a, spec in zip(avals_in, in_specs)]
    lower = lowered_on_iris(collective, params, config, scope.mesh)

    def body(*xs):  # the operands vary over every axis, as a collective's operands may; only launches matter
        lower(*[vary(x, names) for x in xs])
        return ()

    traced = jax.shard_map(body, mesh=mesh, in_specs=(PartitionSpec(),) * len(avals_in), out_specs=())
    with lowering.recording() as launches:
        jax.make_jaxpr(traced)(*[jax.ShapeDtypeStruct(s, a.dtype) for s, a in zip(shapes, avals_in)])
    return launches


def _shard_shape(shape: tuple, spec: PartitionSpec, sizes: dict) -> tuple:
    """A device's shard of an array of `shape` split as `spec` says."""
    entries = tuple(spec) + (None,) * (len(shape) - len(spec))
    return tuple(n // math.prod(sizes[a] for a in ((e,) if isinstance(e, str) else e or ()))
                 for n, e in zip(shape, entries))


def _called_from_here(jaxpr: core.Jaxpr) -> core.Jaxpr:
    """`jaxpr`'s equations with this call's frames after their own: make_jaxpr rooted their
    tracebacks at its own entry, so the line that called iris (the user's) was not in them."""
    caller = source_info_util.current().traceback
    if caller is None:
        return jaxpr
    return jaxpr.replace(eqns=[e.replace(source_info=e.source_info.replace(
        traceback=(e.source_info.traceback or xla_client.Traceback()) + caller)) for e in jaxpr.eqns])


def replace_lax_collectives(f: Callable, *, config: CollectiveConfig | None = None) -> Callable:
    """`f` with every jax.lax collective it calls, at any depth, on iris where iris runs the
    call and on XLA where it does not (see `explain`).

    The result is jitted (arguments are arrays or pytrees of arrays, as for jax.jit) and
    composes with every JAX transformation; `f` itself is unchanged. Each call first raises a
    fault that an iris kernel recorded since (iris_jax._runtime.faults), and the error of a call whose
    kernel trapped comes as the fault it stands for.
    """
    config = config or default_config()

    @functools.wraps(f)
    def replaced(*args, **kwargs):
        return run_on_iris(lambda a, k: f(*a, **k), (args, kwargs), config, strict=False)

    return _FaultChecked(jax.jit(replaced))


class _FaultChecked:
    """A jitted function whose calls pass through iris_jax.sync.guarded_call; everything else
    (lower, trace, eval_shape, ...) is the jitted function's."""

    def __init__(self, jitted):
        self._jitted = jitted
        functools.update_wrapper(self, jitted)

    def __call__(self, *args, **kwargs):
        return guarded_call(self._jitted, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._jitted, name)


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one collective of a traced function runs."""

    op: str
    axes: tuple
    shape: tuple
    dtype: str
    nbytes: int
    runs_on: str  # "iris" or "XLA"
    why: str
    workspace: str = ""  # on iris: the workspace its kernel uses, part and size class ("collective 64 KiB")

    def __str__(self):
        workspace = f" [workspace {self.workspace}]" if self.workspace else ""
        return (f"{self.op:<13} {str(self.axes):<14} {self.dtype:<9} {str(self.shape):<18} "
                f"{self.nbytes:>12,d} B  {self.runs_on:<4} {self.why}{workspace}")


def explain(f: Callable, *args, config: CollectiveConfig | None = None, **kwargs) -> list[Placement]:
    """Each collective `replace_lax_collectives(f)(*args, **kwargs)` would run (iris
    collectives called explicitly included): its op, axes, shape, dtype, bytes per rank,
    where it runs and why, and on iris the workspace its kernel uses (its part and size class,
    in the workspaces of the partition its axes make: iris_jax._runtime.workspace); one row per
    step where its axes span domains (the steps' bytes per rank, the collective's shape).
    Collectives of one pytree share a launch, and so its workspace.
    `print(*explain(...), sep="\\n")` shows a table."""
    decisions: list[Decision] = []
    config = config or default_config()
    jax.make_jaxpr(lambda *a, **k: run_on_iris(lambda a, k: f(*a, **k), (a, k), config, strict=False,
                                                decisions=decisions))(*args, **kwargs)
    rows = []
    for name, params, aval, reason, scope, used, launches in decisions:  # used: the config it runs with
        rule = rule_of(name)
        if not rule.has_kernel:
            continue
        nbytes = int(aval.size) * aval.dtype.itemsize
        if reason is None and scope.mesh is not None:  # where the axes span domains: a row per step
            inside, across = domains.split_axes(scope.mesh, axes_of(params), _runtime.runtime())
            steps = iter(launches)  # one launch per step on iris, in order
            for part in domains.plan(name, params, nbytes, dict(scope.sizes), inside, across, used):
                why = part.why or rule.detail(params, used) + _groups_detail(params)
                workspace = _workspaces([next(steps, None)]) if part.on_iris else ""
                rows.append(Placement(part.op, part.axes, tuple(aval.shape), aval.dtype.name, part.nbytes,
                                      "iris" if part.on_iris else "XLA", why, workspace))
            continue
        why = reason or rule.detail(params, used) + _groups_detail(params)
        rows.append(Placement(rule.name, axes_of(params), tuple(aval.shape), aval.dtype.name,
                              nbytes, "XLA" if reason else "iris", why, _workspaces(launches)))
    return rows


def _workspaces(launches) -> str:
    """The workspaces `launches` use, as `explain` names them."""
    names = dict.fromkeys(lowering.workspace_name(la.workspace) for la in launches if la is not None)
    return ", ".join(names)


def _groups_detail(params: dict) -> str:
    groups = params.get("axis_index_groups")
    return f" over axis_index_groups {groups}" if groups is not None else ""
