"""Training loops on the CPU simulator: plain JAX against iris's twins and replace_lax_collectives.

    python benchmarks/sim_training.py [--model mlp|transformer|both] [--steps 20] [--mesh 2x4]

Each model is trained by hand in one jitted shard_map step over a (data, model) mesh of CPU
devices, tensor parallel over "model" (column- then row-parallel matmuls, a psum after each
row-parallel one) and data parallel over "data" (lax.pmean of the gradients, one call for the
whole tree), with SGD. The same step runs three ways: with jax.lax's collectives, with
iris_jax's twins (psum / pmean), and as the lax step through iris_jax.replace_lax_collectives;
each is compiled and run once, then timed over `--steps` steps (wall time, the step's result
waited for). Losses are checked equal (to float32 rounding) and the wall-time ratios printed.

- mlp: a two-layer MLP so small that the collectives are most of a step.
- transformer: one pre-norm transformer block (attention and an MLP, Megatron's tensor
  parallelism: heads and the hidden layer split over "model"), a few million parameters.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402

SIZES = {  # model: (batch per data rank, width, hidden, sequence, heads)
    "mlp": dict(batch=8, width=64, hidden=256, seq=1, heads=1),
    "transformer": dict(batch=4, width=512, hidden=2048, seq=64, heads=8),
}


def _init(rng, kind: str, size: dict, tp: int):
    """Parameters, each split over "model" along the axis its matmul splits (leading axis tp)."""
    import jax
    import jax.numpy as jnp

    d, h, heads = size["width"], size["hidden"], size["heads"]
    keys = iter(jax.random.split(rng, 8))

    def dense(shape, fan_in):
        return jax.random.normal(next(keys), shape, jnp.float32) / jnp.sqrt(fan_in)

    params = {"w1": dense((tp, d, h // tp), d), "w2": dense((tp, h // tp, d), h)}  # column-, then row-parallel
    if kind == "transformer":
        params["qkv"] = dense((tp, d, 3 * d // tp), d)  # heads // tp heads per model rank
        params["out"] = dense((tp, d // tp, d), d)
        assert heads % tp == 0
    return params


def _loss(params, x, y, kind: str, size: dict, psum):
    """The model's mean squared error on this device's batch; `psum` sums over "model"."""
    import jax
    import jax.numpy as jnp

    def norm(v):
        return (v - v.mean(-1, keepdims=True)) * jax.lax.rsqrt(v.var(-1, keepdims=True) + 1e-5)

    w = {k: v[0] for k, v in params.items()}  # this model rank's shard
    h = x
    if kind == "transformer":
        b, s, d = x.shape
        local_heads = size["heads"] // size["tp"]
        q, k, v = jnp.split(norm(h) @ w["qkv"], 3, axis=-1)
        split = lambda t: t.reshape(b, s, local_heads, -1).transpose(0, 2, 1, 3)  # noqa: E731
        q, k, v = split(q), split(k), split(v)
        attention = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1]), axis=-1) @ v
        h = h + psum(attention.transpose(0, 2, 1, 3).reshape(b, s, -1) @ w["out"], "model")
    h = h + psum(jax.nn.gelu(norm(h) @ w["w1"]) @ w["w2"], "model")
    return jnp.mean((h - y) ** 2)


def _step(kind: str, size: dict, psum, pmean):
    import jax

    def step(params, x, y):
        loss, grads = jax.value_and_grad(_loss)(params, x, y, kind, size, psum)
        grads = pmean(grads, "data")
        return jax.tree.map(lambda p, g: p - 0.01 * g, params, grads), pmean(loss, "data")

    return step


def _run(kind: str, opts) -> dict:
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    dp, tp = (int(n) for n in opts.mesh.split("x"))
    size = dict(SIZES[kind], tp=tp)
    if opts.small:
        size.update(batch=2, width=32, hidden=64, seq=4 if kind == "transformer" else 1, heads=2)
    rt = iris_jax.init()
    mesh = jax.make_mesh((dp, tp), ("data", "model"), devices=rt.devices[:dp * tp])
    rng = np.random.default_rng(0)
    batch = (dp * size["batch"], size["seq"], size["width"]) if kind == "transformer" else (
        dp * size["batch"], size["width"])
    x = jax.device_put(rng.standard_normal(batch).astype(np.float32), NamedSharding(mesh, P("data")))
    y = jax.device_put(rng.standard_normal(batch).astype(np.float32), NamedSharding(mesh, P("data")))
    params = jax.device_put(_init(jax.random.key(0), kind, size, tp), NamedSharding(mesh, P("model")))
    count = sum(int(np.prod(v.shape)) for v in params.values())
    specs = (P("model"), P("data"), P("data"))

    def sharded(psum, pmean):
        return jax.shard_map(_step(kind, size, psum, pmean), mesh=mesh, in_specs=specs, out_specs=(P("model"), P()))

    plain = sharded(lax.psum, lax.pmean)
    ways = {"lax": jax.jit(plain), "iris twins": jax.jit(sharded(iris_jax.psum, iris_jax.pmean)),
            "replace_lax_collectives": iris_jax.replace_lax_collectives(plain)}
    print(f"\n{kind}: {count / 1e6:.2f} M parameters, mesh {dp} x {tp} (data x model), {opts.steps} steps, "
          f"{os.cpu_count()} cores", flush=True)
    seconds, losses = {}, {}
    for name, step in ways.items():
        p, _ = step(params, x, y)  # compiled, and run once
        jax.block_until_ready(p)
        p, trace = params, []
        start = time.perf_counter()
        for _ in range(opts.steps):
            p, loss = step(p, x, y)
            trace.append(float(loss))
        seconds[name], losses[name] = time.perf_counter() - start, trace
    for name in ways:
        np.testing.assert_allclose(losses[name], losses["lax"], rtol=1e-4, err_msg=name)
        print(f"  {name:<25} {seconds[name]:8.2f} s  {seconds[name] / opts.steps * 1e3:9.1f} ms/step  "
              f"{seconds[name] / seconds['lax']:5.2f}x lax   (loss {losses[name][0]:.4f} -> {losses[name][-1]:.4f})",
              flush=True)
    iris_jax.shutdown()
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="both", choices=("mlp", "transformer", "both"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--mesh", default="2x4", help="data x model")
    small.add_flag(parser, "both models, tiny, 2 steps on a 2 x 2 mesh")
    opts = parser.parse_args()
    if opts.small:
        opts.steps, opts.mesh = 2, "2x2"
    dp, tp = (int(n) for n in opts.mesh.split("x"))
    small.use_simulator(dp * tp)
    for kind in ("mlp", "transformer") if opts.model == "both" else (opts.model,):
        _run(kind, opts)


if __name__ == "__main__":
    main()
