"""Lifetimes of the simulator's shared-memory files: a heap stays attachable until every peer
mapped it, and nothing of a run is left once it ends, also when a rank or the launcher is
killed with SIGKILL."""

import glob
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

from iris_core.heap.rendezvous import FileStore
from iris_core.heap.shared_memory import (
    SHM_DIR,
    SharedMemoryHeap,
    new_session,
    remove_stale_segments,
    segment_path,
)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAP = 1 << 16


class SlowAttachStore(FileStore):
    """A FileStore whose reader waits `delay_s` after learning of a peer's heap, before mapping it."""

    def __init__(self, path, delay_s):
        super().__init__(path)
        self.delay_s = delay_s

    def get(self, key, timeout_s=60.0):
        value = super().get(key, timeout_s)
        if "/heap/" in key:
            time.sleep(self.delay_s)
        return value


def session_files(session):
    return glob.glob(os.path.join(SHM_DIR, f"iris-{session}-*"))


# -- in one process: two owners, one of them slow to attach ---------------------------


def test_an_owner_that_closes_at_once_keeps_its_segment_until_the_peer_attached(tmp_path):
    session = new_session("test")
    slow_heap, errors = [], []

    def slow_rank():
        try:
            heap = SharedMemoryHeap(2, HEAP, [1], session, SlowAttachStore(tmp_path, 0.5), timeout_s=60)
            slow_heap.append(heap)
        except BaseException as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    thread = threading.Thread(target=slow_rank)
    thread.start()
    fast = SharedMemoryHeap(2, HEAP, [0], session, FileStore(tmp_path), timeout_s=60)  # against a hang only
    fast.host_view(0, 0, (4,), np.int64)[:] = [7, 8, 9, 10]
    fast.close()  # rank 1 is still attaching: this waits for it
    thread.join()
    assert not errors, errors
    (slow,) = slow_heap
    try:
        np.testing.assert_array_equal(slow.host_view(0, 0, (4,), np.int64), [7, 8, 9, 10])
        assert not os.path.exists(segment_path(session, 0)), "rank 0 removes its segment once rank 1 attached"
    finally:
        slow.close()
    assert session_files(session) == []


def test_close_warns_and_removes_the_segment_when_a_peer_never_attaches(tmp_path):
    session = new_session("test")
    store = FileStore(tmp_path)
    peer = segment_path(session, 1)
    with open(peer, "wb") as f:  # rank 1 published its heap, then hung before mapping rank 0's
        f.truncate(HEAP)
    try:
        store.set(f"iris/{session}/0/heap/1", peer.encode())
        heap = SharedMemoryHeap(2, HEAP, [0], session, store, timeout_s=0.3)
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="rank 1 did not map this process's heap within 0.3 s"):
            heap.close()
        assert time.monotonic() - start >= 0.3  # not before its timeout (a monotonic deadline)
        assert not os.path.exists(segment_path(session, 0))
    finally:
        os.unlink(peer)


# -- launched runs whose ranks or launcher are killed ---------------------------------

HOLDING_SCRIPT = """
    import os, time
    from iris_core.heap.rendezvous import FileStore
    from iris_core.heap.shared_memory import SharedMemoryHeap
    from iris_core.sim.env import launched_rank

    me = launched_rank()
    heap = SharedMemoryHeap(me.world_size, 1 << 16, [me.rank], me.session, FileStore(me.store_path))
    with open(f"pid{me.rank}.tmp", "w") as f:
        f.write(f"{os.getpid()} {me.session} {me.store_path}")
    os.replace(f"pid{me.rank}.tmp", f"pid{me.rank}")
    time.sleep(600)
"""


def start_holding_run(tmp_path, world_size):
    """Launches HOLDING_SCRIPT; returns (launcher, rank pids, session, store) once every rank
    mapped every heap."""
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(HOLDING_SCRIPT))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "iris_core.sim", "-n", str(world_size), str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    pid_files = [tmp_path / f"pid{rank}" for rank in range(world_size)]
    deadline = time.monotonic() + 60
    while not all(p.exists() for p in pid_files):
        assert launcher.poll() is None, launcher.stderr.read()
        assert time.monotonic() < deadline, "the ranks did not come up"
        time.sleep(0.02)
    records = [p.read_text().split() for p in pid_files]
    return launcher, [int(r[0]) for r in records], records[0][1], records[0][2]


def gone(pid):
    """Whether `pid` exited (a zombie nobody reaped yet counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids, timeout_s=20):
    deadline = time.monotonic() + timeout_s
    while not all(gone(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if not gone(pid)]


def kill_all(launcher, pids):
    for pid in [launcher.pid, *pids]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    launcher.wait()


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads process states from /proc")
def test_a_rank_killed_mid_run_stops_the_run_and_leaves_no_segment(tmp_path):
    launcher, pids, session, store = start_holding_run(tmp_path, 3)
    try:
        assert len(session_files(session)) == 4  # three heaps and rank 0's allocation table
        os.kill(pids[1], signal.SIGKILL)
        assert launcher.wait(timeout=30) != 0
        assert "[iris.sim] rank 1 exited with status -9; stopping the others" in launcher.stderr.read()
        assert wait_gone(pids) == []
        assert session_files(session) == []
        assert not os.path.exists(store)
    finally:
        kill_all(launcher, pids)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ranks die with the launcher on Linux")
def test_a_killed_launchers_ranks_die_and_its_segments_are_stale(tmp_path):
    launcher, pids, session, _ = start_holding_run(tmp_path, 2)
    try:
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(timeout=30)
        assert wait_gone(pids) == [], "the ranks outlived their launcher"
        left = sorted(session_files(session))
        assert len(left) == 3  # nobody was left to remove them ...
        assert sorted(p for p in remove_stale_segments() if session in p) == left  # ... the next run does
        assert session_files(session) == []
    finally:
        kill_all(launcher, pids)


def test_staging_areas_of_dead_processes_are_stale():
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its pid names a process that is gone, like one killed with SIGKILL
    stale = os.path.join(SHM_DIR, f"iris-staging-{finished.pid}-dead0000")
    live = os.path.join(SHM_DIR, f"iris-staging-{os.getpid()}-live0000")
    for path in (stale, live):
        open(path, "wb").close()
    try:
        removed = remove_stale_segments()
        assert stale in removed and not os.path.exists(stale)
        assert live not in removed and os.path.exists(live), "a live process's staging area must stay"
    finally:
        for path in (stale, live):
            if os.path.exists(path):
                os.unlink(path)
