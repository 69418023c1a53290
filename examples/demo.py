"""The README demo: iris_jax.psum as a drop-in for lax.psum, and a remote store from a kernel.

Run: python examples/demo.py   (all local GPUs; without GPUs, the CPU simulator with 4 ranks)
"""

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402
from iris_jax import Context  # noqa: E402


@triton.jit
def put_to_next(context_ptr, inbox_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    ctx.store(inbox_ptr + offs, x, to_rank=(ctx.rank + 1) % W, mask=offs < n)  # into the next GPU's heap
    tl.store(out_ptr + offs, x + ctx.rank, mask=offs < n)


def main():
    rt = iris_jax.init()
    W = rt.world_size
    mode = "CPU simulator" if rt.backend.interprets_kernels else "GPUs"
    print(f"iris_jax demo: {W} ranks on the {mode}")
    mesh = jax.make_mesh((W,), ("x",), devices=rt.devices)
    rows = NamedSharding(mesh, P("x"))
    x = jax.device_put(jax.random.normal(jax.random.key(0), (W * 37,)), rows)

    # 1. drop-in collective
    smap = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P()))
    ours, theirs = smap(lambda v: iris_jax.psum(v, "x"))(x), smap(lambda v: lax.psum(v, "x"))(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
    print(f"OK: iris_jax.psum == lax.psum over {W} ranks (max |diff| {np.abs(ours - theirs).max():.1e})")

    # 2. a kernel that writes into the next rank's heap
    inbox = iris_jax.zeros((W * 37,), jnp.float32, sharding=rows)
    step = lambda inbox, v: iris_jax.triton_call(
        inbox, v, 37, kernel=put_to_next, out_shape=jax.ShapeDtypeStruct((37,), jnp.float32), grid=(1,),
        W=W, BLOCK=64, symmetric=(0,))
    out = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))(inbox, x)
    np.testing.assert_allclose(out, np.asarray(x) + np.repeat(np.arange(W), 37), rtol=1e-6)
    print("OK: remote stores inside jax.jit(jax.shard_map(...))")


if __name__ == "__main__":
    main()
