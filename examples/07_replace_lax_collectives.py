"""A training step written only against jax.lax, moved onto iris with one line.

    step = iris_jax.replace_lax_collectives(train_step)

`train_step` is ordinary JAX: a two-layer MLP, tensor parallel over mesh axis "tp" (W1
column-parallel, W2 row-parallel: `lax.psum` of the partial outputs) and data parallel over
"dp" (`lax.pmean` of the gradients), `jax.value_and_grad`, and `lax.scan` over micro-batches
that accumulates gradients. The script runs the step with XLA's collectives and with
iris's, checks that both give the same loss and parameters after a few steps, and prints
where each collective ran (`iris_jax.explain`).

Run: python examples/07_replace_lax_collectives.py
(GPUs: every local GPU, bfloat16, hidden 4096; without GPUs the CPU simulator, 4 ranks as
a 2 x 2 mesh, float32, tiny sizes)
"""

import _common

_common.setup()

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402

SPECS = {"w1": P(None, "tp"), "w2": P("tp", None)}  # hidden units split over tp
BATCH_SPEC = P(None, "dp", None)  # [micro-batches, rows split over dp, features]


def train_step(params, x, y, lr):
    """One SGD step over the micro-batches of x, y (per-device shards inside shard_map)."""

    def loss_fn(params, xb, yb):
        h = jax.nn.gelu(xb @ params["w1"])               # [rows, hidden / tp]
        out = lax.psum(h @ params["w2"], "tp")           # row-parallel: sum the partial products
        return jnp.mean(jnp.square(out.astype(jnp.float32) - yb.astype(jnp.float32)))

    def micro(grads, batch):
        loss, g = jax.value_and_grad(loss_fn)(params, *batch)
        return jax.tree.map(jnp.add, grads, g), loss

    zeros = jax.tree.map(jnp.zeros_like, params)
    grads, losses = lax.scan(micro, zeros, (x, y))
    grads = lax.pmean(grads, "dp")                       # data parallel: average over replicas
    loss = lax.pmean(jnp.mean(losses), "dp")
    params = jax.tree.map(lambda p, g: p - lr * g.astype(p.dtype) / x.shape[0], params, grads)
    return params, loss


def main():
    rt = iris_jax.init()
    n = len(rt.devices)
    gpu = jax.devices()[0].platform == "gpu"
    dp = 2 if n % 2 == 0 and n > 1 else 1
    mesh = jax.make_mesh((dp, n // dp), ("dp", "tp"), devices=rt.devices)
    D, H, rows, micro = (4096, 16384, 2048, 4) if gpu else (8, 16, 4, 3)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    k = jax.random.split(jax.random.key(0), 4)
    params = {"w1": jax.random.normal(k[0], (D, H), jnp.float32) / np.sqrt(D),
              "w2": jax.random.normal(k[1], (H, D), jnp.float32) / np.sqrt(H)}
    params = {name: jax.device_put(v.astype(dtype), NamedSharding(mesh, SPECS[name])) for name, v in params.items()}
    x = jax.device_put(jax.random.normal(k[2], (micro, rows * dp, D), dtype), NamedSharding(mesh, BATCH_SPEC))
    y = jax.device_put(jax.random.normal(k[3], (micro, rows * dp, D), dtype), NamedSharding(mesh, BATCH_SPEC))

    sharded = jax.shard_map(train_step, mesh=mesh, in_specs=(SPECS, BATCH_SPEC, BATCH_SPEC, P()),
                            out_specs=(SPECS, P()))
    on_xla = jax.jit(sharded)
    on_iris = iris_jax.replace_lax_collectives(sharded)      # the one line

    print(f"{n} ranks ({'GPUs' if gpu else 'CPU simulator'}), mesh dp={dp} x tp={n // dp}, "
          f"D={D} H={H}, {jnp.dtype(dtype).name}")
    print("where each collective of one step runs:")
    for row in iris_jax.explain(sharded, params, x, y, 0.1):
        print("  ", row)

    p_xla, p_iris = params, params
    for i in range(3):
        p_xla, loss_xla = on_xla(p_xla, x, y, 0.1)
        p_iris, loss_iris = on_iris(p_iris, x, y, 0.1)
        print(f"step {i}: loss XLA {float(loss_xla):.6f}  iris {float(loss_iris):.6f}")
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    for name in params:
        a, b = (np.asarray(p[name], np.float32) for p in (p_xla, p_iris))
        err = float(np.abs(a - b).max() / max(1e-6, np.abs(a).max()))
        assert err < tol, f"{name}: iris and XLA differ by {err} (relative)"
    assert abs(float(loss_xla) - float(loss_iris)) <= tol * max(1.0, abs(float(loss_xla)))
    print("OK: the lax training step gives the same loss and parameters on iris and on XLA")


if __name__ == "__main__":
    main()
