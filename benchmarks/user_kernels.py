"""User kernels that the simulator benchmarks time (a module of theirs, not a script: imported
after the script has set up JAX, since it imports iris_jax)."""

import triton
import triton.language as tl

from iris_jax import Context


@triton.jit
def put_to_next(context_ptr, inbox_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """The README's kernel: my block into the next rank's inbox, and my block plus my rank out."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    ctx.store(inbox_ptr + offs, x, to_rank=(ctx.rank + 1) % W, mask=offs < n)
    tl.store(out_ptr + offs, x + ctx.rank, mask=offs < n)
