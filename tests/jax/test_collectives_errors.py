"""iris_jax collectives: errors at trace time, peer timeouts, and known limitations
(CPU simulator)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import ops
from iris_jax.config import CollectiveConfig
from tests.jax.test_collectives import F32, mesh_of, rand, runtime, shard

AT_ONCE_S = 60.0  # the timeout of calls that must fail at once: a slow machine cannot make them time out

ALL = {
    "psum": lambda v, a: iris_jax.psum(v, a),
    "pmax": lambda v, a: iris_jax.pmax(v, a),
    "pmin": lambda v, a: iris_jax.pmin(v, a),
    "all_reduce": lambda v, a: iris_jax.all_reduce(v, a, "min", "two_shot"),
    "all_gather": lambda v, a: iris_jax.all_gather(v, a, axis=1, tiled=True),
    "psum_scatter": lambda v, a: iris_jax.psum_scatter(v, a, scatter_dimension=1, tiled=True),
    "all_to_all": lambda v, a: iris_jax.all_to_all(v, a, 1, 0, tiled=True),
    "ppermute": lambda v, a: iris_jax.ppermute(v, a, [(0, 1)]),
    "broadcast": lambda v, a: iris_jax.broadcast(v, a, 1),
}


@pytest.fixture(scope="module")
def mesh():
    return mesh_of((2,), ("i",))


def trace(mesh, fn, x=None, check_vma=False, **kwargs):
    """Traces fn inside shard_map over `mesh` (nothing runs)."""
    x = jnp.ones((2, 4, 6), F32) if x is None else x
    x = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=jax.sharding.NamedSharding(mesh, P("i")))
    return jax.jit(jax.shard_map(lambda v: fn(v[0])[None], mesh=mesh, in_specs=P("i"), out_specs=P("i"),
                                 check_vma=check_vma, **kwargs)).trace(x)


@pytest.mark.parametrize("name", list(ALL))
def test_unknown_axis_name(mesh, name):
    """lax's error (psum: "Found an unbound axis name: j. ..."); broadcast, whose lax
    primitive checks nothing, says the same in its own words."""
    with pytest.raises(NameError, match="unbound axis name: '?j'?"):
        trace(mesh, lambda v: ALL[name](v, "j"))
    with pytest.raises(NameError, match="unbound axis name: .*j"):
        trace(mesh, lambda v: ALL[name](v, ("i", "j")))
    with pytest.raises(NameError, match="unbound axis name: j"):  # lax agrees
        trace(mesh, lambda v: lax.psum(v, "j"))


@pytest.mark.parametrize("check_vma", [True, False], ids=["check_vma", "no_check_vma"])
@pytest.mark.parametrize("name", list(ALL))
def test_unbound_axis_names_the_bound_axes(mesh, name, check_vma):
    """Where lax's error is a bare AssertionError (psum under check_vma), iris's names the
    collective, the unbound axis and the axes bound there."""
    bound = r"unbound axis name: 'j'; the axes bound here are \('i',\)"
    with pytest.raises(NameError, match=rf"iris_jax\.\w+: {bound}"):
        trace(mesh, lambda v: ALL[name](v, "j"), check_vma=check_vma)
    with pytest.raises(NameError, match=bound):
        trace(mesh, lambda v: ALL[name](v, ("i", "j")), check_vma=check_vma)


def test_unbound_axis_inside_vmap_names_vmap_axes(mesh):
    """A named jax.vmap axis is bound too: it is listed (and lax runs collectives over it)."""
    runtime()
    f = jax.vmap(lambda v: iris_jax.psum(v, "j"), axis_name="b")
    with pytest.raises(NameError, match=r"unbound axis name: 'j'; the axes bound here are \('b',\)"):
        jax.jit(f).trace(jnp.ones((2, 3)))


def test_outside_shard_map_is_a_name_error():
    runtime()
    with pytest.raises(NameError, match="unbound axis name: 'i'; no axis is bound here .*jax.shard_map"):
        jax.jit(lambda v: iris_jax.psum(v, "i")).trace(jnp.ones(3))
    with pytest.raises(NameError):
        jax.jit(lambda v: iris_jax.all_gather(v, "i")).trace(jnp.ones(3))


@pytest.mark.parametrize("name", ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "all_to_all",
                                  "ppermute", "pshuffle", "pswapaxes", "pbroadcast"])
def test_unbound_axis_error_holds_lax_error(name):
    """Outside shard_map, iris's NameError holds lax's own message where lax's is its sentence
    "Found an unbound axis name: x. To fix this, please call psum under `jax.shard_map`." (code,
    and JAX's test_psum_not_under_shmap_error, match that), then names iris's function."""
    runtime()
    args = {"all_to_all": (0, 0), "ppermute": ([(0, 1)],), "pshuffle": ([0],), "pswapaxes": (0,),
            "pbroadcast": (0,)}.get(name, ())
    errors = []
    for lib in (lax, iris_jax):
        with pytest.raises(NameError) as info:
            jax.jit(lambda v: getattr(lib, name)(v, "x", *args)).trace(jnp.ones(4, F32))
        errors.append(str(info.value))
    lax_error, iris_error = errors
    assert f"iris_jax.{name}: unbound axis name: 'x'; no axis is bound here" in iris_error
    if lax_error.startswith("Found an unbound axis name"):
        assert iris_error.startswith(lax_error), (lax_error, iris_error)


@pytest.mark.parametrize("name, dtype", [("pmax", jnp.complex64), ("pmin", jnp.complex64),
                                         ("psum_scatter", jnp.bool_)], ids=str)
def test_what_lax_refuses_too(mesh, name, dtype):
    """Every dtype lax runs, iris runs (tests/jax/test_collective_dtypes.py); what lax refuses
    (complex numbers have no order, bools no sum) iris refuses while tracing, with lax's error
    type, where XLA's comes at compilation."""
    with pytest.raises(TypeError, match=f"iris_jax.{name}: .*{jnp.dtype(dtype).name}"):
        trace(mesh, lambda v: ALL[name](v, "i"), jnp.ones((2, 4, 6), dtype))


def test_psum_of_bool_is_an_int32_sum(mesh, rng):
    """As lax.psum: bool inputs are counted in int32."""
    x = shard(mesh, rng.integers(0, 2, (2, 5)).astype(bool), P("i"))

    def run(mod):
        return np.asarray(jax.jit(jax.shard_map(lambda v: mod.psum(v[0], "i"), mesh=mesh, in_specs=P("i"),
                                                out_specs=P()))(x))

    got, want = run(iris_jax), run(lax)
    assert got.dtype == want.dtype == np.int32
    np.testing.assert_array_equal(got, want)


def test_scatter_and_split_sizes(mesh):
    """lax's checks and messages."""
    with pytest.raises(ValueError, match="scatter dimension size 3 must be divisible by shard_count 2"):
        trace(mesh, lambda v: iris_jax.psum_scatter(v[:3], "i", tiled=True))
    with pytest.raises(ValueError, match="scatter dimension size 4 must match shard count 2"):
        trace(mesh, lambda v: iris_jax.psum_scatter(v, "i"))  # dimension 0 has size 4
    with pytest.raises(ValueError, match="scatter dimension size 5 must be divisible by shard_count 2"):
        trace(mesh, lambda v: iris_jax.psum_scatter(v[:, :5], "i", scatter_dimension=1, tiled=True))
    with pytest.raises(ValueError, match=r"split_axis \(3\) has to be divisible by the size of the named axis i \(2\)"):
        trace(mesh, lambda v: iris_jax.all_to_all(v[:3], "i", 0, 1, tiled=True))
    with pytest.raises(ValueError, match="equal x.shape\\[split_axis\\], but they are 2 and 6"):
        trace(mesh, lambda v: iris_jax.all_to_all(v, "i", 1, 0))  # split dimension 1 has size 6
    for fn in (lambda v: iris_jax.psum_scatter(v[:3], "i", tiled=True),
               lambda v: iris_jax.all_to_all(v[:3], "i", 0, 1, tiled=True)):  # zero-size inputs are checked too
        with pytest.raises(ValueError, match="divisible"):
            trace(mesh, fn, jnp.ones((2, 4, 0), F32))


def test_unknown_op_and_variant(mesh):
    with pytest.raises(ValueError, match="unknown reduction 'prod'"):
        trace(mesh, lambda v: iris_jax.all_reduce(v, "i", op="prod"))
    with pytest.raises(ValueError, match="unknown all_reduce variant 'three_shot'"):
        trace(mesh, lambda v: iris_jax.all_reduce(v, "i", variant="three_shot"))
    with pytest.raises(ValueError, match="unknown all_reduce variant 'bogus'"):
        trace(mesh, lambda v: iris_jax.psum(v, "i", variant="bogus"))
    with pytest.raises(ValueError, match="unknown all_reduce variant"):  # also when nothing would run
        trace(mesh, lambda v: iris_jax.all_reduce(v, "i", variant="bogus"), jnp.ones((2, 0), F32))


def test_variant_restrictions(mesh):
    """atomic and spinlock only sum; atomic needs float32 or int32 (remote atomic adds)."""
    for variant in ("atomic", "spinlock"):
        for op in ("max", "min"):
            with pytest.raises(ValueError, match=f"variant '{variant}' only sums"):
                trace(mesh, lambda v: iris_jax.all_reduce(v, "i", op, variant))
    for dtype in (jnp.bfloat16, jnp.float16):
        with pytest.raises(TypeError, match="'atomic' needs float32 or int32"):
            trace(mesh, lambda v: iris_jax.all_reduce(v, "i", variant="atomic"), jnp.ones((2, 4, 6), dtype))
    for variant in ("one_shot", "two_shot", "ring", "spinlock"):  # these take every supported dtype
        trace(mesh, lambda v: iris_jax.all_reduce(v, "i", variant=variant), jnp.ones((2, 4, 6), jnp.bfloat16))


def test_bad_ppermute_and_broadcast_arguments(mesh):
    """ppermute: lax's check, when the call is lowered (a repeated source or destination);
    broadcast: the root, at trace time."""
    for perm in ([(0, 1), (1, 1)], [(0, 1), (0, 0)], [(0, 1), (3, 0), (1, 1)]):  # 3 is 1 modulo 2
        for ppermute in (lax.ppermute, iris_jax.ppermute):
            traced = trace(mesh, lambda v: ppermute(v, "i", perm))
            with pytest.raises(ValueError, match="ppermute sources and destinations must be unique"):
                traced.lower()
    with pytest.raises(ValueError, match="source 2 out of range for axis size 2"):
        trace(mesh, lambda v: iris_jax.broadcast(v, "i", 2))
    with pytest.raises(ValueError, match="source -1 out of range for axis size 2"):
        trace(mesh, lambda v: iris_jax.broadcast(v, "i", -1))


def test_ppermute_negative_indices_count_from_the_end_like_lax(mesh, rng):
    """lax.ppermute indexes the group with its pairs: -2 over 2 members is member 0."""
    x = shard(mesh, rand(rng, (2, 5), F32), P("i"))

    def run(ppermute, perm):
        return np.asarray(jax.jit(jax.shard_map(lambda v: ppermute(v, "i", perm), mesh=mesh,
                                                in_specs=P("i"), out_specs=P("i")))(x))

    np.testing.assert_array_equal(run(iris_jax.ppermute, [(1, -2), (-2, 1)]), run(lax.ppermute, [(1, -2), (-2, 1)]))
    with pytest.raises(ValueError, match=r"ppermute indices must lie in \[-2, 2\) .* got 2"):
        run(iris_jax.ppermute, [(1, 2), (0, 1)])  # lax: IndexError from its lowering


# -- peer timeouts ----------------------------------------------------------------------------
def _skip_rank_1(collective):
    """A program in which rank 1 of 3 never calls `collective` (it takes the other branch)."""
    return lambda v: lax.cond(lax.axis_index("i") == 1, lambda u: u, collective, v)


@pytest.fixture
def fresh_runtime():
    """A fresh runtime with warm workers (a rank's first kernel can take seconds, longer than
    the short timeouts here), shut down afterwards: a timeout leaves its group's flags poisoned."""
    iris_jax.shutdown()
    rt = runtime()
    _recover(8)
    yield rt
    iris_jax.shutdown()
    runtime()
    _recover(8)


def _recover(n):
    """Runs a good collective on the first n devices (it also replaces JAX's failed effect
    tokens of those devices) and checks that nothing failed is left behind."""
    mesh = mesh_of((n,), ("i",))
    x = shard(mesh, np.arange(n * 3, dtype=np.float32).reshape(n, 3))
    out = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v[0], "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))(x)
    np.testing.assert_array_equal(np.asarray(out), np.arange(n * 3, dtype=np.float32).reshape(n, 3).sum(0))
    jax.effects_barrier()


def _run_missing_peer(collective, x):
    mesh = x.sharding.mesh
    f = jax.jit(jax.shard_map(lambda v: _skip_rank_1(collective)(v[0])[None], mesh=mesh, in_specs=P("i"),
                              out_specs=P("i"), check_vma=False))
    with pytest.raises(Exception) as info:
        jax.block_until_ready(f(x))
    return str(info.value)


def test_missing_peer_times_out_naming_collective_and_rank(fresh_runtime, rng):
    import time

    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 37), F32))
    start = time.monotonic()
    message = _run_missing_peer(lambda v: iris_jax.all_reduce(v, "i", timeout_s=2), x)
    assert "PeerTimeoutError" in message
    assert "iris all_reduce(sum): timed out waiting for rank 1" in message
    # its own 2 s, not the default: the one bound that tells them apart, 30 times the timeout
    assert time.monotonic() - start < CollectiveConfig().timeout_s


def test_missing_peer_default_timeout(fresh_runtime, rng):
    """Collectives without a timeout argument use the config's (by default from
    IRIS_COLLECTIVE_TIMEOUT, read once)."""
    assert CollectiveConfig().timeout_s == 60.0
    config = CollectiveConfig.from_env({"IRIS_COLLECTIVE_TIMEOUT": "2"})
    assert config.timeout_s == 2.0
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 2, 6), F32))
    with iris_jax.use_config(config):
        message = _run_missing_peer(lambda v: iris_jax.ppermute(v, "i", [(0, 1), (1, 2), (2, 0)]), x)
    assert "iris ppermute: timed out waiting for rank 1" in message


def test_timeout_setting():
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_TIMEOUT='2s': expected seconds"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_TIMEOUT": "2s"})
    with pytest.raises(ValueError, match="timeout_s must be > 0 seconds"):
        CollectiveConfig(timeout_s=0)


@pytest.fixture
def pulling():
    """Small calls do not stream (stream_until=0): they pull."""
    with iris_jax.use_config(CollectiveConfig(stream_until=0)) as config:
        yield config


@pytest.fixture
def streaming():
    """Every call that can stream streams (stream_from=0)."""
    with iris_jax.use_config(CollectiveConfig(stream_from=0)) as config:
        yield config


def test_streamed_call_missing_peer_times_out_then_the_group_fails(fresh_runtime, streaming, rng):
    """Streamed calls (stream_from=0) time out the same way, and later streamed calls of that
    group fail at once (the workspace's `failed` word), not with stale data."""
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 37), F32))
    message = _run_missing_peer(lambda v: iris_jax.all_reduce(v, "i", timeout_s=2), x)
    assert "iris all_reduce(sum): timed out waiting for rank 1" in message
    f = jax.jit(jax.shard_map(lambda v: iris_jax.all_reduce(v[0], "i", timeout_s=AT_ONCE_S)[None], mesh=mesh,
                              in_specs=P("i"), out_specs=P("i"), check_vma=False))
    with pytest.raises(Exception) as info:
        jax.block_until_ready(f(x))
    # PeerFailedError, not PeerTimeoutError: failed at once, not by timing out
    assert "PeerFailedError" in str(info.value) and "PeerTimeoutError" not in str(info.value), str(info.value)


def test_fused_op_missing_peer_times_out(fresh_runtime, rng):
    """The fused kernels' waits are bounded too. (On GPUs they trap without this message: a
    print in a kernel makes ptxas serialize its tensor-core instructions.)"""
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 7, 7), F32))
    message = _run_missing_peer(lambda v: ops.matmul_all_reduce(v, v.T, "i", impl="fused", timeout_s=2), x)
    assert "PeerTimeoutError" in message
    assert "iris matmul_all_reduce: timed out waiting for rank 1" in message


def test_runtime_works_again_after_shutdown_and_init(fresh_runtime, rng):
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 37), F32))
    _run_missing_peer(lambda v: iris_jax.all_reduce(v, "i", timeout_s=2), x)
    iris_jax.shutdown()
    runtime()
    _recover(3)


def test_group_fails_clearly_after_a_timeout_other_groups_work(fresh_runtime, pulling, rng):
    """A timed-out call loses its epoch on the ranks that gave up, so their flags become
    POISON: every later call of that group fails at once with PeerFailedError (never stale
    data), on the rank that was missing too; other partitions of the ranks keep working.
    (Pulling calls: small ones do not stream here, stream_until=0.)"""
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (3, 37), F32))
    _run_missing_peer(lambda v: iris_jax.all_reduce(v, "i", timeout_s=2), x)
    f = jax.jit(jax.shard_map(lambda v: iris_jax.all_reduce(v[0], "i", timeout_s=AT_ONCE_S)[None], mesh=mesh,
                              in_specs=P("i"), out_specs=P("i"), check_vma=False))
    for _ in range(2):
        with pytest.raises(Exception) as info:
            jax.block_until_ready(f(shard(mesh, np.asarray(x) + 100)))
        # PeerFailedError, not PeerTimeoutError: failed at once, not by timing out
        assert "PeerFailedError" in str(info.value) and "gave up on an earlier collective" in str(info.value)
        assert "PeerTimeoutError" not in str(info.value), str(info.value)
    pair = mesh_of((2,), ("i",))  # ranks 0 and 1 alone: another partition, another workspace
    y = shard(pair, rand(rng, (2, 5), F32))
    out = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v[0], "i"), mesh=pair, in_specs=P("i"), out_specs=P()))(y)
    np.testing.assert_allclose(np.asarray(out), np.asarray(y).sum(0), rtol=1e-5)


# -- known limitations --------------------------------------------------------------------------
def test_meshes_over_overlapping_subsets_of_the_runtime(fresh_runtime, rng):
    """Each partition of the ranks into groups has its own workspace and epochs, so meshes
    over 2, 3 and 2 of the runtime's devices, and a 2-D mesh's axes, can follow each other."""
    ps = lambda v: iris_jax.psum(v[0], "i")
    for n in (2, 3, 2, 8, 3):
        mesh = mesh_of((n,), ("i",))
        x = shard(mesh, rand(rng, (n, 5), F32))
        out = jax.jit(jax.shard_map(ps, mesh=mesh, in_specs=P("i"), out_specs=P()))(x)
        np.testing.assert_allclose(np.asarray(out), np.asarray(x).sum(0), rtol=1e-5, atol=1e-6)
    mesh = jax.make_mesh((2,), ("i",), devices=jax.devices()[2:4])  # ranks 2 and 3 only
    x = shard(mesh, rand(rng, (2, 5), F32))
    out = jax.jit(jax.shard_map(ps, mesh=mesh, in_specs=P("i"), out_specs=P()))(x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(x).sum(0), rtol=1e-5, atol=1e-6)


def test_independent_collectives_in_one_jit(fresh_runtime, rng):
    """XLA:CPU starts independent operations in any order; the CPU lowering chains kernel calls in
    program order, so independent collectives (here the 14 leaves of one psum) pair up right."""
    mesh = mesh_of((3,), ("i",))
    # leaves of >= 512 bytes: XLA runs programs with only smaller buffers sequentially
    tree = [shard(mesh, rand(rng, (3, 200 + 70 * k), F32)) for k in range(14)]
    f = jax.jit(jax.shard_map(
        lambda t: [iris_jax.all_reduce(v[0], "i", timeout_s=2) for v in t], mesh=mesh, in_specs=P("i"),
        out_specs=P()))
    for got, x in zip(f(tree), tree, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(x).sum(0), rtol=1e-5, atol=1e-5)


def test_a_workspace_that_does_not_fit_is_named_and_the_heap_stays_usable():
    """Each partition of the ranks into groups keeps a workspace for the runtime's lifetime: the
    one that no longer fits raises HeapExhaustedError naming the partition, before anything runs,
    and the collectives over the partitions that fit still give lax's values."""
    from tests.jax.helpers import use_runtime

    use_runtime(8, heap_size=3 << 20)  # room for two small calls' workspaces (~1 MiB each at 8 ranks)
    try:
        m = jax.sharding.Mesh(np.array(jax.devices()[:8]).reshape(2, 2, 2), ("a", "b", "c"))
        x = rand(np.random.default_rng(3), (8, 4), F32)
        spec = P(("a", "b", "c"))

        def psum_over(axes):
            return jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, axes), mesh=m, in_specs=spec, out_specs=spec))

        expected = {axes: jax.jit(jax.shard_map(lambda v, axes=axes: lax.psum(v, axes), mesh=m, in_specs=spec,
                                                out_specs=spec))(x) for axes in ("a", "b", "c")}
        for axes in ("a", "b"):
            np.testing.assert_allclose(psum_over(axes)(x), expected[axes], rtol=1e-6)
        with pytest.raises(iris_jax.HeapExhaustedError, match=r"collective workspace .* for the partition of the "
                           r"ranks into groups \[\[0, 1\], \[2, 3\], \[4, 5\], \[6, 7\]\].*\(2 kept"):
            psum_over("c")(x)
        for axes in ("a", "b"):  # nothing lost: the kept workspaces still serve
            np.testing.assert_allclose(psum_over(axes)(x), expected[axes], rtol=1e-6)
    finally:
        iris_jax.shutdown()
