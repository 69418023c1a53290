"""Tensor parallelism by hand, FSDP by the compiler: a transformer block in a partially manual shard_map.

    block = jax.shard_map(block_body, mesh=mesh, in_specs=..., out_specs=..., axis_names={"tp"})

`block_body` is written per tensor-parallel rank against jax.lax (Megatron-style with
sequence parallelism): the residual stream is split over "tp" along the sequence; before
attention and before the MLP, `lax.all_gather` brings the whole sequence in, the heads and
the MLP's hidden units are split over "tp", and `lax.psum_scatter` sums the partial outputs
and splits the sequence again. Mesh axis "dp" is left to the compiler (`axis_names={"tp"}`):
the batch is split over it, and the weights are stored split over it too (FSDP), so XLA
gathers them where they are used and scatters their gradients. `jax.grad` of the loss gives
the backward pass (lax's transposes: psum_scatter for all_gather and back, and a psum over
"tp" for the layer norms' scales, which every tp rank shares).

The script runs one SGD step with XLA's collectives and under
`iris_jax.replace_lax_collectives`, checks that both give the same loss and parameters,
and prints where each collective runs (`iris_jax.explain`): the tp collectives on iris, the
dp communication XLA's own.

Run: python examples/08_tp_fsdp_transformer.py
(GPUs: every local GPU, as dp=2 x tp=n/2 from 4 GPUs, else tp=n; bfloat16, D=2048; without
GPUs the CPU simulator, 4 ranks as dp=2 x tp=2, float32, tiny sizes)
"""

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import AxisType, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402

# inside the shard_map: only "tp" (the heads and the MLP's hidden units; the residual stream's sequence)
TP_SPECS = {"ln1": P(), "wqkv": P(None, None, "tp", None), "wo": P("tp", None, None),
            "ln2": P(), "w1": P(None, "tp"), "w2": P("tp", None)}
STREAM_SPEC = P(None, "tp", None)  # [batch, sequence / tp, model]
# where the arrays live: the weights' model dimension also split over "dp" (FSDP), the batch over "dp"
STORED = {"ln1": P(), "wqkv": P("dp", None, "tp", None), "wo": P("tp", None, "dp"),
          "ln2": P(), "w1": P("dp", "tp"), "w2": P("tp", "dp")}
BATCH = P("dp", "tp", None)


def layer_norm(x, scale):
    x = x.astype(jnp.float32)
    mean = jnp.mean(x, -1, keepdims=True)
    return (x - mean) * lax.rsqrt(jnp.var(x, -1, keepdims=True) + 1e-5) * scale.reshape((1,) * (x.ndim - 1) + (-1,))


def block_body(params, x):
    """One pre-norm transformer block on this tp rank's share (per-rank shapes in comments)."""
    dtype = x.dtype
    # attention: heads split over tp
    h = lax.all_gather(layer_norm(x, params["ln1"]).astype(dtype), "tp", axis=1, tiled=True)  # [B, S, D]
    qkv = jnp.einsum("bsd,dkhe->bskhe", h, params["wqkv"])                                   # [B, S, 3, heads/tp, e]
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    scores = jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(jnp.float32) / np.sqrt(q.shape[-1])
    causal = jnp.tril(jnp.ones(scores.shape[-2:], bool))
    weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1).astype(dtype)
    attended = jnp.einsum("bhqk,bkhe->bqhe", weights, v)                                      # [B, S, heads/tp, e]
    partial = jnp.einsum("bqhe,hed->bqd", attended, params["wo"])                            # [B, S, D], partial sums
    x = x + lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)                 # [B, S/tp, D]
    # MLP: hidden units split over tp
    h = lax.all_gather(layer_norm(x, params["ln2"]).astype(dtype), "tp", axis=1, tiled=True)
    partial = jax.nn.gelu(h @ params["w1"]) @ params["w2"]
    return x + lax.psum_scatter(partial, "tp", scatter_dimension=1, tiled=True)


def train_step(params, x, y, mesh, lr=0.1):
    block = jax.shard_map(block_body, mesh=mesh, in_specs=(TP_SPECS, STREAM_SPEC), out_specs=STREAM_SPEC,
                          axis_names={"tp"})  # "dp" stays automatic

    def loss_fn(params):
        out = block(params, x)
        return jnp.mean(jnp.square(out.astype(jnp.float32) - y.astype(jnp.float32)))

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updated = {name: (p - lr * grads[name]).astype(p.dtype) for name, p in params.items()}
    # stored as before (FSDP): XLA then reduce-scatters the gradients over dp instead of all-reducing them
    stored = {name: lax.with_sharding_constraint(p, NamedSharding(mesh, STORED[name])) for name, p in updated.items()}
    return stored, loss


def init(mesh, D, heads, F, dtype, seed=0):
    k = jax.random.split(jax.random.key(seed), 4)
    e = D // heads
    params = {"ln1": jnp.ones((D,), jnp.float32), "ln2": jnp.ones((D,), jnp.float32),
              "wqkv": jax.random.normal(k[0], (D, 3, heads, e)) / np.sqrt(D),
              "wo": jax.random.normal(k[1], (heads, e, D)) / np.sqrt(D),
              "w1": jax.random.normal(k[2], (D, F)) / np.sqrt(D), "w2": jax.random.normal(k[3], (F, D)) / np.sqrt(F)}
    return {name: jax.device_put(v if name.startswith("ln") else v.astype(dtype), NamedSharding(mesh, STORED[name]))
            for name, v in params.items()}


def main():
    rt = iris_jax.init()
    n = len(rt.devices)
    gpu = jax.devices()[0].platform == "gpu"
    dp = 2 if n >= 4 and n % 2 == 0 else 1  # tp gets at least 2 ranks where there are 2
    # Auto axes: the compiler chooses the dp sharding inside (jax.make_mesh's default is Explicit)
    mesh = jax.make_mesh((dp, n // dp), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2, devices=rt.devices)
    B, S, D, heads, F = (4, 1024, 2048, 16, 8192) if gpu else (4, 8, 16, 4, 32)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    params = init(mesh, D, heads, F, dtype)
    k = jax.random.split(jax.random.key(1), 2)
    x = jax.device_put(jax.random.normal(k[0], (B, S, D), dtype), NamedSharding(mesh, BATCH))
    y = jax.device_put(jax.random.normal(k[1], (B, S, D), dtype), NamedSharding(mesh, BATCH))

    step = lambda params, x, y: train_step(params, x, y, mesh)  # noqa: E731
    on_xla = jax.jit(step)
    on_iris = iris_jax.replace_lax_collectives(step)

    print(f"{n} ranks ({'GPUs' if gpu else 'CPU simulator'}), mesh dp={dp} (automatic) x tp={n // dp} (manual), "
          f"B={B} S={S} D={D} heads={heads} F={F}, {jnp.dtype(dtype).name}")
    print("where each collective of one step runs (dp's, which XLA inserts itself, are not among them):")
    rows = iris_jax.explain(step, params, x, y)
    for row in rows:
        print("  ", row)
    if n // dp > 1:  # (a group of one sends nothing: XLA removes such calls)
        assert rows and all(row.runs_on == "iris" for row in rows), "a tp collective did not run on iris"

    p_xla, p_iris = params, params
    for i in range(2):
        p_xla, loss_xla = on_xla(p_xla, x, y)
        p_iris, loss_iris = on_iris(p_iris, x, y)
        print(f"step {i}: loss XLA {float(loss_xla):.6f}  iris {float(loss_iris):.6f}")
    tol = 3e-2 if dtype == jnp.bfloat16 else 1e-5
    for name in params:
        a, b = (np.asarray(p[name], np.float32) for p in (p_xla, p_iris))
        err = float(np.abs(a - b).max() / max(1e-6, np.abs(a).max()))
        assert err < tol, f"{name}: iris and XLA differ by {err} (relative)"
        assert p_iris[name].sharding.is_equivalent_to(params[name].sharding, params[name].ndim), name
    assert abs(float(loss_xla) - float(loss_iris)) <= tol * max(1.0, abs(float(loss_xla)))
    print("OK: tp on iris, FSDP over dp by XLA: the same loss and parameters as with XLA's collectives")


if __name__ == "__main__":
    main()
