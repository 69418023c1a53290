"""iris_jax.pallas on the CPU simulator (Pallas interpret mode, ranks concurrent), and the
Triton IR it emits for GPUs (lowered for "cuda" on this CPU machine)."""

import contextlib
import io

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.experimental import pallas as pl
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import IrisError, NotOnHeapError
from iris_jax import pallas as ipl
from tests.jax.helpers import read_heap, run_python, smap, use_runtime
from tests.jax.pallas_kernels import (
    CONTENDED_START,
    POISON,
    ROUNDS,
    SEMS,
    N,
    add_into_rank0,
    cas_lock,
    contended,
    contended_expected,
    make_cas_lock,
    poisoned_output,
    ring_put,
)
from tests.jax.pallas_kernels import example as load_example


@pytest.fixture(params=[2, 3, 4], ids=["w2", "w3", "w4"], scope="module")
def world(request):
    """(runtime, mesh, row sharding) over the first W devices."""
    W = request.param
    rt = use_runtime(W)
    mesh = jax.make_mesh((W,), ("x",), devices=jax.devices()[:W])
    return rt, mesh, NamedSharding(mesh, P("x"))


def rows_of(rt, array, n, dtype):
    return np.stack([read_heap(array, r, (n,), dtype) for r in range(rt.world_size)])


# -- remote ops on the simulator ----------------------------------------------------------
def test_ring_put_with_flags(world):
    rt, mesh, rows = world
    W = rt.world_size
    inbox = iris_jax.full((W * N,), POISON, jnp.float32, sharding=rows)
    flags = iris_jax.zeros((W * 4,), jnp.int32, sharding=rows)
    x = jax.device_put(jax.random.normal(jax.random.key(W), (W * N,)), rows)
    step = ipl.pallas_call(ring_put, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), symmetric=(0, 1))
    out = smap(mesh, step, (P("x"), P("x"), P("x")), P("x"))(inbox, flags, x)
    expect = np.roll(np.asarray(x).reshape(W, N) * 2.0, 1, axis=0)
    np.testing.assert_allclose(np.asarray(out).reshape(W, N), expect)
    np.testing.assert_allclose(rows_of(rt, inbox, N, np.float32), expect)
    np.testing.assert_array_equal(rows_of(rt, flags, 4, np.int32)[:, 0], np.ones(W))


def test_contended_atomics(world):
    rt, mesh, rows = world
    W = rt.world_size
    counters = iris_jax.to_heap(jnp.tile(jnp.asarray(CONTENDED_START, jnp.int32), W), sharding=rows)
    step = ipl.pallas_call(contended, out_shape=jax.ShapeDtypeStruct((3,), jnp.int32), grid=(3,),
                           symmetric=(0,))
    old = np.asarray(smap(mesh, step, P("x"), P("x"))(counters))  # waits for the kernels
    np.testing.assert_array_equal(rows_of(rt, counters, 16, np.int32), contended_expected(W))
    programs = 3 * W
    # each program's adds to its W peers return W old values, each below the final count
    assert old.min() >= 0 and old.max() <= W * (programs - 1)


def test_cas_lock(world):
    rt, mesh, rows = world
    W = rt.world_size
    lock = iris_jax.zeros((W,), jnp.int32, sharding=rows)
    counter = iris_jax.zeros((W,), jnp.int32, sharding=rows)
    step = ipl.pallas_call(cas_lock, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), symmetric=(0, 1))
    out = np.asarray(smap(mesh, step, (P("x"), P("x")), P("x"))(lock, counter))
    assert rows_of(rt, counter, 1, np.int32)[0, 0] == W * ROUNDS
    assert rows_of(rt, lock, 1, np.int32)[0, 0] == 0
    assert (out >= ROUNDS).all()


def test_load_with_mask_and_indexing():
    rt = use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    src = iris_jax.to_heap(jnp.arange(2 * 16, dtype=jnp.float32), sharding=rows)

    def kernel(ctx, src_ref, o_ref):
        peer = 1 - ctx.rank
        lanes = jnp.arange(8)
        o_ref[0, :] = ctx.load(src_ref.at[pl.ds(4, 8)], peer, mask=lanes < 5, other=-1.0)
        o_ref[1, :] = ctx.get(src_ref, peer, idx=pl.ds(8, 8))

    step = ipl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((2, 8), jnp.float32), symmetric=(0,))
    out = np.asarray(smap(mesh, step, P("x"), P("x"))(src)).reshape(2, 2, 8)
    table = np.arange(32, dtype=np.float32).reshape(2, 16)
    for r in range(2):
        peer = table[1 - r]
        np.testing.assert_array_equal(out[r, 0], np.where(np.arange(8) < 5, peer[4:12], -1.0))
        np.testing.assert_array_equal(out[r, 1], peer[8:16])
    del rt


def test_world_of_one_outside_shard_map():
    """A single-device jit: the kernel's remote ops go to rank 0 itself."""
    rt = use_runtime(1)
    buf = iris_jax.full((N,), POISON, jnp.float32)

    def kernel(ctx, buf_ref, x_ref, o_ref):
        ctx.put(buf_ref, x_ref[...] + 1.0, to_rank=ctx.rank)
        ctx.atomic_add(buf_ref.at[0], 10.0, to_rank=0)
        o_ref[...] = ctx.load(buf_ref, 0)

    x = jnp.arange(N, dtype=jnp.float32)
    out = jax.jit(ipl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), symmetric=(0,)))(
        buf, x)
    expect = np.arange(N, dtype=np.float32) + 1.0
    expect[0] += 10.0
    np.testing.assert_array_equal(np.asarray(out), expect)
    np.testing.assert_array_equal(read_heap(buf, 0, (N,), np.float32), expect)
    del rt


def test_kernel_with_only_a_remote_effect_is_kept():
    rt = use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    inbox = iris_jax.full((2 * N,), POISON, jnp.float32, sharding=rows)

    def kernel(ctx, inbox_ref, o_ref):
        ctx.store(inbox_ref, jnp.full((N,), 3.0, jnp.float32) + ctx.rank.astype(jnp.float32), 1 - ctx.rank)
        o_ref[0] = 0

    step = ipl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), symmetric=(0,))

    def f(inbox):
        step(inbox)  # result unused
        return jnp.zeros((1,), jnp.float32)

    jaxpr = jax.make_jaxpr(jax.shard_map(f, mesh=mesh, in_specs=P("x"), out_specs=P("x")))(inbox)
    assert "iris_pallas_call" in str(jaxpr)
    smap(mesh, f, P("x"), P("x"))(inbox).block_until_ready()
    got = rows_of(rt, inbox, N, np.float32)
    np.testing.assert_array_equal(got, [[4.0] * N, [3.0] * N])


# -- misuse --------------------------------------------------------------------------------
def test_errors_at_trace_time():
    use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    buf = iris_jax.zeros((2 * N,), jnp.int32, sharding=rows)
    plain = jax.device_put(jnp.zeros((2 * N,), jnp.int32), rows)
    out = jax.ShapeDtypeStruct((N,), jnp.int32)

    def store_to_block(ctx, buf_ref, x_ref, o_ref):
        ctx.store(x_ref, buf_ref[...], 0)

    with pytest.raises(IrisError, match="symmetric operand"):
        smap(mesh, ipl.pallas_call(store_to_block, out_shape=out, symmetric=(0,)), (P("x"), P("x")), P("x"))(
            buf, plain)

    def bad_sem(ctx, buf_ref, o_ref):
        ctx.atomic_add(buf_ref.at[0], 1, 0, sem="seq_cst")

    with pytest.raises(ValueError, match="sem must be"):
        smap(mesh, ipl.pallas_call(bad_sem, out_shape=out, symmetric=(0,)), P("x"), P("x"))(buf)

    def float_xor(ctx, buf_ref, o_ref):
        ctx.atomic_xor(buf_ref.at[0], 1.0, 0)

    fbuf = iris_jax.zeros((2 * N,), jnp.float32, sharding=rows)
    with pytest.raises(TypeError, match="atomic_xor"):
        smap(mesh, ipl.pallas_call(float_xor, out_shape=out, symmetric=(0,)), P("x"), P("x"))(fbuf)

    with pytest.raises(ValueError, match="whole array"):
        ipl.pallas_call(store_to_block, out_shape=out, symmetric=(0,),
                        in_specs=[pl.BlockSpec((4,), lambda: (0,)), None])(buf, plain)
    with pytest.raises(NotOnHeapError):
        ipl.pallas_call(store_to_block, out_shape=out, symmetric=(1,))(buf, plain)


def test_not_on_heap_inside_jit_and_bad_rank_fail_at_run_time():
    use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    buf = iris_jax.zeros((2 * N,), jnp.int32, sharding=rows)

    def kernel(ctx, buf_ref, o_ref):
        ctx.store(buf_ref, jnp.ones((N,), jnp.int32), ctx.rank + 5)

    step = ipl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((N,), jnp.int32), symmetric=(0,))
    with pytest.raises(Exception, match="NotOnHeapError"):
        smap(mesh, lambda b: step(b + 1), P("x"), P("x"))(buf).block_until_ready()
    with pytest.raises(Exception, match="out of range"):
        smap(mesh, step, P("x"), P("x"))(buf).block_until_ready()


# -- light interop: heap arrays through plain Pallas, iris collectives in the same jit --------
def add_one(x_ref, o_ref):
    o_ref[...] = x_ref[...] + 1.0


def test_heap_array_through_plain_pallas_call_with_donation():
    """On GPUs the donated heap buffer is the output (tests/gpu checks); XLA:CPU copies the
    simulator's heap arrays (host memory it does not own) instead, so only values here."""
    rt = use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    x = iris_jax.to_heap(jnp.arange(2 * N, dtype=jnp.float32), sharding=rows)
    out = iris_jax.full((2 * N,), POISON, jnp.float32, sharding=rows)

    def write_into(out, x):
        return pl.pallas_call(lambda o_in, x_ref, o_ref: add_one(x_ref, o_ref),
                              out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), input_output_aliases={0: 0},
                              interpret=True)(out, x)

    # plain pallas_call inside shard_map: check_vma=False, or out_shape with the varying axes
    y = jax.jit(jax.shard_map(write_into, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x"), check_vma=False),
                donate_argnums=0)(out, x)
    expect = np.arange(2 * N, dtype=np.float32) + 1.0
    np.testing.assert_array_equal(np.asarray(y), expect)
    total = smap(mesh, lambda v: iris_jax.psum(v, "x"), P("x"), P())(y)
    np.testing.assert_allclose(np.asarray(total), expect.reshape(2, N).sum(0))
    del rt


def test_kernel_writes_heap_array_in_place_then_collective():
    """The in-place pattern of both platforms: the kernel stores into its symmetric operand on
    its own rank; an iris collective of a later jit reads that heap array. (Within one jit
    XLA may read or copy the operand before the kernel ran: it sees no data dependency.)"""
    rt = use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    buf = iris_jax.full((2 * N,), POISON, jnp.float32, sharding=rows)
    x = jax.device_put(jnp.arange(2 * N, dtype=jnp.float32), rows)

    def fill(ctx, buf_ref, x_ref, o_ref):
        ctx.store(buf_ref, x_ref[...] + 1.0, to_rank=ctx.rank)
        o_ref[0] = 0

    writer = ipl.pallas_call(fill, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), symmetric=(0,))

    np.asarray(smap(mesh, writer, (P("x"), P("x")), P("x"))(buf, x))
    total = np.asarray(smap(mesh, lambda b: iris_jax.psum(b, "x"), P("x"), P())(buf))
    np.testing.assert_allclose(total, (np.arange(2 * N, dtype=np.float32) + 1.0).reshape(2, N).sum(0))
    np.testing.assert_array_equal(rows_of(rt, buf, N, np.float32).reshape(-1), np.arange(2 * N) + 1.0)


def test_pallas_and_iris_collective_in_one_jit():
    # one world size: an iris collective starts the simulator's worker processes (slow)
    W = 2
    use_runtime(W)
    mesh = jax.make_mesh((W,), ("x",), devices=jax.devices()[:W])
    rows = NamedSharding(mesh, P("x"))
    x = jax.device_put(jax.random.normal(jax.random.key(1), (W * N,)), rows)
    plus_one = pl.pallas_call(add_one, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), interpret=True)

    def f(x):
        y = plus_one(x)
        s = iris_jax.psum(y, "x")
        return plus_one(s) * (lax.axis_index("x") + 1).astype(jnp.float32)

    got = np.asarray(smap(mesh, f, P("x"), P("x"), check_vma=False)(x)).reshape(W, N)
    s = (np.asarray(x).reshape(W, N) + 1.0).sum(0) + 1.0
    np.testing.assert_allclose(got, s[None] * np.arange(1, W + 1)[:, None], rtol=1e-5)


def test_remote_signal_ordered_before_iris_kernel():
    """A kernel whose only effect is a remote store, then an iris kernel (device barrier) and
    a second Pallas kernel that reads what the first stored: program order holds."""
    rt = use_runtime(2)
    mesh = jax.make_mesh((2,), ("x",), devices=jax.devices()[:2])
    rows = NamedSharding(mesh, P("x"))
    inbox = iris_jax.full((2 * N,), POISON, jnp.float32, sharding=rows)

    def send(ctx, inbox_ref, o_ref):
        ctx.store(inbox_ref, jnp.full((N,), 1.0, jnp.float32) + ctx.rank.astype(jnp.float32), 1 - ctx.rank)
        o_ref[0] = 0

    def receive(ctx, inbox_ref, o_ref):
        o_ref[...] = ctx.load(inbox_ref, ctx.rank)

    sender = ipl.pallas_call(send, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), symmetric=(0,))
    receiver = ipl.pallas_call(receive, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), symmetric=(0,))

    def f(inbox):
        sender(inbox)
        status, = iris_jax.device_barrier()
        return receiver(inbox), status

    out, status = smap(mesh, f, P("x"), (P("x"), P("x")))(inbox)
    iris_jax.check_barrier(status)
    np.testing.assert_array_equal(np.asarray(out).reshape(2, N), [[2.0] * N, [1.0] * N])
    del rt


# -- the Triton IR for GPUs (lowered for "cuda" here) -----------------------------------------
@contextlib.contextmanager
def _for_an_h200():
    """Pallas's Triton lowering as for an H200: jax 0.12 asks the device it lowers on (a CPU
    here) for its GPU's description; before, it took none."""
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:  # jax 0.10 / 0.11
        yield
        return
    original = gpu_info.get_gpu_info
    gpu_info.get_gpu_info = lambda: gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion.H200)
    try:
        yield
    finally:
        gpu_info.get_gpu_info = original


def triton_ir(step, *structs):
    """The Triton module(s) Pallas prints while lowering `step` for cuda, and the HLO."""
    text = io.StringIO()
    with contextlib.redirect_stdout(text), _for_an_h200():
        lowered = jax.jit(step).trace(*structs).lower(lowering_platforms=("cuda",))
    printed = text.getvalue()
    return printed[printed.find("The Triton module"):], lowered.as_text()


def test_triton_ir_for_gpus():
    use_runtime(2)

    def kernel(ctx, inbox_ref, flags_ref, x_ref, o_ref):
        peer = (ctx.rank + 1) % ctx.world_size
        ctx.store(inbox_ref.at[pl.ds(0, 8)], x_ref[...], to_rank=peer)
        ctx.sync_threads()
        ctx.atomic_add(flags_ref.at[0], 1, to_rank=peer, sem="release")
        ctx.atomic_xchg(flags_ref.at[1], 1, to_rank=peer, sem="relaxed", scope="gpu")
        ctx.atomic_cas(flags_ref.at[2], 0, 1, to_rank=peer, sem="acquire")
        ctx.atomic_max(flags_ref.at[3], 7, to_rank=peer)
        ctx.wait(flags_ref.at[0], 1)
        o_ref[...] = ctx.load(inbox_ref.at[pl.ds(0, 8)], ctx.rank)

    step = ipl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((8,), jnp.float32), symmetric=(0, 1),
                           interpret=False, debug=True)
    ir, hlo = triton_ir(step, jax.ShapeDtypeStruct((16,), jnp.float32), jax.ShapeDtypeStruct((4,), jnp.int32),
                        jax.ShapeDtypeStruct((8,), jnp.float32))
    # pointer translation: bases read from the context as int64 words, pointers moved by the difference
    assert "tt.bitcast %arg0 : !tt.ptr<i32> -> !tt.ptr<i64>" in ir
    assert "tt.ptr_to_int" in ir and "tt.int_to_ptr" in ir
    assert "tensor<8x!tt.ptr<f32>> -> tensor<8xi64>" in ir  # the block store's pointers
    assert "tt.atomic_rmw add, release, sys" in ir
    assert "tt.atomic_rmw exch, relaxed, gpu" in ir
    assert "tt.atomic_cas acquire, sys" in ir
    assert "tt.atomic_rmw max, acq_rel, sys" in ir
    assert 'ld.acquire.sys.global.b32 $0, [$1];' in ir and "pure = false" in ir
    assert "scf.while" in ir  # the wait polls in a loop
    assert "gpu.barrier" in ir  # sync_threads
    # the kernel is kept: Pallas's custom call is marked side-effecting
    calls = [line for line in hlo.splitlines() if "__gpu$xla.gpu.triton" in line]
    assert len(calls) == 1 and "has_side_effect = true" in calls[0]


@pytest.mark.parametrize("W", [2, 4])
def test_multi_rank_scenario_kernels_lower_for_gpus(W):
    """The kernels of tests/gpu/scenarios.py's `pallas` scenario (the shared-GPU runs), each with
    its output aliased to a poisoned input as there, lowered for cuda at the world sizes it runs at."""
    from tests.gpu.scenarios import PALLAS_ADD_PROGRAMS, PALLAS_LOCK_ROUNDS

    use_runtime(W)
    S, f32, i32 = jax.ShapeDtypeStruct, jnp.float32, jnp.int32
    example = load_example()
    n, programs, sems = example.N, PALLAS_ADD_PROGRAMS, len(SEMS)
    cases = {  # name: kernel, inputs (one rank's), output, grid, symmetric, what its IR must hold
        "ring_put": (ring_put, [S((N,), f32), S((4,), i32), S((N,), f32)], S((N,), f32), (), (0, 1),
                     ["tt.atomic_rmw add, release, sys", "ld.acquire.sys.global.b32"]),
        "contended": (contended, [S((16,), i32)], S((3,), i32), (3,), (0,),
                      ["tt.atomic_rmw max, relaxed, sys", "tt.atomic_rmw min, acq_rel, gpu"]),
        "add_into_rank0": (add_into_rank0, [S((sems,), i32)], S((programs * sems,), i32), (programs,), (0,),
                           [f"tt.atomic_rmw add, {sem}, sys" for sem in SEMS]),
        "cas_lock": (make_cas_lock(PALLAS_LOCK_ROUNDS["gpu"]), [S((1,), i32)] * 2, S((1,), i32), (), (0, 1),
                     ["tt.atomic_cas acquire, sys", "tt.atomic_rmw exch, release, sys", "scf.while"]),
        "one_shot_all_reduce": (example.one_shot_all_reduce, [S((n,), f32), S((W,), i32), S((1,), i32),
                                                              S((n,), f32)], S((n,), f32), (), (0, 1),
                                ["tt.atomic_rmw max, release, sys", "ld.acquire.sys.global.b32"]),
    }
    for name, (kernel, ins, out, grid, symmetric, wanted) in cases.items():
        step = ipl.pallas_call(poisoned_output(kernel, len(ins)), out_shape=out, grid=grid, symmetric=symmetric,
                               input_output_aliases={len(ins): 0}, interpret=False, debug=True)
        ir, hlo = triton_ir(step, *ins, out)
        for text in wanted:
            assert text in ir, (name, text)
        assert "tt.int_to_ptr" in ir, name  # pointers translated to the peer's heap
        calls = [line for line in hlo.splitlines() if "__gpu$xla.gpu.triton" in line]
        assert len(calls) == 1 and "has_side_effect = true" in calls[0], name
        assert "output_operand_aliases" in calls[0], name  # the output starts as the poisoned input


def test_example_one_shot_all_reduce():
    result = run_python(["examples/06_pallas_all_reduce.py"], timeout=300,
                        XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "equals lax.psum" in result.stdout
