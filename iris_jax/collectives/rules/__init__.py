"""One rule per lax collective that iris runs: what iris knows about it, in one place.

As JAX's own `jax/_src/lax/parallel.py` keeps each collective's rules side by side, each module
here describes one collective (or a family sharing a kernel kind): the lax primitives it covers,
the name users know it by, how its operands become the collective kernel's [blocks, m] rows and
back (`lower`), its autodiff where lax's own rule does not serve (`jvp`, `transpose`), its steps
where its axes span domains (`plan` for `explain`, `lower_across` for the program), and what
`explain` says when it runs on iris. Each module registers its Rule in
iris_jax.collectives.registry, which the rewrite, the primitive's rules and the compositions
across domains (iris_jax.collectives.domains) read: they hold no branch on a collective's name.
The kernel launch itself is iris_jax.collectives.lowering's.

A new collective is a module here and its line in the import below.
"""

# every collective iris runs, in the order of lax's documentation (each module registers its rule)
from iris_jax.collectives.rules import (
    all_gather,
    all_reduce,
    all_to_all,
    pbroadcast,
    ppermute,
    psum_scatter,
    pvary,
    ragged_all_to_all,
)

__all__ = ["all_gather", "all_reduce", "all_to_all", "pbroadcast", "ppermute", "psum_scatter", "pvary",
           "ragged_all_to_all"]
