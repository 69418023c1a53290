"""Passing file descriptors between processes (iris_core.heap.fd_exchange), as the VMM heap
passes its POSIX-fd handles: memfds and pipes, 2-4 processes, timeouts and cleanup."""

import multiprocessing
import os
import socket
import threading
import time
import uuid

import pytest

from iris_core.errors import PeerTimeoutError
from iris_core.heap import fd_exchange
from iris_core.heap.rendezvous import FileStore, store_barrier

TIMEOUT_S = 30.0


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _rank_main(kind: str, rank: int, world_size: int, store_path: str, session: str, results) -> None:
    try:
        store = FileStore(store_path)
        fds_before, threads_before = _open_fds(), threading.active_count()
        _exchange_and_check(kind, rank, world_size, store, session)
        _assert_socket_gone(store, session, rank)
        assert _open_fds() == fds_before, "descriptors left open"
        assert threading.active_count() == threads_before, "a server thread left running"
        results.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        results.put((rank, f"{type(e).__name__}: {e}"))


def _exchange_and_check(kind: str, rank: int, world_size: int, store: FileStore, session: str) -> None:
    """Rank's side: share one object, reach every peer's through the descriptor received, and
    see the peers' writes in its own."""
    peers = [p for p in range(world_size) if p != rank]
    if kind == "memfd":
        mine = os.memfd_create(f"iris-test-{rank}")
        os.ftruncate(mine, 128)  # a name at 0, the peers' marks from 64
        os.pwrite(mine, f"rank {rank}".encode(), 0)
        shared = mine
    else:  # peers write into this rank's pipe through the write end they received
        mine, shared = os.pipe()
    received = fd_exchange.exchange_fds(shared, rank, peers, store, session, TIMEOUT_S)
    assert sorted(received) == peers
    for peer, fd in received.items():
        if kind == "memfd":
            assert os.pread(fd, 16, 0).rstrip(b"\0") == f"rank {peer}".encode()  # the peer's object
            os.pwrite(fd, b"\1", 64 + rank)  # a mark in the peer's memfd
        else:
            os.write(fd, f"{rank}\n".encode())
        os.close(fd)
    store_barrier(store, f"{session}/written", rank, world_size, TIMEOUT_S)
    if kind == "memfd":
        assert os.pread(mine, world_size, 64) == bytes(int(p != rank) for p in range(world_size))
    else:
        os.close(shared)  # every write end is closed now: read to the end
        data = b""
        while chunk := os.read(mine, 4096):
            data += chunk
        assert sorted(int(line) for line in data.split()) == peers
    os.close(mine)


def _assert_socket_gone(store: FileStore, session: str, rank: int) -> None:
    name = store.get(fd_exchange._key(session, rank), 1.0)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe, pytest.raises(ConnectionRefusedError):
        probe.connect(name)


@pytest.mark.parametrize("kind", ["memfd", "pipe"])
@pytest.mark.parametrize("world_size", [2, 4])
def test_processes_exchange_descriptors(tmp_path, kind, world_size):
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    session = f"test-{uuid.uuid4().hex[:8]}"
    procs = [ctx.Process(target=_rank_main, args=(kind, r, world_size, str(tmp_path), session, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        reports = dict(results.get(timeout=120) for _ in procs)
    finally:
        for p in procs:
            p.join(60)  # against a hang only: exiting takes long on a loaded machine
            if p.is_alive():
                p.kill()
    assert reports == {r: "ok" for r in range(world_size)}
    assert [p.exitcode for p in procs] == [0] * world_size


def test_threads_of_one_process_exchange(tmp_path):
    """Ranks as threads: descriptors pass within one process too, all directions at once."""
    store, errors = FileStore(str(tmp_path)), []

    def rank_main(rank):
        try:
            _exchange_and_check("memfd", rank, 3, store, "threads")
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((rank, e))

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for r in range(3):
        _assert_socket_gone(store, "threads", r)


def test_peer_that_never_publishes_times_out(tmp_path):
    store = FileStore(str(tmp_path))
    read_end, write_end = os.pipe()
    fds_before, threads_before = _open_fds(), threading.active_count()
    started = time.monotonic()
    with pytest.raises(PeerTimeoutError, match=r"rank 0: rank 1 did not publish its file-descriptor socket within 0.5 s"):
        fd_exchange.exchange_fds(write_end, 0, [1], store, "absent", timeout_s=0.5)
    assert time.monotonic() - started >= 0.5  # not before its timeout (a monotonic deadline)
    _assert_socket_gone(store, "absent", 0)
    assert _open_fds() == fds_before and threading.active_count() == threads_before
    os.close(read_end)
    os.close(write_end)


def test_peer_that_published_but_does_not_serve_times_out(tmp_path):
    store = FileStore(str(tmp_path))
    store.set(fd_exchange._key("dead", 1), b"\0iris-test-nobody-listens-" + uuid.uuid4().hex.encode())
    read_end, write_end = os.pipe()
    fds_before = _open_fds()
    with pytest.raises(PeerTimeoutError, match=r"rank 1 published its file-descriptor socket but did not serve it"):
        fd_exchange.exchange_fds(write_end, 0, [1], store, "dead", timeout_s=0.5)
    assert _open_fds() == fds_before
    os.close(read_end)
    os.close(write_end)


def test_peer_that_never_takes_ours_times_out(tmp_path):
    """Rank 1 serves rank 0 but waits for an absent rank 2 first and so never fetches rank 0's:
    rank 0 fails naming rank 1, rank 1 naming rank 2."""
    store = FileStore(str(tmp_path))
    fds = [os.memfd_create("a"), os.memfd_create("b")]
    errors = {}

    def rank1():
        try:
            fd_exchange.exchange_fds(fds[1], 1, [2, 0], store, "slow", timeout_s=1.0)
        except PeerTimeoutError as e:
            errors[1] = str(e)

    t = threading.Thread(target=rank1)
    t.start()
    with pytest.raises(PeerTimeoutError, match=r"rank 0: rank\(s\) \[1\] never came for its file descriptor"):
        fd_exchange.exchange_fds(fds[0], 0, [1], store, "slow", timeout_s=1.0)
    t.join(60)  # against a hang only
    assert not t.is_alive() and "rank 1: rank 2 did not publish" in errors[1]
    for fd in fds:
        os.close(fd)
