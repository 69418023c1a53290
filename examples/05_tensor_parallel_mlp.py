"""A tensor-parallel MLP block, forward and backward, with iris's fused GEMM + communication.

    h = gelu(all_gather(x) @ W1)      column-parallel: iris_jax.ops.all_gather_matmul
    y = psum(h @ W2)                  row-parallel:    iris_jax.ops.matmul_all_reduce

Each rank holds a row block of the activations x (sequence parallel), a column block of
W1 and the matching row block of W2. The script computes the loss sum(y^2) and its
gradients for x, W1 and W2 with jax.value_and_grad inside jit(shard_map(...)) and checks
them against plain (unsharded) JAX. A second forward uses the reduce-scatter form
(y stays sequence-parallel: iris_jax.ops.matmul_reduce_scatter).

Run: python examples/05_tensor_parallel_mlp.py
(all local GPUs, bfloat16, B = D = 4096, H = 16384; without GPUs the CPU simulator with
4 ranks and tiny float32 sizes)
"""

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402
from iris_jax import ops  # noqa: E402


def main():
    rt = iris_jax.init()
    W = len(rt.devices)
    gpu = jax.devices()[0].platform == "gpu"
    B, D, H = (4096, 4096, 16384) if gpu else (6 * W, 20, 9 * W)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    mesh = jax.make_mesh((W,), ("tp",), devices=rt.devices)
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (B, D), jnp.float32).astype(dtype)
    w1 = (jax.random.normal(keys[1], (D, H), jnp.float32) / np.sqrt(D)).astype(dtype)
    w2 = (jax.random.normal(keys[2], (H, D), jnp.float32) / np.sqrt(H)).astype(dtype)
    specs = (P("tp", None), P(None, "tp"), P("tp", None))  # x rows, W1 columns, W2 rows
    args = [jax.device_put(v, NamedSharding(mesh, s)) for v, s in zip((x, w1, w2), specs)]

    def block(x, w1, w2):
        h = jax.nn.gelu(ops.all_gather_matmul(x, w1, "tp"))   # [B, H / W]
        return ops.matmul_all_reduce(h, w2, "tp")              # [B, D], the same on every rank

    def loss(x, w1, w2):
        y = block(x, w1, w2)
        return jnp.sum(jnp.square(y.astype(jnp.float32)))     # same on every rank

    step = jax.jit(jax.shard_map(jax.value_and_grad(loss, argnums=(0, 1, 2)), mesh=mesh, in_specs=specs,
                                 out_specs=(P(), specs)))
    value, (gx, gw1, gw2) = step(*args)

    def block_rs(x, w1, w2):  # row-parallel output kept sequence-parallel: [B / W, D]
        return ops.matmul_reduce_scatter(jax.nn.gelu(ops.all_gather_matmul(x, w1, "tp")), w2, "tp")

    y_rs = jax.jit(jax.shard_map(block_rs, mesh=mesh, in_specs=specs, out_specs=P("tp", None)))(*args)

    # plain JAX on whole arrays, float32 (a separate jit: no iris kernel in it)
    def loss_ref(x, w1, w2):
        y = jax.nn.gelu(x @ w1) @ w2
        return jnp.sum(jnp.square(y)), y

    f32 = [v.astype(jnp.float32) for v in (x, w1, w2)]
    (value_ref, y_ref), grads_ref = jax.jit(jax.value_and_grad(loss_ref, argnums=(0, 1, 2), has_aux=True))(*f32)
    tol = 5e-2 if dtype == jnp.bfloat16 else 1e-4

    def check(name, got, want):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        err = float(np.abs(got - want).max() / max(1e-6, np.abs(want).max()))
        print(f"  {name:<8} max |diff| / max |ref| = {err:.2e}")
        assert err < tol, f"{name}: relative error {err} above {tol}"

    print(f"{W} ranks ({'GPUs' if gpu else 'CPU simulator'}), B={B} D={D} H={H}, {jnp.dtype(dtype).name}")
    check("loss", value, value_ref)
    check("dx", gx, grads_ref[0])
    check("dW1", gw1, grads_ref[1])
    check("dW2", gw2, grads_ref[2])
    check("y (rs)", y_rs, y_ref)
    print("tensor-parallel MLP forward and backward match plain JAX")


if __name__ == "__main__":
    main()
