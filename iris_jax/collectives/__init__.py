"""JAX's collectives on iris: the explicit API and lax's collectives run through iris kernels.

api.py holds the drop-in functions (`iris_jax.psum`, ...); rewrite.py turns lax's collectives in
a traced function into the `iris_collective` primitive (primitive.py: its abstract eval and
lowering; transforms.py: its jvp, transpose and batching rules, which run lax's through the
rewrite again); rules/ describes each collective once (its lax primitives, rows, autodiff, plan
across domains, what `explain` says) and registers it in registry.py, which everything else
reads; domains.py composes iris inside NVLink domains with XLA across them; lowering.py launches
the collective kernel (iris_core.collectives) through iris_jax.calls.

Layer: above iris_jax._runtime, iris_jax.calls and iris_jax.sync; below iris_jax.ops. Inside it,
imports go one way (tests/test_layers.py): each of lowering, registry, domains, rules, primitive,
rewrite, transforms and api imports only modules before it in this list. Importing the package
registers the rules and the transforms.
"""

from iris_jax.collectives import rules, transforms  # noqa: F401  (registers the rules and the primitive's transforms)
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
