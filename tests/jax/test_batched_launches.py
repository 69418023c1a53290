"""The ranks' launches of a user's kernel meet and run as one batched replay on the simulator
(iris_jax.calls.kernel_batches): lax's and numpy's answers, at every world size, and the launches
that cannot meet still give them."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import NotOnHeapError
from iris_jax.calls import kernel_batches
from tests.jax import kernels
from tests.jax.helpers import read_heap, smap, use_runtime

N, BLOCK = 13, 16


def _world(W):
    rt = use_runtime(W)
    mesh = jax.make_mesh((W,), ("i",), devices=jax.devices()[:W])
    return rt, mesh, NamedSharding(mesh, P("i"))


def _sites(rt):
    return rt.service("kernel_batches", lambda _: kernel_batches.KernelBatches()).sites()


@pytest.mark.parametrize("W", [2, 4, 8])
def test_a_ring_put_runs_batched_with_lax_answer(W):
    rt, mesh, rows = _world(W)
    buf = iris_jax.full((W * N,), -1.0, jnp.float32, sharding=rows)
    f = smap(mesh, lambda b, x: iris_jax.triton_call(
        b, x, N, kernel=kernels.ring_store, grid=(1,), W=W, BLOCK=BLOCK, HINT=None,
        out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), symmetric=(0,)), (P("i"), P("i")), P("i"))
    before = {id(site): site.runs for site in _sites(rt)}
    for step in range(4):  # the first launches record the program; later ones meet
        x = jax.device_put(jax.random.normal(jax.random.key(step), (W * N,)), rows)
        out = np.asarray(f(buf, x)).reshape(W, N)
        xs = np.asarray(x).reshape(W, N)
        np.testing.assert_allclose(out, xs * 2 + np.arange(W)[:, None], rtol=1e-6)
        shifted = np.asarray(jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "i", [(i, (i + 1) % W) for i in range(W)]),
                                                   mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)).reshape(W, N)
        for r in range(W):  # rank r's buf holds what lax.ppermute gives rank r
            np.testing.assert_array_equal(read_heap(buf, r, (N,), np.float32), shifted[r])
    ran = [site.runs - before.get(id(site), 0) for site in _sites(rt) if site.ranks == tuple(range(W))]
    assert max(ran) >= 2, ran  # at least the last two steps ran as one replay


def test_ranks_that_skip_the_call_leave_the_others_to_run_without_them():
    """Under lax.cond only the even ranks launch: at each meeting they wait for the others
    (kernel_batches.GATHER_S) and run without them; after MISSES meetings the call site runs per
    rank. The answers are the same throughout."""
    W = 4
    rt, mesh, rows = _world(W)
    buf = iris_jax.zeros((W * N,), jnp.float32, sharding=rows)

    def body(b, x):
        call = lambda x: iris_jax.triton_call(b, x, N, kernel=kernels.ring_store, grid=(1,), W=W, BLOCK=BLOCK,
                                              HINT=None, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32),
                                              symmetric=(0,))
        return jax.lax.cond(jax.lax.axis_index("i") % 2 == 0, call, lambda x: -x, x)

    f = smap(mesh, body, (P("i"), P("i")), P("i"))
    xs = np.arange(W * N, dtype=np.float32).reshape(W, N)
    for step in range(kernel_batches.MISSES + 2):  # the first step asks for the form; then the misses
        out = np.asarray(f(buf, jax.device_put(xs.reshape(-1) + step, rows))).reshape(W, N)
        even = np.arange(W) % 2 == 0
        np.testing.assert_array_equal(out[even], (xs[even] + step) * 2 + np.arange(W)[even, None])
        np.testing.assert_array_equal(out[~even], -(xs[~even] + step))
        for r in range(1, W, 2):  # the odd ranks' bufs hold what their even predecessors put
            np.testing.assert_array_equal(read_heap(buf, r, (N,), np.float32), xs[r - 1] + step)
    site = next(s for s in _sites(rt) if s.ranks == tuple(range(W)) and s.misses)
    assert site.off and site.misses == kernel_batches.MISSES and site.runs == kernel_batches.MISSES


def test_a_ranks_refused_put_names_that_rank():
    W = 4
    rt, mesh, rows = _world(W)
    buf = iris_jax.zeros((W * N,), jnp.float32, sharding=rows)
    # the kernel stores at buf + shift: past the heap for rank 2 only
    shifts = jax.device_put(jnp.asarray([0, 0, rt.heap_size, 0], jnp.int32), rows)
    f = smap(mesh, lambda b, s: iris_jax.triton_call(b, s, kernel=kernels.store_at_shift, grid=(1,), W=W,
                                                     out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), symmetric=(0,)),
             (P("i"), P("i")), P("i"))
    good = jax.device_put(jnp.zeros((W,), jnp.int32), rows)
    for _ in range(3):
        np.asarray(f(buf, good))  # recorded, then batched
    with pytest.raises(Exception, match="rank 2") as raised:
        np.asarray(f(buf, shifts))
    assert "past the heap" in str(raised.value)
    assert isinstance(raised.value, NotOnHeapError) or "NotOnHeapError" in str(raised.value)
