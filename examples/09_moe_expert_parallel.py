"""An expert-parallel mixture-of-experts layer: top-k routing, dispatch and combine with
`lax.ragged_all_to_all`, experts as local GEMMs, `jax.grad` through it all.

Each rank holds T tokens and E / n of the E experts (mesh axis "ep"). A token goes to its
top-k experts: its rows are sorted by expert, so the rows for each rank are one contiguous
slice of uneven, data-dependent size; `ragged_all_to_all` sends them (dispatch), the local
experts run on what arrived, and a second `ragged_all_to_all` sends the results back the way
they came (combine), where they are weighted by the router's gates.

The layer is written against jax.lax only. The script runs a training step's loss and
gradients with XLA's collectives and with iris's (`iris_jax.replace_lax_collectives`, one
line), checks that they agree, and prints where each collective ran (`iris_jax.explain`).
XLA:CPU has no ragged-all-to-all: on the simulator the XLA run uses the same exchange written
with lax.all_gather (iris_jax.reference); on GPUs it is lax.ragged_all_to_all on XLA.

Run: python examples/09_moe_expert_parallel.py
(GPUs: every local GPU, bfloat16, 2048 tokens per rank, hidden 1024, top-2 of 4 experts per
rank; without GPUs the CPU simulator, 4 ranks, float32, tiny sizes)
"""

import _common

_common.setup()

from functools import partial  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import iris_jax  # noqa: E402
from iris_jax import reference  # noqa: E402

SPECS = {"router": P(), "w1": P("ep"), "w2": P("ep")}  # experts split over ep


def exclusive_cumsum(v, axis=0):
    return jnp.cumsum(v, axis=axis) - v


def buffer(shape, dtype):
    """A receive buffer that varies over "ep": lax.ragged_all_to_all types its result as its
    output buffer, and an invariant one (plain jnp.zeros) would make the gradient wrong."""
    return lax.pcast(jnp.zeros(shape, dtype), "ep", to="varying")


def moe_layer(params, x, *, top_k, ragged_all_to_all=lax.ragged_all_to_all):
    """x [T, D] -> [T, D], per rank inside shard_map over "ep"."""
    local = params["w1"].shape[0]  # experts on this rank
    ranks = params["router"].shape[1] // local
    T, D = x.shape
    probs = jax.nn.softmax(x.astype(jnp.float32) @ params["router"].astype(jnp.float32))
    gates, experts = lax.top_k(probs, top_k)  # [T, k]
    order = jnp.argsort(experts.reshape(-1), stable=True)  # the T * k (token, expert) pairs, by expert
    expert_of = experts.reshape(-1)[order]
    rank_of = expert_of // local
    send = jnp.bincount(rank_of, length=ranks).astype(jnp.int32)  # rows for each rank
    counts = lax.all_gather(send, "ep")  # counts[j, i]: rows rank j sends rank i
    me = lax.axis_index("ep")
    recv = counts[:, me]
    capacity = T * top_k * ranks  # every token of every rank could pick my experts
    dispatch = partial(ragged_all_to_all, axis_name="ep")
    sent_at = exclusive_cumsum(send)  # where my slice for rank i starts in my sorted rows
    lands_at = exclusive_cumsum(counts, axis=0)[me]  # where it lands on rank i: after ranks < me
    rows = dispatch(x[order // top_k], buffer((capacity, D), x.dtype), sent_at, send, lands_at, recv)
    ids = dispatch(expert_of[:, None], buffer((capacity, 1), jnp.int32), sent_at, send, lands_at, recv)

    # the local experts on what arrived (row r is real iff r < recv.sum())
    real = jnp.arange(capacity) < recv.sum()
    which = jax.nn.one_hot(ids[:, 0] - me * local, local, dtype=x.dtype) * real[:, None].astype(x.dtype)
    h = jax.nn.gelu(jnp.einsum("md,edf->emf", rows, params["w1"]))
    y = jnp.einsum("emd,me->md", jnp.einsum("emf,efd->emd", h, params["w2"]), which)

    # combine: every block goes back to where it came from
    back = ragged_all_to_all(y, buffer((T * top_k, D), x.dtype), exclusive_cumsum(recv), recv,
                             exclusive_cumsum(counts, axis=1)[:, me], send, axis_name="ep")
    pairs = jnp.zeros_like(back).at[order].set(back).reshape(T, top_k, D)
    return jnp.einsum("tkd,tk->td", pairs, gates.astype(x.dtype))


def loss(params, x, y, *, top_k, ragged_all_to_all=lax.ragged_all_to_all):
    out = x + moe_layer(params, x, top_k=top_k, ragged_all_to_all=ragged_all_to_all)
    return lax.pmean(jnp.mean(jnp.square(out.astype(jnp.float32) - y.astype(jnp.float32))), "ep")


def main():
    rt = iris_jax.init()
    n = len(rt.devices)
    gpu = jax.devices()[0].platform == "gpu"
    mesh = jax.make_mesh((n,), ("ep",), devices=rt.devices)
    T, D, F, local, top_k = (2048, 1024, 1024, 4, 2) if gpu else (16, 8, 16, 2, 2)
    dtype = jnp.bfloat16 if gpu else jnp.float32
    E = local * n
    k = jax.random.split(jax.random.key(0), 5)
    params = {"router": jax.random.normal(k[0], (D, E)) / np.sqrt(D),
              "w1": jax.random.normal(k[1], (E, D, F)) / np.sqrt(D),
              "w2": jax.random.normal(k[2], (E, F, D)) / np.sqrt(F)}
    params = {name: jax.device_put(v.astype(dtype), NamedSharding(mesh, SPECS[name])) for name, v in params.items()}
    x = jax.device_put(jax.random.normal(k[3], (n * T, D), dtype), NamedSharding(mesh, P("ep")))
    y = jax.device_put(jax.random.normal(k[4], (n * T, D), dtype), NamedSharding(mesh, P("ep")))

    def step(exchange):
        body = partial(loss, top_k=top_k, ragged_all_to_all=exchange)
        return jax.shard_map(jax.value_and_grad(body), mesh=mesh, in_specs=(SPECS, P("ep"), P("ep")),
                             out_specs=(P(), SPECS))

    on_xla = jax.jit(step(lax.ragged_all_to_all if gpu else reference.ragged_all_to_all))
    on_iris = iris_jax.replace_lax_collectives(step(lax.ragged_all_to_all))  # the one line

    print(f"{n} ranks ({'GPUs' if gpu else 'CPU simulator'}), {E} experts ({local} per rank), top-{top_k}, "
          f"{T} tokens per rank, D={D} F={F}, {jnp.dtype(dtype).name}")
    print("where each collective of the step runs:")
    for row in iris_jax.explain(step(lax.ragged_all_to_all), params, x, y):
        print("  ", row)

    (loss_xla, g_xla), (loss_iris, g_iris) = on_xla(params, x, y), on_iris(params, x, y)
    print(f"loss: XLA {float(loss_xla):.6f}  iris {float(loss_iris):.6f}")
    tol = 2e-2 if dtype == jnp.bfloat16 else 1e-5
    for name in params:
        a, b = (np.asarray(g[name], np.float32) for g in (g_xla, g_iris))
        err = float(np.abs(a - b).max() / max(1e-6, np.abs(a).max()))
        print(f"grad {name:<6} relative difference {err:.2e}")
        assert err < tol, f"{name}: iris and XLA gradients differ by {err} (relative)"
    assert abs(float(loss_xla) - float(loss_iris)) <= tol * max(1.0, abs(float(loss_xla)))
    print("OK: the expert-parallel layer gives the same loss and gradients on iris and on XLA")


if __name__ == "__main__":
    main()
