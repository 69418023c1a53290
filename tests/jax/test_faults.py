"""The simulator's fault matrix: one test per fault and execution model.

Modes: "workers" is one process with CPU devices, each device's kernels run by its rank's
worker process (iris_core.sim.world); "launched" is `python -m iris_core.sim`, one process per
rank (launched_faults.py). In every case the surviving ranks fail after the configured
timeout with an error naming the op and the rank (launched: the launcher stops them and names
the rank that failed), heap memory that no kernel should have touched keeps its
poison, and the next program works, or fails saying why and works after
`iris_jax.shutdown()`. Each test prints its time to the error ("fault matrix |" lines; run
with -s to see them). No verdict here depends on elapsed time (docs/testing.md): a call that must
fail at once is given a timeout far above any slowness (AT_ONCE_S), so that the error it raises,
not a clock, tells "at once" from "timed out"; how soon errors come is benchmarks/fault_latency.py.

Calls that differ between ranks (a shape, under rank-dependent control flow or between the
processes of a multi-controller run) pair anyway, since the kernels count calls; the simulator's
call records (iris_core.sim.call_table) catch the difference and every rank fails with
RankMismatchError. A psum that only some ranks call pairs with the others' next one of the same
signature, as on GPUs; the records also hold each call's line of the program, so every rank
warns that the calls came from different lines (RankDivergenceWarning) and the ranks that then
time out name the rank that made fewer calls and the lines where the calls parted
(test_collective_called_by_only_some_ranks).
"""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import HeapExhaustedError, PeerTimeoutError, RankDivergenceWarning
from iris_core.heap.rendezvous import FileStore, store_barrier
from iris_core.heap.shared_memory import SHM_DIR
from iris_jax.calls import host_meeting
from tests.jax import fault_kernels
from tests.jax.helpers import REPO, child_env, read_heap, use_runtime

W = 3  # ranks of the workers-mode cases (their worker processes are reused across tests)
N = 64
TIMEOUT_S = 2.0  # the collectives' timeout in these tests
AT_ONCE_S = 60.0  # the timeout of calls that must fail at once: a slow machine cannot make them time out
POISON = -7.0
F32 = jax.ShapeDtypeStruct((N,), jnp.float32)


def record(case: str, mode: str, error: str, seconds: float) -> None:
    print(f"\nfault matrix | {case} | {mode} | {error} | {seconds:.2f} s", flush=True)


# -- workers mode: one process, W CPU devices ----------------------------------------------------
@pytest.fixture(params=["host", "kernels", "host, Python meeting"])
def world(request, monkeypatch):
    """A fresh runtime over the first W devices whose workers ran a collective (warm: a rank's
    first kernel can take longer than TIMEOUT_S); shut down afterwards, as a fault leaves
    the group's flags poisoned. Each test runs with the collectives on the host and as kernels
    (init(sim_collectives=...)), and on the host with the Python meeting that runs where no C
    compiler is found (host_meeting.enabled): the faults are named the same every way."""
    if request.param.endswith("Python meeting"):
        monkeypatch.setattr(host_meeting, "enabled", False)
    iris_jax.shutdown()
    rt = use_runtime(W, sim_collectives=request.param.split(",")[0])
    check_psum_works()
    yield rt
    iris_jax.shutdown()


def restart() -> None:
    """shutdown() then init(), as a user recovers, with the collectives run as before."""
    mode = iris_jax.runtime().sim_collectives
    iris_jax.shutdown()
    use_runtime(W, sim_collectives=mode)


def mesh():
    return jax.make_mesh((W,), ("i",), devices=jax.devices()[:W])


def rows(values):
    return jax.device_put(values, NamedSharding(mesh(), P("i")))


def inputs():
    return rows(np.arange(W * N, dtype=np.float32).reshape(W, N) + 1)


def spmd(body):
    """jit(shard_map(body)) over the W ranks: each argument and the result one row per rank."""
    return jax.jit(jax.shard_map(lambda *a: body(*[v[0] for v in a])[None], mesh=mesh(), in_specs=P("i"),
                                 out_specs=P("i"), check_vma=False))


def psum(v, timeout_s: float = TIMEOUT_S):
    return iris_jax.psum(v, "i", config=iris_jax.CollectiveConfig(timeout_s=timeout_s))


def check_psum_works():
    """A psum over the W ranks gives numpy's sum. Its timeout is the default's: a rank whose worker
    starts afresh (after a restart) can take longer than TIMEOUT_S to reach it."""
    x = inputs()
    got = np.asarray(spmd(lambda v: psum(v, 60.0))(x))
    np.testing.assert_array_equal(got, np.broadcast_to(np.asarray(x).sum(0), (W, N)))


def errors_by_rank(out) -> list[str | None]:
    """Each rank's error (None: its shard is ready), waiting for every rank."""
    errors = []
    for shard in sorted(out.addressable_shards, key=lambda s: s.device.id):
        try:
            shard.data.block_until_ready()
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - each device's error comes as a JaxRuntimeError
            errors.append(str(e))
    return errors


def expect_every_read_raises(out, ranks, *words) -> None:
    """JAX's own ways to read a result (block_until_ready, np.asarray, float, .item(),
    device_get, printing, a later program consuming it) raise the error naming `words` on each
    of `ranks`: a failed call's outputs are never read as numbers."""
    shards = sorted(out.addressable_shards, key=lambda s: s.device.id)
    for r in ranks:
        block = shards[r].data
        reads = {"jax.block_until_ready": lambda: jax.block_until_ready(block), "np.asarray": lambda: np.asarray(block),
                 "float": lambda: float(block.reshape(-1)[0]), ".item()": lambda: block.reshape(-1)[0].item(),
                 "jax.device_get": lambda: jax.device_get(block), "print": lambda: str(block),
                 "a later program": lambda: np.asarray(jax.jit(lambda b: b * 2 + 1)(block))}
        for name, read in reads.items():
            with pytest.raises(Exception) as caught:
                read()
            assert all(w in str(caught.value) for w in words), (r, name, str(caught.value)[:500])


class Untouched:
    """A heap array and an XLA array filled with POISON on every rank, which no program of a test
    touches: a stray write of a failing rank would show in them."""

    def __init__(self):
        self.heap = iris_jax.full((W, N), POISON, jnp.float32, sharding=NamedSharding(mesh(), P("i")))
        self.xla = rows(np.full((W, N), POISON, np.float32))

    def check(self):
        for r in range(W):
            np.testing.assert_array_equal(read_heap(self.heap, r, (N,), np.float32), POISON)
        np.testing.assert_array_equal(np.asarray(self.xla), POISON)


def expect_group_poisoned_then_restart():
    """The next collective of the group that timed out fails at once saying why; after shutdown
    and init, it works."""
    errors = errors_by_rank(spmd(lambda v: psum(v, AT_ONCE_S))(inputs()))
    # PeerFailedError, not PeerTimeoutError: failed at once, not by timing out
    assert all(e is not None and "PeerFailedError" in e and "Start again: iris_jax.shutdown() then init()" in e
               for e in errors), errors
    restart()
    check_psum_works()


def expect_timeouts_naming(errors, missing: int, ranks) -> None:
    for r in ranks:
        assert errors[r] is not None and "PeerTimeoutError" in errors[r], (r, errors[r])
        assert f"iris all_reduce(sum): timed out waiting for rank {missing}" in errors[r], errors[r]


def expect_survivors_failed_on_rank_1(errors, untouched: Untouched) -> None:
    """Ranks 0 and 2 timed out naming rank 1, nothing outside the heaps changed, and the group
    then fails at once until a restart."""
    expect_timeouts_naming(errors, 1, (0, 2))
    untouched.check()
    expect_group_poisoned_then_restart()


def test_worker_killed_mid_collective(world):
    """Case 1 (workers): rank 1's worker is SIGKILLed while ranks 0 and 2 wait for it in a psum.
    Rank 1 fails as dead; 0 and 2 time out naming rank 1 (their workers are left alone)."""
    untouched = Untouched()
    started = iris_jax.zeros((W, 1), jnp.int32, sharding=NamedSharding(mesh(), P("i")))
    pids = world.sim_world.run(fault_kernels.worker_pid)
    late = spmd(lambda s, v: psum(iris_jax.triton_call(s, v, N, 1, 60 * 10**9, kernel=fault_kernels.spin_on_rank,
                                                       out_shape=F32, grid=(1,), W=W, BLOCK=N)))
    out = late(started, inputs())
    deadline = time.monotonic() + 60
    while read_heap(started, 1, (1,), np.int32)[0] != 1:  # rank 1 is inside its kernel
        assert time.monotonic() < deadline, "rank 1's kernel never started"
        time.sleep(0.01)
    time.sleep(0.3)  # ranks 0 and 2 likely reach the psum; arriving after the kill, they time out all the same
    start = time.monotonic()
    os.kill(pids[1], signal.SIGKILL)
    errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    record("1 rank killed mid-collective", "workers", "rank 1: SimulatedRankError died (exit code -9); "
           "ranks 0, 2: PeerTimeoutError naming all_reduce(sum) and rank 1", elapsed)
    assert "simulated rank 1 died (exit code -9) while running kernel spin_on_rank" in errors[1], errors[1]
    expect_survivors_failed_on_rank_1(errors, untouched)


def test_worker_killed_between_calls_is_replaced(world):
    """Case 1 (workers): a worker that dies while idle lost no call; the next call starts a new
    one, with a warning (the next program then runs, as after test_worker_killed_mid_collective)."""
    pids = world.sim_world.run(fault_kernels.worker_pid)
    os.kill(pids[2], signal.SIGKILL)
    wait_until_dead(pids[2])
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match=r"simulated rank 2's worker had exited \(code -9\) since its last call"):
        now = world.sim_world.run(fault_kernels.worker_pid)
    record("1 worker killed between calls", "workers", "none: a new worker, RuntimeWarning",
           time.monotonic() - start)
    assert now[:2] == pids[:2] and now[2] != pids[2]


def wait_until_dead(pid: int) -> None:
    """Until this process's child `pid` has exited (left unreaped: its Popen still reports it)."""
    deadline = time.monotonic() + 30
    while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        assert time.monotonic() < deadline, f"process {pid} outlived SIGKILL"
        time.sleep(0.01)


@pytest.mark.parametrize("fault", ["heap_guard", "device_assert"])
def test_rank_raising_inside_a_kernel(world, fault):
    """Case 2 (workers): a kernel fails on rank 1 only, before a psum: a store past the heap's end
    (the heap guard refuses it) or a device-side assertion (triton_call(debug=True)). Rank 1
    fails with that error, ranks 0 and 2 time out in the psum naming rank 1."""
    untouched = Untouched()
    buf = iris_jax.full((W, N), POISON, jnp.float32, sharding=NamedSharding(mesh(), P("i")))
    past = world.heap_size // 4  # elements: a store there lands a whole heap further on
    if fault == "heap_guard":
        program = spmd(lambda b, v: psum(iris_jax.triton_call(
            b, v, N, 1, past, kernel=fault_kernels.store_past_heap_on_rank, out_shape=F32, grid=(1,), W=W, BLOCK=N)))
        args = (buf, inputs())
    else:
        program = spmd(lambda v: psum(iris_jax.triton_call(
            v, N, 1, kernel=fault_kernels.assert_not_on_rank, out_shape=F32, grid=(1,), W=W, BLOCK=N, debug=True)))
        args = (inputs(),)
    program = program.lower(*args).compile()
    start = time.monotonic()
    errors = errors_by_rank(program(*args))
    elapsed = time.monotonic() - start
    if fault == "heap_guard":
        record("2 rank raising in a kernel (heap guard)", "workers", "rank 1: NotOnHeapError (kernel, op, rank, "
               "offset); ranks 0, 2: PeerTimeoutError naming rank 1", elapsed)
        assert ("NotOnHeapError: kernel store_past_heap_on_rank on rank 1: store to rank 1 through a pointer at "
                "byte offset ") in errors[1] and " past the heap's " in errors[1], \
            errors[1]
        x = np.asarray(args[1])
        for r in range(W):  # ranks 0 and 2 stored into their own buf; rank 1's store was refused
            np.testing.assert_array_equal(read_heap(buf, r, (N,), np.float32), POISON if r == 1 else x[r])
    else:
        record("2 rank raising in a kernel (device_assert)", "workers", "rank 1: AssertionError (its message); "
               "ranks 0, 2: PeerTimeoutError naming rank 1", elapsed)
        assert "simulated rank 1 raised" in errors[1] and "AssertionError" in errors[1], errors[1]
        assert "fault test: assertion failed on the victim rank" in errors[1], errors[1]
    expect_survivors_failed_on_rank_1(errors, untouched)


def test_rank_that_never_calls_the_collective(world):
    """Case 3 (workers): rank 1 takes a branch without the psum; ranks 0 and 2 time out naming it."""
    untouched = Untouched()
    x = inputs()
    program = spmd(lambda v: lax.cond(lax.axis_index("i") == 1, lambda u: u, psum, v)).lower(x).compile()
    start = time.monotonic()
    out = program(x)
    errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    expect_every_read_raises(out, (0, 2), "PeerTimeoutError", "all_reduce(sum)", "rank 1")
    record("3 rank never calls the collective", "workers", "ranks 0, 2: PeerTimeoutError naming all_reduce(sum) "
           "and rank 1; rank 1: no error", elapsed)
    assert errors[1] is None
    expect_survivors_failed_on_rank_1(errors, untouched)


def test_device_barrier_without_a_rank(world):
    """Case 3b (workers): rank 1 skips a device barrier; ranks 0 and 2 fail naming it, through every
    JAX read of the barrier's results; the next barrier fails at once on every rank (rank 1 names a
    rank that gave up, the others rank 1), until a restart."""
    x = inputs()
    barrier = lambda u: iris_jax.device_barrier(u, timeout_s=TIMEOUT_S)[1]  # noqa: E731
    program = spmd(lambda v: lax.cond(lax.axis_index("i") == 1, lambda u: u, barrier, v)).lower(x).compile()
    start = time.monotonic()
    out = program(x)
    errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    assert errors[1] is None
    for r in (0, 2):
        assert errors[r] is not None and "PeerTimeoutError: iris device_barrier: timed out" in errors[r], errors[r]
        assert "waiting for rank 1" in errors[r], errors[r]
    expect_every_read_raises(out, (0, 2), "PeerTimeoutError", "device_barrier", "rank 1")
    errors = errors_by_rank(spmd(barrier)(x))
    assert all(e is not None and ("PeerFailedError: iris device_barrier" in e or "PeerTimeoutError" in e)
               for e in errors), errors
    record("3b device barrier without a rank", "workers", "ranks 0, 2: PeerTimeoutError naming device_barrier "
           "and rank 1; the next barrier fails at once", elapsed)
    restart()
    check_psum_works()


def test_collective_called_by_only_some_ranks(world):
    """Case 6 (workers): rank 1 skips the first of two psums (the second sums the first's
    result). The kernels pair calls by their count, as on GPUs, so rank 1's only psum pairs
    with the others' first one and returns their sum; every rank warns that call 0 came from
    different lines, and ranks 0 and 2, which then time out in their second psum, name rank 1,
    the one call it made, and the lines where the calls parted."""

    # The calls that pair wait AT_ONCE_S, so that ranks starting apart on a loaded machine still
    # pair them; only the others' second psum, which rank 1 never makes, waits TIMEOUT_S.
    def first(v):
        return psum(v, AT_ONCE_S)

    def rank_1s_only(v):
        return psum(v, AT_ONCE_S)

    def second(v):
        return psum(v)

    def body(v):
        u = 10 * lax.cond(lax.axis_index("i") == 1, lambda u: u, first, v)
        return lax.cond(lax.axis_index("i") == 1, rank_1s_only, second, u)

    x = inputs()
    program = spmd(body).lower(x).compile()
    start = time.monotonic()
    with pytest.warns(RankDivergenceWarning) as warned:
        out = program(x)
        errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    expect_timeouts_naming(errors, 1, (0, 2))
    # both calls are made by psum() of this file; the lines that call it tell them apart
    here, helper = os.path.basename(__file__), psum.__code__.co_firstlineno + 1
    first_at = f"at {here}:{helper} < {here}:{first.__code__.co_firstlineno + 1}"
    rank_1_at = f"at {here}:{helper} < {here}:{rank_1s_only.__code__.co_firstlineno + 1}"
    for r in (0, 2):  # (the group's calls are numbered from the world's first test on)
        made = re.search(r"rank 1 has made (\d+) call\(s\) of this group .*this rank's call (\d+) waits", errors[r])
        assert made and int(made[1]) == int(made[2]), errors[r]
        assert (f"their calls parted at call {int(made[1]) - 1}: this rank ran iris all_reduce(sum) of "
                f"(float32[1, 64]) {first_at}") in errors[r], errors[r]
        assert f"rank 1 ran iris all_reduce(sum) of (float32[1, 64]) {rank_1_at}" in errors[r], errors[r]
    texts = [str(w.message) for w in warned]
    assert any(t.startswith("rank 1: call ") and first_at in t and rank_1_at in t for t in texts), texts
    got = np.asarray(out.addressable_shards[1].data)[0]
    xs = np.asarray(x)
    np.testing.assert_array_equal(got, xs[0] + 10 * xs[1] + xs[2])  # the others' first psum, paired
    record("6 collective called by only some ranks", "workers", "ranks 0, 2: PeerTimeoutError naming rank 1, "
           "its one call and the lines where the calls parted; every rank: RankDivergenceWarning naming both "
           "lines (rank 1 returns the others' first psum, as on GPUs)", elapsed)
    expect_group_poisoned_then_restart()


def test_calls_that_differ_between_ranks(world):
    """Case 5 (workers): under rank-dependent control flow rank 1 sums 32 elements where the others
    sum 64. The kernels compare the signatures their members wrote beside their flags (as on GPUs),
    so every rank fails with RankMismatchError naming both shapes and the other rank, at once;
    nothing outside the heaps changes, and the group then fails at once until a restart."""
    untouched = Untouched()
    x = inputs()
    half = lambda u: jnp.pad(psum(u[:N // 2], AT_ONCE_S), (0, N // 2))  # noqa: E731
    program = spmd(lambda v: lax.cond(lax.axis_index("i") == 1, half, lambda u: psum(u, AT_ONCE_S), v))
    program = program.lower(x).compile()
    start = time.monotonic()
    out = program(x)
    errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    expect_every_read_raises(out, range(W), "RankMismatchError", "all_reduce(sum)")
    for r, error in enumerate(errors):
        assert error is not None and "RankMismatchError: iris all_reduce(sum)" in error, (r, error)
        assert "float32[1, 32]" in error and "float32[1, 64]" in error, error
        assert f"rank {1 if r != 1 else 0}" in error or f"rank {2 if r != 1 else 0}" in error, error
    record("5 calls that differ between ranks", "workers", "every rank: RankMismatchError naming both shapes",
           elapsed)
    untouched.check()
    expect_group_poisoned_then_restart()


def set_failed_word(rank: int, member: int, code: int) -> None:
    """Writes into `rank`'s streamed region the `failed` word that member `member` writes there
    when it gives up (`code`) in the group's next streamed call."""
    from iris_core import flag_protocol
    from iris_core.collectives.workspace import STREAM_BYTES_PER_COUNTER, STREAM_COUNTER_ARRAYS
    from iris_jax._runtime.workspace import workspaces

    rt = iris_jax.runtime()
    pool = workspaces(rt)
    (ws,) = pool.allocated("collective")  # the group's one workspace (its calls' size class)
    layout, offset = ws.layout, ws.offset
    region = offset + layout.stream
    counters = -(-STREAM_COUNTER_ARRAYS * 4 * (layout.stream_capacity // STREAM_BYTES_PER_COUNTER) // 8) * 8
    calls_at = region + 128 + 2 * layout.stream_capacity + counters + 2 * 8 * rt.world_size  # see streamed.py
    calls = int(rt.heap.host_view(rank, calls_at, (1,), np.int32)[0])
    rt.heap.host_view(rank, region, (1,), np.int64)[0] = flag_protocol.failed_word(member, code, calls + 1)


@pytest.mark.parametrize("world", ["kernels"], indirect=True)  # the kernels' streamed protocol
def test_calls_that_differ_seen_before_a_rank_starts(world):
    """Case 5, with rank 1's kernel starting after rank 2 saw the calls differ (its `failed` word
    already says so, as on a GPU whose ranks start far apart): rank 1 still delivers its tiles
    before it fails, so rank 0, which waits for them to read rank 1's signature, fails at once
    with RankMismatchError, as every rank does; none times out. (Found on one H200 with 4 ranks,
    rank 0 timing out waiting for rank 1 in about one run in two.)"""
    from iris_core import faults

    x = inputs()
    half = lambda u: jnp.pad(psum(u[:N // 2], AT_ONCE_S), (0, N // 2))  # noqa: E731
    program = spmd(lambda v: lax.cond(lax.axis_index("i") == 0, half, lambda u: psum(u, AT_ONCE_S), v))
    program = program.lower(x).compile()
    set_failed_word(1, member=2, code=faults.MISMATCH)
    start = time.monotonic()
    errors = errors_by_rank(program(x))
    elapsed = time.monotonic() - start
    for r, error in enumerate(errors):
        assert error is not None and "RankMismatchError: iris all_reduce(sum)" in error, (r, error)
        assert f"rank {1 if r == 0 else 0} made a different call" in error, (r, error)
    record("5 calls that differ, a rank starting late", "workers", "every rank: RankMismatchError", elapsed)
    expect_group_poisoned_then_restart()


def fused(u, w, rows: int, timeout_s: float = TIMEOUT_S):
    """matmul_all_reduce of u's first `rows` rows with w (the fused kernel), padded back to u's rows."""
    out = iris_jax.ops.matmul_all_reduce(u[:rows], w, "i", impl="fused", timeout_s=timeout_s)
    return jnp.pad(out, ((0, u.shape[0] - rows), (0, 0)))


def fused_inputs():
    return (rows(np.ones((W, 32, 8), np.float32)), rows(np.ones((W, 8, 16), np.float32)))


def expect_fused_group_poisoned_then_restart():
    """The next fused call of the group fails at once with PeerFailedError (the lines of the
    ranks that gave up are poisoned) instead of pairing calls whose epochs no longer agree;
    after shutdown and init, it works."""
    errors = errors_by_rank(spmd(lambda u, w: fused(u, w, 32, AT_ONCE_S))(*fused_inputs()))
    # PeerFailedError, not PeerTimeoutError: failed at once, not by timing out
    assert all(e is not None and "PeerFailedError: iris matmul_all_reduce" in e for e in errors), errors
    restart()
    got = np.asarray(spmd(lambda u, w: fused(u, w, 32))(*fused_inputs()))
    np.testing.assert_array_equal(got, np.full((W, 32, 16), 8.0 * W, np.float32))


def test_fused_calls_that_differ_between_ranks(world):
    """Case 5 for the fused GEMM ops: rank 0 multiplies 16 rows where the others multiply 32. The
    kernels compare the signatures their members announced (as the collectives do), so every rank
    fails at once with RankMismatchError from the kernel itself (not the simulator's call
    records), naming matmul_all_reduce and its shapes; no tile of a differing call is read."""
    a, b = fused_inputs()
    program = spmd(lambda u, w: lax.cond(lax.axis_index("i") == 0, lambda u, w: fused(u, w, 16, AT_ONCE_S),
                                         lambda u, w: fused(u, w, 32, AT_ONCE_S), u, w)).lower(a, b).compile()
    start = time.monotonic()
    out = program(a, b)
    errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    expect_every_read_raises(out, range(W), "RankMismatchError", "matmul_all_reduce")
    for r, error in enumerate(errors):
        assert error is not None and "RankMismatchError: iris matmul_all_reduce: rank" in error, (r, error)
        assert "made a different call" in error, (r, error)
        assert ("[16 x 8] @ [8 x 16]" if r == 0 else "[32 x 8] @ [8 x 16]") in error, (r, error)
    record("5 fused calls that differ between ranks", "workers", "every rank: RankMismatchError", elapsed)
    expect_fused_group_poisoned_then_restart()


def test_fused_call_without_a_rank(world):
    """Case 3 for the fused GEMM ops: rank 1 skips a matmul_all_reduce; ranks 0 and 2 time out
    naming it, and poison their lines, so that the group's next fused call fails at once on every
    rank (rank 1 included) instead of pairing epochs that no longer agree."""
    a, b = fused_inputs()
    program = spmd(lambda u, w: lax.cond(lax.axis_index("i") == 1, lambda u, w: u[:, :1] * w[:1],
                                         lambda u, w: fused(u, w, 32), u, w)).lower(a, b).compile()
    start = time.monotonic()
    out = program(a, b)
    errors = errors_by_rank(out)
    elapsed = time.monotonic() - start
    expect_every_read_raises(out, (0, 2), "PeerTimeoutError", "matmul_all_reduce", "rank 1")
    assert errors[1] is None
    record("3 rank never calls the fused op", "workers", "ranks 0, 2: PeerTimeoutError naming rank 1", elapsed)
    expect_fused_group_poisoned_then_restart()


def test_heap_exhausted_mid_program(world):
    """Case 4 (workers): after kernels ran, an array and a new group's collective workspace that do
    not fit fail with HeapExhaustedError before anything runs; the heap's bookkeeping is as
    before, and allocations and collectives that fit work."""
    heap = world.heap
    rows_sharding = NamedSharding(mesh(), P("i"))

    def bookkeeping():
        return heap.allocations(), heap.used, heap.largest_free_block

    before = bookkeeping()
    start = time.monotonic()
    with pytest.raises(HeapExhaustedError, match="symmetric heap exhausted: requested"):
        iris_jax.zeros((W, world.heap_size // 4), jnp.float32, sharding=rows_sharding)
    elapsed = time.monotonic() - start
    assert bookkeeping() == before
    # fill the heap but 64 KiB: a collective over a new group (ranks 0 and 1) needs a workspace
    filler = iris_jax.empty((W, (heap.largest_free_block - (64 << 10)) // 4), jnp.float32, sharding=rows_sharding)
    pair = jax.make_mesh((2,), ("i",), devices=jax.devices()[:2])
    y = jax.device_put(np.arange(2 * N, dtype=np.float32).reshape(2, N), NamedSharding(pair, P("i")))
    pair_psum = jax.jit(jax.shard_map(lambda v: psum(v[0]), mesh=pair, in_specs=P("i"), out_specs=P()))
    full = bookkeeping()
    with pytest.raises(HeapExhaustedError, match="symmetric heap exhausted"):
        pair_psum(y)
    assert bookkeeping() == full
    record("4 heap exhausted mid-program", "workers", "HeapExhaustedError (requested, in use, largest free block), "
           "before any launch", elapsed)
    del filler
    gc.collect()
    assert bookkeeping() == before
    z = iris_jax.full((W, N), 5.0, jnp.float32, sharding=rows_sharding)  # fits
    got = np.asarray(spmd(psum)(z))
    np.testing.assert_array_equal(got, np.full((W, N), 5.0 * W))
    np.testing.assert_array_equal(np.asarray(pair_psum(y)), np.asarray(y).sum(0))


# -- host barrier ----------------------------------------------------------------------------
def test_host_barrier_names_the_rank_that_never_arrives(tmp_path):
    """Case 6 (launched, the host barrier of iris_jax.barrier() and allocate_shared): rank 0 of 2
    waits alone; it fails after the timeout (its deadline is on the monotonic clock), naming the
    barrier and rank 1."""
    start = time.monotonic()
    with pytest.raises(PeerTimeoutError, match=r"host barrier 'iris/s/sync/1': rank 0 timed out after 0.5 s "
                                               r"waiting for rank 1 \(it never arrived"):
        store_barrier(FileStore(str(tmp_path)), "iris/s/sync/1", 0, 2, 0.5)
    assert time.monotonic() - start >= 0.5  # not before its timeout


# -- launched mode: one process per rank -------------------------------------------------------
def launch(case: str, world_size: int, on_line=None, **env) -> tuple[int, list[tuple[float, str]]]:
    """Runs launched_faults.py CASE; returns the launcher's status and its output lines with the
    time each arrived. `on_line(line)` sees each line as it comes."""
    proc = subprocess.Popen([sys.executable, "-m", "iris_core.sim", "-n", str(world_size), "--timeout", "240",
                             "tests/jax/launched_faults.py", case], cwd=REPO, env=child_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    lines = []
    try:
        for line in proc.stdout:
            lines.append((time.monotonic(), line.rstrip("\n")))
            if on_line is not None:
                on_line(line)
        return proc.wait(), lines
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def when(lines, text: str) -> float:
    """When the first line containing `text` arrived."""
    return next(t for t, line in lines if text in line)


def when_said(lines, rank: int, what: str) -> float:
    """When `rank` said it is about to do `what`."""
    return next(t for t, line in lines if (w := said(line)) is not None and (w[0], w[2]) == (rank, what))


def said(line: str):
    """(rank, pid, what) of a launched_faults.py line ("[rank R] rank R pid P: what"), else None."""
    match = re.match(r"\[rank (\d+)\] rank \d+ pid (\d+): (.*)", line)
    return None if match is None else (int(match[1]), int(match[2]), match[3].strip())


def output(lines) -> str:
    return "\n".join(line for _, line in lines)


def session_left(lines) -> list[str]:
    """Shared-memory files of the run's session that are left behind."""
    session = next(line.split("session ")[1] for _, line in lines if ": session " in line)
    return [name for name in os.listdir(SHM_DIR) if session in name]


def test_launched_rank_killed_mid_collective():
    """Case 1 (launched): ranks 0 and 1 wait in a device barrier for rank 2; rank 1 is SIGKILLed
    there. The launcher stops the others at once and names rank 1; nothing is left behind."""
    pids, waiting, killed = {}, set(), []

    def kill_rank_1_in_the_barrier(line):
        if (what := said(line)) is None:
            return
        rank, pid, doing = what
        pids[rank] = pid
        if doing == "barrier":
            waiting.add(rank)
        if waiting == {0, 1} and not killed:
            time.sleep(0.3)  # likely inside the barrier's kernel; killed before it, the verdict is the same
            killed.append(time.monotonic())
            os.kill(pids[1], signal.SIGKILL)

    status, lines = launch("kill", 3, kill_rank_1_in_the_barrier)
    text = output(lines)
    assert killed, text
    elapsed = when(lines, "[iris.sim] rank 1 exited with status -9; stopping the others") - killed[0]
    record("1 rank killed mid-collective", "launched", "launcher: rank 1 exited with status -9, the others "
           "stopped", elapsed)
    assert status != 0
    assert "unexpected" not in text
    assert session_left(lines) == []


def test_launched_rank_raising_inside_a_kernel():
    """Case 2 (launched): rank 1's kernel stores past its heap's end; the heap guard refuses it
    (NotOnHeapError naming the kernel, op, rank and offset), and the launcher stops rank 0, which
    waits in a barrier."""
    status, lines = launch("raise", 2, IRIS_SIM_CHECKED="1")
    text = output(lines)
    elapsed = when(lines, "[iris.sim] rank 1 exited with status 1") - when_said(lines, 1, "store")
    record("2 rank raising in a kernel (heap guard)", "launched", "rank 1: NotOnHeapError; launcher: rank 1 "
           "exited with status 1, the others stopped", elapsed)
    assert status == 1, text
    assert "NotOnHeapError: kernel store_past_heap_on_rank on rank 1: store to rank 1 through a pointer" in text
    assert "unexpected" not in text
    assert session_left(lines) == []


def test_launched_rank_that_never_calls_init():
    """Case 3 (launched): rank 1 lives but never calls iris_jax.init(); rank 0's init fails after
    IRIS_RENDEZVOUS_TIMEOUT naming init and rank 1."""
    status, lines = launch("never_init", 2, IRIS_RENDEZVOUS_TIMEOUT="2")
    text = output(lines)
    elapsed = when(lines, "[iris.sim] rank 0 exited with status 1") - when_said(lines, 0, "init")
    record("3 rank never calls init", "launched", "rank 0: PeerTimeoutError (init) naming rank 1", elapsed)
    assert status == 1, text
    assert "PeerTimeoutError: iris heap" in text and "(init): rank 0 waited 2 s for rank 1's heap" in text, text


def test_launched_collective_called_by_only_some_ranks():
    """Case 6 (launched): rank 1 initializes but never calls the device barrier; rank 0's
    barrier times out naming rank 1."""
    status, lines = launch("skip_barrier", 2, FAULT_BARRIER_TIMEOUT=str(TIMEOUT_S))
    text = output(lines)
    elapsed = when(lines, "[iris.sim] rank 0 exited with status 1") - when_said(lines, 0, "barrier")
    record("6 collective called by only some ranks", "launched", "rank 0: PeerTimeoutError (device barrier) "
           "naming rank 1", elapsed)
    assert status == 1, text
    assert "PeerTimeoutError: iris device_barrier: timed out" in text and "waiting for rank 1" in text, text
    assert session_left(lines) == []


def test_launched_shapes_that_differ_between_processes():
    """Case 5 (launched, multi-controller): jax.distributed.initialize() joins the ranks, whose
    processes disagree on the shard's length (64 and 65 elements). The kernels pair the two psums
    anyway (they count calls); the simulator's call records (iris_core.sim.call_table) differ, and
    the first rank to compare them fails with RankMismatchError naming the psum, both shapes and the
    other rank (the launcher then stops the rest)."""
    status, lines = launch("shapes", 2, FAULT_BARRIER_TIMEOUT=str(AT_ONCE_S))  # processes start apart
    text = output(lines)
    returned = sorted({w[0] for _, line in lines if (w := said(line)) is not None and w[2].startswith("psum returned")})
    elapsed = lines[-1][0] - when_said(lines, 0, f"psum of {N} elements per rank")
    record("5 shapes differ between processes", "launched, jax.distributed",
           f"none: ranks {returned} returned a value (summed over their own shapes)" if returned
           else "RankMismatchError naming the psum, both shapes and the other rank",
           elapsed)
    assert returned == [] and status != 0, text
    assert "RankMismatchError: iris all_reduce(sum)" in text and "rank 1" in text, text
