"""JAX's collectives on the symmetric heap: drop-in replacements for jax.lax's.

Inside `jax.shard_map`, `iris_jax.psum(x, "i")` returns what `lax.psum(x, "i")` returns, and
is exactly that: lax.psum traced and run with iris kernels (iris_jax.collectives.rewrite), so lax's
argument conventions, errors, dtype handling (bool sums as int32), pytrees and varying-axes
types hold, and every transformation (jit, grad, jvp, vmap, remat, scan, ...) works through
the `iris_collective` primitive's rules (iris_jax.collectives.primitive). How the kernels run:
iris_jax.collectives.lowering.

Each function takes `config=` (an iris_jax.CollectiveConfig; default: the environment's).
Every dtype lax takes runs on iris (iris_jax.collectives.dtypes), psum / pmean of constants give
lax's trace-time answer, and `axis_index_groups` (where lax takes them: pmax, pmin, all_gather,
psum_scatter, all_to_all, ragged_all_to_all, and psum / pmean under `check_vma=False`) run on
iris, each group as a mesh axis's group would (groups of unequal sizes too, where lax takes
them). The explicit API never falls back to XLA silently: positional axes raise
UnsupportedCollectiveError; calls with nothing to send (a group of one, zero-size arrays) emit
no kernel, as with lax. An axis name that is not bound where a
collective is called raises NameError naming it and the bound axes (`check_bound`). Over axes that span
domains (ranks whose heaps cannot map each other), iris runs inside each domain and XLA across
(iris_jax.collectives.domains).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax import tree_util
from jax._src import core

from iris_core.collectives.algorithms import ALGORITHMS
from iris_jax.calls.triton_call import vary
from iris_jax.collectives.lowering import group_size
from iris_jax.collectives.rewrite import run_on_iris
from iris_jax.compat import lax_parallel
from iris_jax.config import VARIANTS, CollectiveConfig, default_config

OPS = ("sum", "max", "min")


def _config(config: CollectiveConfig | None, **changes) -> CollectiveConfig:
    config = config or default_config()
    changes = {k: v for k, v in changes.items() if v is not None}
    return config.replace(**changes) if changes else config


def psum(x, axis_name, *, axis_index_groups=None, variant: str | None = None, config: CollectiveConfig | None = None):
    """Like `lax.psum`: the sum of `x` over the members of `axis_name`.

    Args:
      x: an array or a pytree of arrays (bool sums as int32, as lax's).
      axis_name: a mesh axis name of the enclosing `shard_map`, or a tuple of them.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      variant: the all-reduce algorithm (see `all_reduce`; default: by size).
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The sum, with `x`'s structure, shapes and dtypes, the same on every member.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "psum")
    if _constant(x):  # lax's answer while tracing (a Python number for a Python number): nothing to send
        return lax_parallel.psum(x, axis_name, axis_index_groups=axis_index_groups)
    return run_on_iris(lambda v: lax_parallel.psum(v, axis_name, axis_index_groups=axis_index_groups), (x,),
                       _config(config, variant=variant))


def pmean(x, axis_name, *, axis_index_groups=None, variant: str | None = None,
          config: CollectiveConfig | None = None):
    """Like `lax.pmean`: the mean of `x` over the members of `axis_name`.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      variant: the all-reduce algorithm (see `all_reduce`).
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The mean, with `x`'s structure, shapes and dtypes.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "pmean")
    if _constant(x):  # as psum's
        return lax_parallel.pmean(x, axis_name, axis_index_groups=axis_index_groups)
    return run_on_iris(lambda v: lax_parallel.pmean(v, axis_name, axis_index_groups=axis_index_groups), (x,),
                       _config(config, variant=variant))


def pmax(x, axis_name, *, axis_index_groups=None, config: CollectiveConfig | None = None):
    """Like `lax.pmax`: the elementwise maximum of `x` over the members of `axis_name`.

    Differentiable, unlike lax's: the tangent is that of the members holding the maximum.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The maximum, with `x`'s structure, shapes and dtypes.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "pmax")
    return run_on_iris(lambda v: lax_parallel.pmax(v, axis_name, axis_index_groups=axis_index_groups), (x,),
                       _config(config))


def pmin(x, axis_name, *, axis_index_groups=None, config: CollectiveConfig | None = None):
    """Like `lax.pmin`: the elementwise minimum of `x` over the members of `axis_name`.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The minimum, with `x`'s structure, shapes and dtypes.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "pmin")
    return run_on_iris(lambda v: lax_parallel.pmin(v, axis_name, axis_index_groups=axis_index_groups), (x,),
                       _config(config))


def all_reduce(x, axis_name, op: str = "sum", variant: str = "auto", *, timeout_s: float | None = None,
               config: CollectiveConfig | None = None):
    """Reduces `x` (a pytree) over `axis_name` with `op` ("sum", "max", "min").

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      op: "sum", "max" or "min".
      variant: "one_shot" (every rank reads every peer's input), "two_shot" (reduce-scatter
        then all-gather), "ring" (2(G-1) neighbour steps, up to 32 ranks), "atomic" (remote
        atomic adds into every rank's accumulator; float32/int32 sums), "spinlock"
        (read-add-write under a per-tile lock on every rank; sums), or "auto" (by size);
        what each runs: iris_core.collectives.algorithms.
      timeout_s: how long to wait for a peer before failing (default: the config's).
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The reduction, with `x`'s structure, shapes and dtypes, the same on every member.

    Raises:
      ValueError / TypeError: an unknown op or variant, or a variant that cannot run `op` or
        a leaf's dtype.
      NameError: `axis_name` names an axis that is not bound here.
    """
    check_bound(axis_name, "all_reduce")
    if op not in OPS:
        raise ValueError(f"unknown reduction {op!r}; choose one of {OPS}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown all_reduce variant {variant!r}; choose one of {VARIANTS}")
    named = ALGORITHMS.get(variant)  # None: auto, which chooses among those that run the call
    if named:
        named.check(op)
        for leaf in tree_util.tree_leaves(x):
            named.check(op, jnp.dtype(leaf.dtype).name)
        named.check(op, members=_axes_size(axis_name))
    reduce = {"sum": lax_parallel.psum, "max": lax_parallel.pmax, "min": lax_parallel.pmin}[op]
    return run_on_iris(lambda v: reduce(v, axis_name), (x,), _config(config, variant=variant, timeout_s=timeout_s))


def all_gather(x, axis_name, *, axis_index_groups=None, axis: int = 0, tiled: bool = False, to: str = "varying",
               config: CollectiveConfig | None = None):
    """Like `lax.all_gather`: every member's `x`, stacked (or concatenated) along `axis`.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      axis: where the members' blocks go.
      tiled: concatenate along `axis` instead of stacking on a new one.
      to: "varying" (lax's type) or "invarying" (the result has the same type on every member).
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The gathered array(s).

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "all_gather")
    return run_on_iris(lambda v: lax_parallel.all_gather(v, axis_name, axis_index_groups=axis_index_groups, axis=axis,
                                                         tiled=tiled, to=to), (x,), _config(config))


def psum_scatter(x, axis_name, *, scatter_dimension: int = 0, axis_index_groups=None, tiled: bool = False,
                 config: CollectiveConfig | None = None):
    """Like `lax.psum_scatter`: member i gets block i (along `scatter_dimension`) of the sum.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      scatter_dimension: the dimension split among the members.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      tiled: keep the split dimension (each member's block) instead of removing it.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      This member's block of the sum.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "psum_scatter")
    return run_on_iris(lambda v: lax_parallel.psum_scatter(v, axis_name, scatter_dimension=scatter_dimension,
                                                  axis_index_groups=axis_index_groups, tiled=tiled), (x,),
                       _config(config))


def all_to_all(x, axis_name, split_axis: int, concat_axis: int, *, axis_index_groups=None, tiled: bool = False,
               config: CollectiveConfig | None = None):
    """Like `lax.all_to_all`: block j of `x` along `split_axis` goes to member j, and the blocks
    received are placed along `concat_axis`.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      split_axis: the dimension split among the members.
      concat_axis: the dimension the received blocks are placed along.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      tiled: split and concatenate within the dimensions instead of adding one.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The exchanged array(s).

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "all_to_all")
    return run_on_iris(lambda v: lax_parallel.all_to_all(v, axis_name, split_axis, concat_axis,
                                                axis_index_groups=axis_index_groups, tiled=tiled), (x,),
                       _config(config))


def ppermute(x, axis_name, perm: Sequence[tuple[int, int]], *, config: CollectiveConfig | None = None):
    """Like `lax.ppermute`: member `dst` receives `src`'s `x` for each (src, dst) of `perm`.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      perm: (source, destination) pairs of axis indices, each at most once on either side.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      What this member received; zeros where no pair names it as a destination.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "ppermute")
    return run_on_iris(lambda v: lax_parallel.ppermute(v, axis_name, perm), (x,), _config(config))


def pshuffle(x, axis_name, perm: Sequence[int], *, config: CollectiveConfig | None = None):
    """Like `lax.pshuffle`: member i receives member `perm[i]`'s `x` (a ppermute).

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      perm: a permutation of the axis indices.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      What this member received.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "pshuffle")
    return run_on_iris(lambda v: lax_parallel.pshuffle(v, axis_name, perm), (x,), _config(config))


def pswapaxes(x, axis_name, axis: int, *, axis_index_groups=None, config: CollectiveConfig | None = None):
    """Like `lax.pswapaxes`: swaps the mapped axis with positional `axis` (an all_to_all).

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      axis: the positional axis swapped with the mapped one.
      axis_index_groups: lax's groups of axis indices, each reduced on its own.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      The swapped array(s).

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "pswapaxes")
    return run_on_iris(lambda v: lax_parallel.pswapaxes(v, axis_name, axis, axis_index_groups=axis_index_groups),
                       (x,), _config(config))


def ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, *, axis_name,
                      axis_index_groups=None, config: CollectiveConfig | None = None):
    """Like `lax.ragged_all_to_all`: slice k of my `operand` (rows input_offsets[k], + send_sizes[k])
    goes to member k // (K / G), at rows output_offsets[k] of its `output`; rows nobody writes
    keep `output`'s values. On iris each receiver pulls its slices straight into its output
    (iris_core.collectives.ragged).

    One difference from lax: the result varies over `axis_name`. lax types it as `output`, so
    with an output that does not vary (`jnp.zeros(...)`, the usual buffer) the result is typed
    the same on every member, and its gradient is summed over the members: wrong. Mark such a
    buffer varying (`lax.pcast(buf, axis_name, to="varying")`) when calling lax's.

    Args:
      operand: [N, ...] the rows this member sends.
      output: [M, ...] the buffer the received rows land in (aliased by the result).
      input_offsets: [K] int32: slice k's first row in `operand`.
      send_sizes: [K] int32: slice k's number of rows.
      output_offsets: [K] int32: where slice k lands in its receiver's `output`.
      recv_sizes: [K] int32: the lengths of the slices this member receives (lax's argument).
      axis_name: a mesh axis name, or a tuple of them.
      axis_index_groups: lax's groups of axis indices (equal sizes, a group of one included).
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      `output` with the received rows written.

    Raises:
      TypeError / ValueError: lax's operand checks, in lax's order.
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: a call iris cannot run.
    """
    args = (operand, output, input_offsets, send_sizes, output_offsets, recv_sizes)
    jax.eval_shape(lambda *a: lax_parallel.ragged_all_to_all(*a, axis_name=()), *args)  # lax's operand checks first
    check_bound(axis_name, "ragged_all_to_all")
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    return run_on_iris(lambda operand, output, *rest: lax_parallel.ragged_all_to_all(
        operand, vary(output, axes), *rest, axis_name=axis_name, axis_index_groups=axis_index_groups),
        args, _config(config))


def pbroadcast(x, axis_name, source: int, *, config: CollectiveConfig | None = None):
    """Like `lax.pbroadcast`: every member gets member `source`'s `x`.

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      source: the axis index of the member whose `x` everyone gets.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      Member `source`'s `x`, on every member.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    check_bound(axis_name, "pbroadcast")
    if not 0 <= source < _axes_size(axis_name):
        raise ValueError(f"pbroadcast: source {source} out of range for axis size {_axes_size(axis_name)}")
    return run_on_iris(lambda v: lax_parallel.pbroadcast(v, axis_name, source), (x,), _config(config))


def broadcast(x, axis_name, root: int = 0, *, config: CollectiveConfig | None = None):
    """Every member of the group gets member `root`'s `x` (`pbroadcast` with a default root).

    Args:
      x: an array or a pytree of arrays.
      axis_name: a mesh axis name, or a tuple of them.
      root: the axis index of the member whose `x` everyone gets.
      config: an iris_jax.CollectiveConfig (default: the environment's, `default_config()`).

    Returns:
      Member `root`'s `x`, on every member.

    Raises:
      NameError: `axis_name` names an axis that is not bound here.
      UnsupportedCollectiveError: positional (integer) axes; iris never falls back to XLA
        silently.
    """
    return pbroadcast(x, axis_name, root, config=config)


def _constant(x) -> bool:
    """Whether no leaf of `x` is a tracer: lax's psum then computes its result while tracing
    (`psum(1, axis)` is the axis's size as a Python int, a shape or a loop bound), and so does
    iris's, with lax's own code."""
    return not any(isinstance(leaf, core.Tracer) for leaf in tree_util.tree_leaves(x))


def _axes_size(axis_name) -> int:
    return group_size(tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,))


# the name lax's own unbound-axis error gives for the collective (jax._src.lax.parallel's
# `_check_axis_names`: its reductions check as psum, pshuffle and pbroadcast as ppermute)
_LAX_CHECK_NAME = {"pmean": "psum", "pmax": "psum", "pmin": "psum", "all_reduce": "psum", "pshuffle": "ppermute",
                   "pbroadcast": "ppermute"}


def check_bound(axis_name, what: str) -> None:
    """Raises NameError naming each axis of `axis_name` that is not bound where the collective is
    traced, and the axes that are (lax's own error is a bare AssertionError under check_vma).
    The message starts with lax's own sentence for the first of them ("Found an unbound axis
    name: x. To fix this, please call psum under `jax.shard_map`."), so that code matching lax's
    error matches iris's. Positional (integer) axes are left to the rewrite, which refuses them."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    bound = tuple(core.unsafe_get_axis_names())
    unbound = [a for a in axes if not isinstance(a, int) and a not in bound]
    if not unbound:
        return
    where = (f"the axes bound here are {bound}" if bound else "no axis is bound here (outside jax.shard_map)")
    lax_says = (f"Found an unbound axis name: {unbound[0]}. To fix this, please call "
                f"{_LAX_CHECK_NAME.get(what, what)} under `jax.shard_map`.")
    raise NameError(f"{lax_says} iris_jax.{what}: unbound axis name: {', '.join(map(repr, unbound))}; {where}. Call "
                    "it inside jax.shard_map over a mesh with that axis, or pass one of the bound axes")
