"""iris collectives against lax on real GPUs, one process with every GPU (pytest -m gpu)."""

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]  # one GPU: test_gpu_shared.py stands in

VARIANTS = ["auto", "one_shot", "two_shot"]


def _pair(mesh, iris_fn, lax_fn, x, out_specs):
    import jax
    from jax.sharding import PartitionSpec as P

    run = lambda f: np.asarray(jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=out_specs))(x),
                               np.float32)
    return run(iris_fn), run(lax_fn)


def _input(mesh, n, dtype, seed=0):
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    W = mesh.size
    return jax.device_put(jax.random.normal(jax.random.key(seed), (W * n,), jnp.float32).astype(dtype),
                          NamedSharding(mesh, P("i")))


@pytest.mark.parametrize("n", [1, 37, 4099, 1 << 20, (1 << 28) + 3])
@pytest.mark.parametrize("variant", VARIANTS)
def test_all_reduce(mesh, n, variant):
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    for dtype in (jnp.float32, jnp.bfloat16) if n < (1 << 28) else (jnp.float32,):
        x = _input(mesh, n, dtype, seed=n)
        got, want = _pair(mesh, lambda v: iris_jax.all_reduce(v, "i", variant=variant), lambda v: lax.psum(v, "i"),
                          x, P())
        tol = 1e-5 if dtype == jnp.float32 else 3e-2
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", [37, 4099, (1 << 22) + 5])
@pytest.mark.parametrize("variant", ["ring", "atomic", "spinlock"])
def test_all_reduce_other_algorithms(mesh, n, variant):
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    x = _input(mesh, n, jnp.float32, seed=n)
    got, want = _pair(mesh, lambda v: iris_jax.all_reduce(v, "i", variant=variant), lambda v: lax.psum(v, "i"), x, P())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [5, 4099, 1 << 22])
@pytest.mark.parametrize("mode", ["default", "push", "stream"])
def test_other_collectives(mesh, monkeypatch, n, mode):
    """Every kind against lax; "push": every size pushes in chunks and none streams
    (push_from=0, stream_until=0, stream_from huge), as arrays too large to stream do by
    default; "stream": every one-chunk call of the kinds that can streams (stream_from=0).
    A spy checks what ran."""
    import jax.numpy as jnp

    import iris_jax
    from iris_core.collectives import kernels as K
    from iris_jax.collectives import lowering
    from tests.gpu.cases import collective_cases

    config = iris_jax.default_config()
    if mode == "push":
        config = config.replace(push_from=0, stream_until=0, stream_from=1 << 62)
    if mode == "stream":
        config = config.replace(stream_from=0)
    launched = []  # (kind, PUSH, STREAM) of every collective kernel traced
    real_call = lowering.triton_call

    def spy(*args, **kwargs):
        launched.append((kwargs["KIND"], kwargs["PUSH"], kwargs["STREAM"]))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(lowering, "triton_call", spy)

    with iris_jax.use_config(config):
        for dtype in (jnp.float32, jnp.bfloat16, jnp.int32):
            x = _input(mesh, n, jnp.float32, seed=n) * 100
            x = x.astype(dtype)
            for name, iris_fn, lax_fn, spec in collective_cases(n, mesh.size):
                got, want = _pair(mesh, iris_fn, lax_fn, x, spec)
                tol = 1e-5 if dtype != jnp.bfloat16 else 3e-2
                np.testing.assert_allclose(got, want, rtol=tol, atol=tol * 100, err_msg=f"{name} {dtype}")
    if mode == "push":  # the pipelined kinds pushed in chunks, nothing streamed
        assert launched and all(push and not stream for _, push, stream in launched), launched
    if mode == "stream":  # every kind in which each member sends to every other streamed, the others did not
        assert launched and all(stream == (kind not in (K.PPERMUTE, K.BROADCAST)) for kind, _, stream in launched), \
            launched


def test_ten_thousand_back_to_back(mesh):
    """10k psums in one fori_loop: no deadlock, no drift, workspace reuse is race-free."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W = mesh.size
    rt = iris_jax.runtime()
    x = _input(mesh, 4099, jnp.float32)
    used = rt.heap.used

    def loop(psum):
        def body(v):
            # v <- psum(v) / W + rank: the exact result depends on every iteration's data
            rank = jax.lax.axis_index("i").astype(jnp.float32)
            return jax.lax.fori_loop(0, 10_000, lambda i, v: psum(v, "i") / W + rank, v)

        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                                check_vma=False))(x)).reshape(W, -1)

    got = loop(iris_jax.psum)
    np.testing.assert_allclose(got, loop(jax.lax.psum), rtol=1e-6)
    # fixed point of v = mean(v) + rank: mean(v) + rank where mean grows by mean(rank) each step
    x0 = np.asarray(x).reshape(W, -1)
    mean = x0.mean(0)
    for _ in range(10_000):
        mean = mean + np.arange(W).mean()
    expected = mean[None, :] - np.arange(W).mean() + np.arange(W)[:, None]
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-2)
    assert rt.heap.used == used


@pytest.mark.parametrize("n", [(1 << 22) + 3, 1 << 24])
def test_heap_inputs_are_read_in_place(mesh, n):
    """Inputs of >= zero_copy_from bytes already on the heap: no staging, peers read them."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.cases import collective_cases

    x = iris_jax.to_heap(_input(mesh, n, jnp.float32, seed=n))
    assert n * 4 >= iris_jax.default_config().zero_copy_from and iris_jax.is_symmetric(x)
    cases = [(f"psum {v}", lambda v_, v=v: iris_jax.all_reduce(v_, "i", variant=v), lambda v_: lax.psum(v_, "i"), P())
             for v in VARIANTS]
    for name, iris_fn, lax_fn, spec in cases + collective_cases(n, mesh.size):
        got, want = _pair(mesh, iris_fn, lax_fn, x, spec)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
