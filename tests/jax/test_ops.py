"""iris_jax.ops (GEMM fused with communication) against jnp.dot + the lax collective, on the
CPU simulator: world sizes 2 and 4, float32 / bfloat16 / float16, shapes that are not
multiples of the simulator's 16 x 16 x 16 tiles, back-to-back calls in one jit (workspace
epochs and parity buffers), row chunking (a workspace smaller than the problem), both
scatter dimensions and gather axes, a group over one axis of a 2 x 2 mesh, calls alternating
between its axes with a late rank (a workspace per partition of the ranks), and gradients.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import IrisError
from iris_jax import ops
from iris_jax._runtime import backends
from iris_jax._runtime.workspace import workspaces
from iris_jax.calls.triton_call import vary
from tests.jax.helpers import use_runtime

F32, BF16, F16 = jnp.float32, jnp.bfloat16, jnp.float16
TOL = {jnp.dtype(F32): 1e-5, jnp.dtype(BF16): 2e-2, jnp.dtype(F16): 4e-3}
M, K, N = 37, 21, 19  # per-rank sizes: odd, not multiples of the 16-wide tiles


def _mesh(W, names=("i",), shape=None):
    use_runtime(W)
    return jax.make_mesh(shape or (W,), names, devices=jax.devices()[:W])


def _rand(rng, shape, dtype):
    return jnp.asarray(rng.standard_normal(shape).astype(np.float32)).astype(dtype)


def _put(mesh, x, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def _close(got, want, dtype, what):
    got = np.asarray(jnp.asarray(got, F32))
    want = np.asarray(jnp.asarray(want, F32))
    assert got.shape == want.shape, (what, got.shape, want.shape)
    tol = TOL[jnp.dtype(dtype)]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())), err_msg=what)


def _jit(f, mesh, in_specs, out_specs):
    """Iris kernels and lax collectives go in separate jits: on the CPU simulator XLA may run
    independent collectives in a different order on each device, and a rank blocked in a lax
    collective cannot serve a peer waiting for it inside an iris kernel (a deadlock)."""
    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))


def _ref_dot(a, b):
    return jnp.dot(a.astype(F32), b.astype(F32))


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_matmul(rng, dtype):
    mesh = _mesh(2)
    a = _put(mesh, _rand(rng, (2 * M, K), dtype), P("i"))
    b = _put(mesh, _rand(rng, (K, 2 * N), dtype), P(None, "i"))
    f = jax.jit(jax.shard_map(lambda a, b: (ops.matmul(a, b), _ref_dot(a, b)), mesh=mesh,
                              in_specs=(P("i"), P(None, "i")), out_specs=(P("i"), P("i"))))
    got, want = f(a, b)
    _close(got, want, dtype, "matmul")


@pytest.mark.parametrize("W", [2, 4])
@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_fused_ops(rng, W, dtype):
    """All three ops, each called twice back to back (different data) in one jit, vs lax."""
    mesh = _mesh(W)
    Mr = M + (-M) % W  # reduce-scatter needs rows divisible by W
    a_row = _put(mesh, _rand(rng, (M, W * K), dtype), P(None, "i"))        # [M, K] per rank
    a_rs = _put(mesh, _rand(rng, (Mr, W * K), dtype), P(None, "i"))        # [Mr, K] per rank
    b_row = _put(mesh, _rand(rng, (W * K, N), dtype), P("i", None))        # [K, N] per rank
    a_col = _put(mesh, _rand(rng, (W * M, K), dtype), P("i", None))        # [M, K] per rank
    b_col = _put(mesh, _rand(rng, (K, W * N), dtype), P(None, "i"))        # [K, N] per rank
    b_rs1 = _put(mesh, _rand(rng, (W * K, W * 3), dtype), P("i", None))    # N = 3W for scatter_dimension=1

    def body_iris(a_row, a_rs, b_row, a_col, b_col, b_rs1):
        return dict(
            ar=ops.matmul_all_reduce(a_row, b_row, "i"),
            ar2=ops.matmul_all_reduce(a_row * 2, b_row, "i"),
            ag=ops.all_gather_matmul(a_col, b_col, "i"),
            ag2=ops.all_gather_matmul(a_col - 1, b_col, "i"),
            rs=ops.matmul_reduce_scatter(a_rs, b_row, "i"),
            rs2=ops.matmul_reduce_scatter(a_rs + 1, b_row, "i"),
            rs_d1=ops.matmul_reduce_scatter(a_row, b_rs1, "i", scatter_dimension=1),
            ag_k=ops.all_gather_matmul(a_row, jnp.tile(b_row, (W, 1)), "i",
                                       gather_axis=1),
        )

    def body_lax(a_row, a_rs, b_row, a_col, b_col, b_rs1):
        dot = _ref_dot
        return dict(
            ar=lax.psum(dot(a_row, b_row), "i"),
            ar2=lax.psum(dot(a_row * 2, b_row), "i"),
            ag=dot(lax.all_gather(a_col, "i", tiled=True), b_col),
            ag2=dot(lax.all_gather(a_col - 1, "i", tiled=True), b_col),
            rs=lax.psum_scatter(dot(a_rs, b_row), "i", tiled=True),
            rs2=lax.psum_scatter(dot(a_rs + 1, b_row), "i", tiled=True),
            rs_d1=lax.psum_scatter(dot(a_row, b_rs1), "i", scatter_dimension=1, tiled=True),
            ag_k=dot(lax.all_gather(a_row, "i", axis=1, tiled=True), jnp.tile(b_row, (W, 1))),
        )

    specs = dict(ar=P(), ar2=P(), ag=P(None, "i"), ag2=P(None, "i"), rs=P("i"), rs2=P("i"),
                 rs_d1=P(None, "i"), ag_k=P("i"))
    in_specs = (P(None, "i"), P(None, "i"), P("i", None), P("i", None), P(None, "i"), P("i", None))
    args = (a_row, a_rs, b_row, a_col, b_col, b_rs1)
    got = _jit(body_iris, mesh, in_specs, specs)(*args)
    want = _jit(body_lax, mesh, in_specs, specs)(*args)
    for key in specs:
        _close(got[key], want[key], dtype, key)


@pytest.mark.parametrize("W,reducers", [(2, "1"), (3, "1"), (2, "0"), (3, "2")])
def test_reduce_whole_tiles(rng, W, reducers):
    """Products made of whole 16 x 16 tiles: the reducing programs store unmasked vectors.
    Of the simulator's 3 programs, 0, 1 or 2 reduce (0: every producer reduces its own)."""
    cfg = iris_jax.CollectiveConfig(fused_reduce_programs=int(reducers))
    mesh = _mesh(W)
    a = _put(mesh, _rand(rng, (16 * W * 3, W * 16), BF16), P(None, "i"))   # [48W, 16] per rank
    b = _put(mesh, _rand(rng, (W * 16, 32), BF16), P("i", None))          # [16, 32] per rank
    specs = (P(), P("i"))
    got = _jit(lambda a, b: (ops.matmul_all_reduce(a, b, "i", config=cfg),
                             ops.matmul_reduce_scatter(a, b, "i", config=cfg)), mesh,
               (P(None, "i"), P("i", None)), specs)(a, b)
    want = _jit(lambda a, b: (lax.psum(_ref_dot(a, b), "i"), lax.psum_scatter(_ref_dot(a, b), "i", tiled=True)),
                mesh, (P(None, "i"), P("i", None)), specs)(a, b)
    _close(got[0], want[0], BF16, "matmul_all_reduce")
    _close(got[1], want[1], BF16, "matmul_reduce_scatter")


@pytest.fixture
def small_fused_workspace(monkeypatch):
    """A fresh runtime whose fused workspaces hold 8 KiB per buffer: a few row tiles per chunk."""
    iris_jax.shutdown()
    monkeypatch.setenv("IRIS_FUSED_WORKSPACE_BYTES", str(8 << 10))
    yield 8 << 10
    iris_jax.shutdown()


def test_chunked_and_repeated(rng, small_fused_workspace):
    """A workspace smaller than the problem (several kernels over row chunks), ten calls in a
    fori_loop (epochs, parity buffers), impl='xla' agreeing with impl='fused'."""
    W = 2
    mesh = _mesh(W)
    assert workspaces().fused_layout.data_bytes == small_fused_workspace
    a = _put(mesh, _rand(rng, (70, W * K), F32), P(None, "i"))
    b = _put(mesh, _rand(rng, (W * K, N), F32), P("i", None))
    a_col = _put(mesh, _rand(rng, (W * 70, K), F32), P("i", None))
    b_col = _put(mesh, _rand(rng, (K, W * N), F32), P(None, "i"))

    def body(fused, a, b, a_col, b_col):
        def step(_, c):
            return c + 0.5 * ops.matmul_all_reduce(a, b, "i") + ops.matmul_reduce_scatter(a, b, "i").sum() \
                + ops.all_gather_matmul(a_col, b_col, "i")[:70, :N]

        def step_xla(_, c):
            return c + 0.5 * ops.matmul_all_reduce(a, b, "i", impl="xla") \
                + ops.matmul_reduce_scatter(a, b, "i", impl="xla").sum() \
                + ops.all_gather_matmul(a_col, b_col, "i", impl="xla")[:70, :N]

        z = jnp.zeros((70, N), F32)
        z = lax.pcast(z, ("i",), to="varying")
        return lax.fori_loop(0, 10, step if fused else step_xla, z)

    in_specs = (P(None, "i"), P("i", None), P("i", None), P(None, "i"))
    got = _jit(lambda *x: body(True, *x), mesh, in_specs, P("i"))(a, b, a_col, b_col)
    want = _jit(lambda *x: body(False, *x), mesh, in_specs, P("i"))(a, b, a_col, b_col)
    _close(got, want, F32, "chunked loop")


def test_one_axis_of_a_2d_mesh(rng):
    mesh = _mesh(4, ("x", "y"), (2, 2))
    a = _put(mesh, _rand(rng, (2 * M, 2 * K), BF16), P("y", "x"))
    b = _put(mesh, _rand(rng, (2 * K, 2 * N), BF16), P("x", "y"))

    in_specs, out_specs = (P("y", "x"), P("x", "y")), P("y")
    got = _jit(lambda a, b: ops.matmul_all_reduce(a, b, "x"), mesh, in_specs, out_specs)(a, b)
    want = _jit(lambda a, b: lax.psum(_ref_dot(a, b), "x"), mesh, in_specs, out_specs)(a, b)
    _close(got, want, BF16, "2-D mesh, axis x")


@pytest.mark.parametrize("op", ["matmul_all_reduce", "matmul_reduce_scatter", "all_gather_matmul"])
def test_alternating_axes_with_a_late_rank(rng, op):
    """Fused calls over x, y, x of a 2 x 2 mesh in one jit, rank 1 arriving 1 s late for the
    y call, while its y-partner's x-partner runs ahead into the next x call. (Regression: when
    every fused call shared one workspace, that x call's flags could satisfy a wait of the y
    call early: all_gather_matmul returned stale rows, the reduce ops timed out. Each axis
    now has its own workspace.)"""
    import time

    from jax.experimental import io_callback

    mesh = _mesh(4, ("x", "y"), (2, 2))
    gather = op == "all_gather_matmul"
    b_spec = P(None, ("x", "y")) if gather else P(("x", "y"))
    a = _put(mesh, _rand(rng, (2 * 2 * M, 2 * K), F32), P("x", "y"))                    # [2M, K] per rank
    b = _put(mesh, _rand(rng, (K, 4 * N) if gather else (4 * K, N), F32), b_spec)      # [K, N] per rank
    fused = getattr(ops, op)
    reference = {"matmul_all_reduce": lambda a, b, ax: lax.psum(_ref_dot(a, b), ax),
                 "matmul_reduce_scatter": lambda a, b, ax: lax.psum_scatter(_ref_dot(a, b), ax, tiled=True),
                 "all_gather_matmul": lambda a, b, ax: _ref_dot(lax.all_gather(a, ax, tiled=True), b)}[op]

    def late(v):
        slept = io_callback(lambda u: (time.sleep(1.0), u)[1], jax.ShapeDtypeStruct(v.shape, v.dtype), v)
        return lax.pcast(slept, ("x", "y"), to="varying")

    def program(call):
        def body(a, b):
            rank = lax.axis_index("x") * 2 + lax.axis_index("y")
            first = call(a, b, "x")
            a2 = lax.cond(rank == 1, late, lambda u: u, a * 2)
            second = call(a2, b, "y")
            third = call(a - 1, b, "x")
            # every rank's three results, side by side (each made varying over both axes)
            parts = [vary(p, ("x", "y")) for p in (first, second, third)]
            return jnp.concatenate([p.reshape(1, -1) for p in parts], axis=1)

        return np.asarray(_jit(body, mesh, (P("x", "y"), b_spec), P(("x", "y")))(a, b))

    want = program(reference)
    for _ in range(2):  # back to back: the second run starts from the first one's epochs
        _close(program(lambda a, b, ax: fused(a, b, ax, timeout_s=60)), want, F32, op)  # far above rank 1's 1 s


@pytest.mark.parametrize("W", [2, 4])
def test_grads(rng, W):
    """jax.grad through each op equals jax.grad through jnp.dot + the lax collective."""
    mesh = _mesh(W)
    Mr = 2 * W
    a_row = _put(mesh, _rand(rng, (Mr, W * K), F32), P(None, "i"))
    b_row = _put(mesh, _rand(rng, (W * K, N), F32), P("i", None))
    a_col = _put(mesh, _rand(rng, (W * M, K), F32), P("i", None))
    b_col = _put(mesh, _rand(rng, (K, W * N), F32), P(None, "i"))
    specs = (P(None, "i"), P("i", None), P("i", None), P(None, "i"))

    def loss(impl):
        def f(a_row, b_row, a_col, b_col):
            y1 = ops.matmul_all_reduce(a_row, b_row, "i", impl=impl)
            y2 = ops.all_gather_matmul(a_col, b_col, "i", impl=impl)
            y3 = ops.matmul_reduce_scatter(a_row, b_row, "i", impl=impl)
            local = (jnp.sin(y1).sum() + (y2 ** 2).sum() * 0.1 + jnp.cos(y3).sum())
            return (iris_jax.psum if impl == "fused" else lax.psum)(local, "i")
        return f

    def grads(impl):
        return jax.jit(jax.shard_map(jax.grad(loss(impl), argnums=(0, 1, 2, 3)), mesh=mesh, in_specs=specs,
                                     out_specs=specs))(a_row, b_row, a_col, b_col)

    got, want = grads("fused"), grads("xla")
    for g, w, name in zip(got, want, ("a_row", "b_row", "a_col", "b_col")):
        _close(g, w, F32, f"grad {name}")


def test_errors():
    mesh = _mesh(2)
    a = jnp.zeros((4, 3), F32)
    with pytest.raises(TypeError, match="same dtype"):
        jax.shard_map(lambda a: ops.matmul_all_reduce(a, a.T.astype(BF16), "i"), mesh=mesh, in_specs=P(),
                      out_specs=P())(a)
    with pytest.raises(ValueError, match="not divisible"):
        jax.shard_map(lambda a: ops.matmul_reduce_scatter(a[:3], a.T, "i"), mesh=mesh, in_specs=P(),
                      out_specs=P("i"))(a)
    with pytest.raises(ValueError, match="unknown impl"):
        jax.shard_map(lambda a: ops.matmul_all_reduce(a, a.T, "i", impl="nccl"), mesh=mesh, in_specs=P(),
                      out_specs=P())(a)


def test_reduce_programs_setting():
    """fused_reduce_programs and fused_poll_ns are the config's (IRIS_FUSED_REDUCE_PROGRAMS,
    IRIS_FUSED_POLL_NS), the backend's where unset; out of range is an error."""
    _mesh(2)
    ws = ops.settings()
    cfg = iris_jax.CollectiveConfig.from_env({"IRIS_FUSED_REDUCE_PROGRAMS": "2", "IRIS_FUSED_POLL_NS": "700"})
    assert (ws.reduce_programs(cfg), ws.poll_ns(cfg)) == (2, 700)
    default = iris_jax.CollectiveConfig()
    assert (ws.reduce_programs(default), ws.poll_ns(default)) == (ws.backend.fused_reduce_programs,
                                                                  ws.backend.fused_poll_ns)
    with pytest.raises(IrisError, match="IRIS_FUSED_REDUCE_PROGRAMS"):
        ws.reduce_programs(cfg.replace(fused_reduce_programs=ws.programs))
    with pytest.raises(ValueError, match="fused_poll_ns"):
        cfg.replace(fused_poll_ns=-1)


def test_gemm_config_setting():
    """gemm_config is the config's (IRIS_GEMM_CONFIG, read with the others): on GPUs it sets the
    16-bit tile, float32 and the simulator keep theirs; a malformed one is an error."""
    cfg = iris_jax.CollectiveConfig.from_env({"IRIS_GEMM_CONFIG": "64,128,64,8,4,4"})
    assert cfg.gemm_config == (64, 128, 64, 8, 4, 4)
    assert hash(cfg) != hash(iris_jax.CollectiveConfig())  # a value in jit's cache key
    gpu = backends.GpuSingleProcess()
    assert gpu.gemm_config(jnp.bfloat16, cfg.gemm_config) == (64, 128, 64, 8, "tf32", 4, 4)
    assert gpu.gemm_config(jnp.bfloat16) == backends.GPU_GEMM_16BIT
    assert gpu.gemm_config(jnp.float32, cfg.gemm_config) == backends.GPU_GEMM_FLOAT32
    assert backends.SimulatorWorkers().gemm_config(jnp.bfloat16, cfg.gemm_config) == backends.SIM_GEMM
    with pytest.raises(ValueError, match="gemm_config"):
        iris_jax.CollectiveConfig(gemm_config=(64, 128, 64, 8, 3, 4))
    with pytest.raises(ValueError, match="IRIS_GEMM_CONFIG"):
        iris_jax.CollectiveConfig.from_env({"IRIS_GEMM_CONFIG": "64,128,sixty-four,8,4,4"})


# benchmarks/fused.py's shapes (global M, N = K; bf16, 2 GPUs) with what fused measured against
# XLA on 2 x H200 (xla time / fused time; benchmarks/RESULTS.md): auto must run fused where it won, except
# by a hair (all_gather_matmul 4096 x 4096: 1.02x, left to XLA)
AUTO_CASES = {
    "matmul_all_reduce": {(1024, 4096): 1.35, (4096, 4096): 0.90, (8192, 4096): 0.94, (1024, 8192): 0.90,
                          (4096, 8192): 1.27, (8192, 8192): 1.35},
    "matmul_reduce_scatter": {(1024, 4096): 1.58, (4096, 4096): 1.07, (8192, 4096): 1.23, (1024, 8192): 0.83,
                              (4096, 8192): 1.17, (8192, 8192): 1.21},
    "all_gather_matmul": {(1024, 4096): 1.28, (4096, 4096): 1.02, (8192, 4096): 1.10, (1024, 8192): 0.71,
                          (4096, 8192): 1.09, (8192, 8192): 1.21},
}


@pytest.mark.parametrize("what", sorted(AUTO_CASES))
def test_auto_on_gpus_runs_fused_where_it_was_measured_faster(monkeypatch, what):
    """`auto`'s choice on GPUs (ops._auto_fused) for each benchmarked shape, traced through the
    op itself (per-rank shapes as benchmarks/fused.py); tracing stops at the choice."""
    from types import SimpleNamespace

    from iris_jax._runtime import backends

    mesh = _mesh(2)
    monkeypatch.setattr(ops.runtime_lib, "runtime", lambda: SimpleNamespace(backend=backends.GpuSingleProcess()))
    real_impl = ops._impl

    class Chosen(Exception):
        pass

    def stop(*args):
        raise Chosen(real_impl(*args))

    monkeypatch.setattr(ops, "_impl", stop)
    op = getattr(ops, what)
    for (M, NK), speedup in AUTO_CASES[what].items():
        a, b = ((M // 2, NK), (NK, NK // 2)) if what == "all_gather_matmul" else ((M, NK // 2), (NK // 2, NK))
        f = jax.shard_map(lambda a, b: op(a, b, "i"), mesh=mesh, in_specs=(P(), P()), out_specs=P(),
                          check_vma=False)
        with pytest.raises(Chosen) as chosen:
            jax.eval_shape(f, jax.ShapeDtypeStruct(a, jnp.bfloat16), jax.ShapeDtypeStruct(b, jnp.bfloat16))
        if chosen.value.args[0] == "fused":
            assert speedup >= 1, (what, M, NK, speedup)  # never fused where it lost
        else:
            assert speedup < 1.05, (what, M, NK, speedup)  # never left a clear win to XLA


def test_impl_argument(monkeypatch):
    from types import SimpleNamespace

    from iris_jax._runtime import backends

    monkeypatch.setattr(ops.runtime_lib, "runtime", lambda: SimpleNamespace(backend=backends.GpuSingleProcess()))
    assert ops._impl("fused", "matmul_all_reduce", 2 ** 50, 2 ** 49, 1) == "fused"  # forced, whatever auto says
    assert ops._impl("xla", "matmul_all_reduce", 1, 1, 1) == "xla"
    with pytest.raises(ValueError, match="unknown impl"):
        ops._impl("fast", "matmul_all_reduce", 1, 1, 1)


def test_fused_ops_wait_as_long_as_the_active_config_says(monkeypatch):
    """A fused op given no timeout_s or config waits `use_config`'s timeout inside its block,
    else the environment's (IRIS_COLLECTIVE_TIMEOUT); its own config or timeout_s wins."""
    from iris_core import flag_protocol
    from iris_jax import config, ops

    def wait_ns(cfg=None, timeout_s=None):  # the kernel's TIMEOUT_NS
        return flag_protocol.timeout_ns(ops._config(cfg, timeout_s).timeout_s)

    monkeypatch.setenv("IRIS_COLLECTIVE_TIMEOUT", "7")
    config._from_environment.cache_clear()
    try:
        assert wait_ns() == 7 * 10**9
        with iris_jax.use_config(iris_jax.CollectiveConfig(timeout_s=2.5)):
            assert wait_ns() == int(2.5e9)
            assert wait_ns(timeout_s=4.0) == 4 * 10**9  # an explicit timeout_s still wins
            assert wait_ns(iris_jax.CollectiveConfig(timeout_s=3.0)) == 3 * 10**9  # and the call's config
        assert wait_ns() == 7 * 10**9
    finally:
        config._from_environment.cache_clear()
