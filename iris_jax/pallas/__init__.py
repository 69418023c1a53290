"""iris_jax.pallas (experimental): the iris device API inside Pallas kernels.

    from iris_jax import pallas as ipl

    def kernel(ctx, inbox_ref, x_ref, o_ref):
        peer = (ctx.rank + 1) % ctx.world_size
        ctx.store(inbox_ref, x_ref[...], to_rank=peer)
        o_ref[...] = x_ref[...]

    step = ipl.pallas_call(kernel, out_shape=x, symmetric=(0,))

On GPUs the kernel compiles through Pallas's Triton backend (which JAX 0.11 deprecated:
hence experimental); on the CPU simulator it runs under Pallas interpret mode, every
simulated rank at once. Heap arrays also pass through plain `pl.pallas_call` (either
backend) like any array; see docs/pallas.md.
"""

from iris_jax.pallas._compat import TESTED, missing, require
from iris_jax.pallas.call import iris_pallas_call_p, pallas_call
from iris_jax.pallas.context import PallasContext
from iris_jax.pallas.primitives import iris_rma_p

if not missing():
    from iris_jax.pallas import triton_lowering as _triton_lowering  # noqa: F401  (registers the GPU rule)

__all__ = ["PallasContext", "TESTED", "iris_pallas_call_p", "iris_rma_p", "missing", "pallas_call", "require"]
