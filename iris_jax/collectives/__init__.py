"""JAX's collectives on iris: the explicit API and lax's collectives run through iris kernels.

api.py holds the drop-in functions (`iris_jax.psum`, ...); rewrite.py turns lax's collectives in
a traced function into the `iris_collective` primitive (primitive.py: its abstract eval,
transformation rules and lowering); rules/ describes each collective once (its lax primitives,
rows, autodiff, plan across domains, what `explain` says); domains.py composes iris inside
NVLink domains with XLA across them; lowering.py launches the collective kernel
(iris_core.collectives) through iris_jax.calls.

Layer: above iris_jax._runtime, iris_jax.calls and iris_jax.sync; below iris_jax.ops.
Inside it, rewrite, primitive, rules and domains import each other, and inherently so: the
primitive's transformation rules (and a rule's jvp) apply lax's rule and run the result through
the rewrite, which binds the primitive again; a composition across domains (domains.py) runs
each of its steps through the rules again. Nothing else in iris_jax forms a cycle
(tests/test_layers.py).
"""

from iris_jax.collectives.api import (
    OPS,
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    pbroadcast,
    pmax,
    pmean,
    pmin,
    ppermute,
    pshuffle,
    psum,
    psum_scatter,
    pswapaxes,
    ragged_all_to_all,
)

__all__ = ["OPS", "all_gather", "all_reduce", "all_to_all", "broadcast", "pbroadcast", "pmax", "pmean", "pmin",
           "ppermute", "pshuffle", "psum", "psum_scatter", "pswapaxes", "ragged_all_to_all"]
