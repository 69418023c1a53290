"""The CPU simulator: SimWorld failure handling and recovery, and the script launcher."""

import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.errors import PeerTimeoutError, SimulatedRankError
from iris_core.heap.shared_memory import SHM_DIR
from iris_core.sim import get_world, launch
from tests.core.test_segment_lifetimes import wait_gone

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# -- rank-side functions and kernels ------------------------------------------------


def rank_and_size(state):
    return state.rank, state.world_size


def raise_on(state, bad_rank):
    if state.rank == bad_rank:
        raise ValueError(f"boom from rank {state.rank}")
    return state.rank


def exit_on(state, bad_rank):
    if state.rank == bad_rank:
        os._exit(3)
    return state.rank


@triton.jit
def wait_for_flag_kernel(flag_ptr):
    while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys") == 0:
        pass


@triton.jit
def spin_on_flag_kernel(flag_ptr, spinning_ptr):
    tl.atomic_xchg(spinning_ptr, 1, sem="release", scope="sys")
    while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys") == 0:
        pass


def spin_until_set(state, session, flag_off, spinning_off):
    """This rank spins on its own flag (saying so in its `spinning` word) until it is set."""
    heap = state.heap(session)
    launch(spin_on_flag_kernel, (1,), heap.host_view(state.rank, flag_off, (1,), np.int32),
           heap.host_view(state.rank, spinning_off, (1,), np.int32))
    return state.rank


def zeroed_flags(heap, world_size: int) -> tuple[int, int]:
    """A flag word and a `spinning` word on every heap, zeroed: (their offsets)."""
    flag_off, spinning_off = heap.allocate(4), heap.allocate(4)
    for r in range(world_size):
        heap.host_view(r, flag_off, (1,), np.int32)[:] = 0
        heap.host_view(r, spinning_off, (1,), np.int32)[:] = 0
    return flag_off, spinning_off


def wait_for_flag_or_raise(state, session, flag_off, spinning_off, bad_rank):
    """Every rank but `bad_rank` waits for a flag that only `bad_rank` would set; it raises once
    the others spin (each says so in its `spinning` word)."""
    heap = state.heap(session)
    if state.rank == bad_rank:
        deadline = time.monotonic() + 60  # against a hang only
        while not all(heap.host_view(r, spinning_off, (1,), np.int32)[0] for r in range(state.world_size)
                      if r != bad_rank):
            assert time.monotonic() < deadline, "the other ranks never started spinning"
            time.sleep(0.01)
        raise RuntimeError("failed before setting the flag")
    spin_until_set(state, session, flag_off, spinning_off)


def hang_on(state, session, flag_off, hung_rank):
    """`hung_rank` spins on its own flag, which no one sets; the others return."""
    if state.rank == hung_rank:
        heap = state.heap(session)
        launch(wait_for_flag_kernel, (1,), heap.host_view(state.rank, flag_off, (1,), np.int32))
    return state.rank


def read_heap(state, session, offset, count):
    heap = state.heap(session)
    return [heap.host_view(r, offset, (count,), np.int32).copy() for r in range(state.world_size)]


def attached_sessions(state):
    return sorted(state.heaps)


def default_heap_or_error(state):
    try:
        state.heap()
    except RuntimeError as e:
        return str(e)
    return None


# -- SimWorld -------------------------------------------------------------------------


def test_run_returns_results_by_rank_and_call_runs_one_rank():
    world = get_world(3)
    assert world.run(rank_and_size) == [(0, 3), (1, 3), (2, 3)]
    assert world.call(2, rank_and_size) == (2, 3)
    assert world.call(0, raise_on, 1) == 0


def long_reply(state, n):
    return bytes([state.rank]) * n


def sleep_for(state, seconds):
    time.sleep(seconds)
    return state.rank


@pytest.mark.parametrize("step", ["c", "python"])
def test_a_call_on_one_rank_in_c_and_in_python(step, monkeypatch):
    """SimWorld.call's hand-off (exchange.c: request and reply in one step without the GIL; Python's
    connection where no C compiler works): results of any length, a rank's error, its death, a
    worker that exited between calls (started again, with a warning) and the timeout, alike."""
    from iris_core.sim import world as world_module

    if step == "python":
        monkeypatch.setattr(world_module, "_exchange", lambda: None)
    else:
        assert world_module._exchange() is not None  # (CI has a C compiler)
    world = get_world(2)
    assert world.call(1, long_reply, 3) == b"\x01" * 3
    assert world.call(1, long_reply, 300_000) == b"\x01" * 300_000  # longer than the C step's buffer
    with pytest.raises(SimulatedRankError, match="simulated rank 0 raised ValueError: boom from rank 0"):
        world.call(0, raise_on, 0)
    with pytest.raises(SimulatedRankError, match=r"simulated rank 1 died \(exit code 3\)"):
        world.call(1, exit_on, 1)
    assert world.call(1, rank_and_size) == (1, 2)
    worker = world._workers[1]
    worker.process.kill()
    worker.process.wait()
    with pytest.warns(RuntimeWarning, match=r"simulated rank 1's worker had exited \(code -9\) since its last call"):
        assert world.call(1, rank_and_size) == (1, 2)
    with pytest.raises(PeerTimeoutError, match=r"simulated rank\(s\) \[0\] did not finish within 1 s"):
        world.call(0, sleep_for, 30, timeout_s=1)
    assert world.run(rank_and_size) == [(0, 2), (1, 2)]


def test_an_install_without_exchange_c_warns_once_and_runs(monkeypatch, tmp_path):
    """An install that lacks the C step's source (issue 65: the wheel once did): one CStepWarning
    names the file and the Python step that takes its place, and the calls still run."""
    from iris_core.errors import CStepWarning
    from iris_core.sim import world as world_module

    missing = str(tmp_path / "iris_core" / "sim" / "exchange.c")
    monkeypatch.setattr(world_module, "EXCHANGE_SOURCE", missing)
    world_module._exchange.cache_clear()
    try:
        with pytest.warns(CStepWarning) as caught:
            assert world_module._exchange() is None
            assert world_module._exchange() is None  # (asked again: no second warning)
        assert len(caught) == 1
        assert str(caught[0].message) == (
            f"iris: the simulator's hand-off to its ranks ({missing}) did not build: {missing} not found; "
            "Python's connection (iris_core.sim.world.SimWorld.call) takes its place (slower)")
        assert get_world(2).call(1, long_reply, 300_000) == b"\x01" * 300_000
    finally:
        world_module._exchange.cache_clear()


def test_rank_error_names_the_rank_and_its_traceback_then_world_recovers():
    world = get_world(3)
    with pytest.raises(SimulatedRankError) as info:
        world.run(raise_on, 1)
    message = str(info.value)
    assert "simulated rank 1 raised ValueError: boom from rank 1" in message
    assert "--- rank 1 traceback ---" in message
    assert "Traceback (most recent call last)" in message
    assert "in raise_on" in message and __file__ in message
    assert world.run(rank_and_size) == [(0, 3), (1, 3), (2, 3)]
    with pytest.raises(SimulatedRankError, match="simulated rank 0 raised ValueError"):
        world.call(0, raise_on, 0)
    assert world.run(raise_on, -1) == [0, 1, 2]


def test_rank_error_releases_peers_blocked_on_it(sim_heap):
    world = get_world(3)
    heap = sim_heap(3, 1 << 16)
    flag_off, spinning_off = zeroed_flags(heap, 3)
    # rank 2's error, not PeerTimeoutError: reported at once, not at the timeout
    with pytest.raises(SimulatedRankError, match="simulated rank 2 raised RuntimeError: failed before setting"):
        world.run(wait_for_flag_or_raise, heap.session, flag_off, spinning_off, 2, timeout_s=120)
    assert world.run(rank_and_size) == [(0, 3), (1, 3), (2, 3)]


def test_dead_rank_is_reported_and_world_recovers():
    world = get_world(2)
    with pytest.raises(SimulatedRankError, match=r"simulated rank 1 died \(exit code 3\)"):
        world.run(exit_on, 1)
    assert world.run(rank_and_size) == [(0, 2), (1, 2)]


def test_hung_rank_times_out_and_world_recovers_with_its_heaps(sim_heap):
    world = get_world(3)
    heap = sim_heap(3, 1 << 16)
    flag_off, data_off = heap.allocate(4), heap.allocate(16)
    for r in range(3):
        heap.host_view(r, flag_off, (1,), np.int32)[:] = 0
        heap.host_view(r, data_off, (4,), np.int32)[:] = np.arange(4) + 10 * r
    start = time.monotonic()
    with pytest.raises(PeerTimeoutError) as info:
        world.run(hang_on, heap.session, flag_off, 1, timeout_s=5)
    elapsed = time.monotonic() - start
    assert elapsed >= 5  # not before its timeout (a monotonic deadline)
    assert "simulated rank(s) [1] did not finish within 5 s" in str(info.value)
    # where each rank was: the hung one at its wait's line, polling its flag (not an array: a raw
    # allocation), the others done
    line = wait_for_flag_kernel.fn.__code__.co_firstlineno + 2
    assert re.search(rf"  rank 1: kernel wait_for_flag_kernel at \S*tests/core/test_sim.py:({line}|{line + 1}) "
                     rf"\(wait_for_flag_kernel\); its last read of one word: rank 1's heap at offset {flag_off}: "
                     r"an unnamed allocation \(allocated at offset \d+\), byte 0 \(int32\), value 0, read \d+ times "
                     "in a row", str(info.value)), str(info.value)
    for r in (0, 2):
        assert f"  rank {r}: finished its part of this call" in str(info.value), str(info.value)
    # fresh workers, the heap mapped again: they see what the parent wrote
    views = world.run(read_heap, heap.session, data_off, 4)
    for seen in views:
        for r in range(3):
            np.testing.assert_array_equal(seen[r], np.arange(4) + 10 * r)
    assert world.run(hang_on, heap.session, flag_off, -1, timeout_s=60) == [0, 1, 2]


def test_closing_a_heap_detaches_it_everywhere_and_removes_its_segments():
    world = get_world(2)
    heap = world.create_heaps(1 << 16)
    paths = [os.path.join(SHM_DIR, f"iris-{heap.session}-r{r}") for r in range(2)]
    try:
        assert all(os.path.exists(p) for p in paths)
        assert all(heap.session in sessions for sessions in world.run(attached_sessions))
    finally:
        heap.close()
    assert heap.closed
    assert not any(os.path.exists(p) for p in paths)
    assert not any(heap.session in sessions for sessions in world.run(attached_sessions))
    heap.close()  # idempotent


def test_segments_of_killed_runs_are_removed_by_the_next_run():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its pid names a process that is gone, like a run killed with SIGKILL
    stale = os.path.join(SHM_DIR, f"iris-p{finished.pid}-dead0000-r0")
    live = os.path.join(SHM_DIR, f"iris-p{os.getpid()}-live0000-r0")
    for path in (stale, live):
        open(path, "wb").close()
    try:
        heap = get_world(2).create_heaps(1 << 16)
        heap.close()
        assert not os.path.exists(stale)
        assert os.path.exists(live), "a live process's segment must stay"
        assert heap.session.startswith(f"p{os.getpid()}-")
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.unlink(path)


def mark_then_sleep(state, folder, seconds):
    """A long call that first says it started (a file per rank in `folder`)."""
    open(os.path.join(folder, str(state.rank)), "w").close()
    time.sleep(seconds)


def test_workers_end_with_their_parent_even_in_a_long_call(tmp_path):
    """A parent killed while its ranks are busy (a long kernel) takes its workers with it: no rank
    runs its call to the end for no one."""
    script = textwrap.dedent(f"""
        from iris_core.sim import get_world
        from tests.core.test_sim import mark_then_sleep, sleep_for
        world = get_world(2)
        world.run(sleep_for, 0)  # the workers start
        print(*(w.process.pid for w in world._workers), flush=True)
        world.run(mark_then_sleep, {str(tmp_path)!r}, 120)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(workers) == 2, workers
        while not all((tmp_path / str(rank)).exists() for rank in range(2)):  # both in their long call
            assert parent.poll() is None, "the parent ended first"
            time.sleep(0.02)
    finally:
        parent.kill()
        parent.wait()
    assert not wait_gone(workers, timeout_s=60), "a worker outlived its parent"  # (60 s: no verdict on speed)


def test_rank_state_needs_a_session_name_with_several_heaps():
    world = get_world(2)
    with world.create_heaps(1 << 16), world.create_heaps(1 << 16):
        messages = world.run(default_heap_or_error)
    assert all(m is not None and "heaps attached; name one" in m for m in messages)


# -- the launcher ---------------------------------------------------------------------


def run_launcher(tmp_path, script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(script))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    return subprocess.run([sys.executable, "-m", "iris_core.sim", *args, str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_launcher_runs_every_rank_and_prefixes_output(tmp_path):
    result = run_launcher(tmp_path, """
        import os
        print(f"hello from {os.environ['IRIS_SIM_RANK']} of {os.environ['IRIS_SIM_WORLD_SIZE']}"
              f" session={os.environ['IRIS_SIM_SESSION']} interpret={os.environ['TRITON_INTERPRET']}")
    """, "-n", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    sessions = set()
    for rank in range(3):
        line = next(line for line in lines if line.startswith(f"[rank {rank}] "))
        assert f"hello from {rank} of 3" in line and "interpret=1" in line
        sessions.add(line.split("session=")[1].split()[0])
    assert len(sessions) == 1


FAILING_SCRIPT = """
    import os, sys, time
    from iris_core.heap.rendezvous import FileStore
    from iris_core.heap.shared_memory import SharedMemoryHeap, segment_path
    from iris_core.sim.env import launched_rank

    me = launched_rank()
    heap = SharedMemoryHeap(me.world_size, 1 << 16, [me.rank], me.session, FileStore(me.store_path))
    with open(f"pid{me.rank}.tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(f"pid{me.rank}.tmp", f"pid{me.rank}")
    print("segment", segment_path(me.session, me.rank), "store", me.store_path, flush=True)
    if me.rank == 1:
        while not all(os.path.exists(f"pid{r}") for r in range(me.world_size)):
            time.sleep(0.01)  # every rank is up, its segment made, before the failure
        raise RuntimeError("rank 1 fails on purpose")
    time.sleep(600)
"""


def kill_ranks_left_behind(tmp_path):
    """Should the launcher itself hang, its ranks (own sessions) outlive it: stop them by pid."""
    for path in tmp_path.glob("pid?"):
        try:
            os.kill(int(path.read_text()), 9)
        except (ProcessLookupError, ValueError):
            pass


def test_launcher_stops_every_rank_and_cleans_up_when_one_fails(tmp_path):
    before = set(os.listdir(SHM_DIR))
    try:  # the others sleep 600 s: a launcher that does not stop them meets this bound
        result = run_launcher(tmp_path, FAILING_SCRIPT, "-n", "3", timeout=120)
    except subprocess.TimeoutExpired:
        kill_ranks_left_behind(tmp_path)
        pytest.fail("the launcher did not stop the other ranks after rank 1 failed")
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert "[rank 1] RuntimeError: rank 1 fails on purpose" in result.stdout
    assert "[iris.sim] rank 1 exited with status 1; stopping the others" in result.stderr
    segments = [line.split()[3] for line in result.stdout.splitlines() if " segment " in line]
    stores = {line.split()[5] for line in result.stdout.splitlines() if " segment " in line}
    assert len(segments) == 3 and len(stores) == 1, output
    # the other ranks were stopped ...
    for rank in (0, 2):
        pid = int((tmp_path / f"pid{rank}").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    # ... and nothing of the run is left: segments (rank 0 and 2 never closed theirs), store
    assert not any(os.path.exists(p) for p in segments)
    assert not os.path.exists(stores.pop())
    left = {name for name in set(os.listdir(SHM_DIR)) - before if name.startswith("iris-")}
    session_prefix = os.path.basename(segments[0]).rsplit("-r", 1)[0]
    assert not [name for name in left if name.startswith(session_prefix)]


def test_launcher_timeout_stops_a_hung_run(tmp_path):
    start = time.monotonic()
    result = run_launcher(tmp_path, "import time\ntime.sleep(600)\n", "-n", "2", "--timeout", "3")
    assert result.returncode == 124
    assert "[iris.sim] timeout after 3 s; ranks still running: [0, 1]" in result.stderr
    assert time.monotonic() - start >= 3  # not before its timeout


CROSS_RANK_SCRIPT = """
    import sys
    import numpy as np
    import triton
    import triton.language as tl
    from iris_core.device import Context
    from iris_core.heap.rendezvous import FileStore
    from iris_core.heap.shared_memory import SharedMemoryHeap
    from iris_core.sim import launch
    from iris_core.sim.env import launched_rank

    BLOCK, N = 16, 11

    @triton.jit
    def to_next_rank(context_ptr, x_ptr, flag_ptr, n, W: tl.constexpr, BLOCK: tl.constexpr):
        ctx = Context.initialize(context_ptr, W)
        offs = tl.arange(0, BLOCK)
        ctx.store(x_ptr + offs, ctx.rank * 1000 + offs, (ctx.rank + 1) % W, mask=offs < n)
        ctx.atomic_add(flag_ptr, 1, (ctx.rank + 1) % W, sem="release")
        while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys") == 0:
            pass

    def barrier(store, me, name):
        store.set(f"{name}/{me.rank}", b"1")
        for r in range(me.world_size):
            store.get(f"{name}/{r}", 60)

    me = launched_rank()
    store = FileStore(me.store_path)
    with SharedMemoryHeap(me.world_size, 1 << 16, [me.rank], me.session, store) as heap:
        x_off, flag_off = heap.allocate(BLOCK * 4), heap.allocate(4)  # same order: same offsets everywhere
        x = heap.host_view(me.rank, x_off, (BLOCK,), np.int32)
        flag = heap.host_view(me.rank, flag_off, (1,), np.int32)
        x[:] = -1
        flag[:] = 0
        barrier(store, me, "poisoned")  # no peer writes into my heap before I poisoned it
        launch(to_next_rank, (1,), heap.context(me.rank), x, flag, N, W=me.world_size, BLOCK=BLOCK)
        prev = (me.rank - 1) % me.world_size
        expected = np.where(np.arange(BLOCK) < N, prev * 1000 + np.arange(BLOCK), -1)
        ok = np.array_equal(x, expected) and flag[0] == 1
        print(f"received {x.tolist()} from rank {prev}: {'ok' if ok else 'WRONG'}")
        barrier(store, me, "done")
    sys.exit(0 if ok else 1)
"""


@pytest.mark.parametrize("world_size", [2, 3])
def test_launched_ranks_share_heaps_and_store_across_ranks(tmp_path, world_size):
    result = run_launcher(tmp_path, CROSS_RANK_SCRIPT, "-n", str(world_size))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    for rank in range(world_size):
        prev = (rank - 1) % world_size
        values = [prev * 1000 + i if i < 11 else -1 for i in range(16)]
        assert f"[rank {rank}] received {values} from rank {prev}: ok" in result.stdout, output


# -- the interpreter ---------------------------------------------------------------------
@triton.jit
def _add_one(x):
    return x + 1


@triton.jit
def _add_ones(out_ptr, N: tl.constexpr):
    x = tl.zeros((16,), tl.int32)
    for _ in tl.static_range(N):
        x = _add_one(x)
    tl.store(out_ptr + tl.arange(0, 16), x)


def count_language_patches(state, n):
    """Runs _add_ones (n helper calls) here; returns (its output, how often the interpreter
    patched triton.language's builtins, whether tensor.__index__ is left patched)."""
    from triton.runtime import interpreter as ti

    from iris_core.sim.interpreter import launch

    calls = []
    original = ti._patch_builtin
    ti._patch_builtin = lambda *a: (calls.append(1), original(*a))[1]
    index_before = getattr(tl.core.tensor, "__index__", None)
    try:
        out = np.zeros(16, np.int32)
        launch(_add_ones, (1,), out, N=n)
    finally:
        ti._patch_builtin = original
    return out, len(calls), getattr(tl.core.tensor, "__index__", None) is not index_before


def test_helper_calls_do_not_patch_the_language_again():
    """Triton's interpreter re-patches the language at every @triton.jit helper call (~6 ms
    each); inside a launch iris patches each language module once, and a worker, which runs
    only kernels, keeps the patches for its later launches (keep_language_patched)."""
    (few, few_patches, _), = get_world(1).run(count_language_patches, 2)
    (many, many_patches, leaked), = get_world(1).run(count_language_patches, 20)
    np.testing.assert_array_equal(few, np.full(16, 2))
    np.testing.assert_array_equal(many, np.full(16, 20))
    # at most once per language module (3-4 builtin groups each; none if this worker launched
    # before); without the skip, each of the 20 helper calls patched again (90 groups)
    assert few_patches <= 12
    assert many_patches == 0
    assert not leaked  # (patched before this launch, and still)



def test_pointer_arguments_have_tritons_types():
    """run_kernel builds pointer arguments itself (Triton's conversion imports torch): the
    types must be the ones Triton gives them."""
    from triton.runtime import interpreter as ti
    from triton.runtime.jit import mangle_type

    from iris_core.sim.interpreter import _POINTER_TYPES, Pointer, _as_tensor

    for dtype in _POINTER_TYPES:
        pointer = Pointer(0x1000, dtype)
        assert _POINTER_TYPES[dtype] == mangle_type(pointer)
        converted = _as_tensor(pointer, ti)
        assert converted.type == ti._implicit_cvt(pointer).type and int(converted.handle.data[0]) == 0x1000


def test_a_timeout_says_where_the_ranks_busy_in_calls_of_their_own_are(sim_heap):
    """Rank 0's call times out while rank 1 spins in a call of its own (in one process each rank's
    kernel is its own call): the error says where rank 1 is too, who waits on whom; rank 1's
    worker is left running, and its call returns once its flag is set."""
    world = get_world(2)
    heap = sim_heap(2, 1 << 16)
    flag_off, spinning_off = zeroed_flags(heap, 2)
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(world.call, 1, spin_until_set, heap.session, flag_off, spinning_off, timeout_s=60)
        deadline = time.monotonic() + 30  # against a hang only
        while heap.host_view(1, spinning_off, (1,), np.int32)[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(PeerTimeoutError) as info:
            world.call(0, sleep_for, 30, timeout_s=1)
        heap.host_view(1, flag_off, (1,), np.int32)[0] = 1  # rank 1 goes on
        assert other.result(timeout=60) == 1
    assert re.search(r"  rank 1 \(in a call of its own\): kernel spin_on_flag_kernel at \S*tests/core/test_sim.py:\d+ "
                     rf"\(spin_on_flag_kernel\); its last read of one word: rank 1's heap at offset {flag_off}: ",
                     str(info.value)), str(info.value)
    assert "  rank 0: in no kernel" in str(info.value), str(info.value)  # (rank 0 sleeps in a host step)
