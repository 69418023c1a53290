"""Passes a file descriptor to the other processes of one host (SCM_RIGHTS over a Unix socket).

A descriptor is a number that means something only in its own process: the kernel must copy
it into the receiver (ancillary data on a Unix domain socket), so it cannot go through the
key-value store. Each process serves its descriptor on a socket in Linux's abstract namespace
(no file to clean up; gone when closed) and publishes the socket's name in the store; each
peer reads the name, connects, says which rank it is, and receives a duplicate of the
descriptor. The name carries a random part: runs of the same session names on one host (e.g.
several worlds sharing a GPU) never meet.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Sequence

from iris_core.errors import IrisError, PeerTimeoutError
from iris_core.heap.rendezvous import KeyValueStore

_RANK = struct.Struct("<i")


def exchange_fds(fd: int, rank: int, peers: Sequence[int], store: KeyValueStore, session: str,
                 timeout_s: float) -> dict[int, int]:
    """Gives `fd` to every peer and returns each peer's descriptor as received here.

    Every rank in `peers` must call this with `rank` among its own peers. The returned
    descriptors belong to the caller (close them); `fd` stays open.

    Raises:
      PeerTimeoutError: a peer did not publish its socket, serve its descriptor, or take ours
        within `timeout_s` (it names the peer).
    """
    deadline = time.monotonic() + timeout_s
    server = _Server(fd, rank, set(peers), session, deadline)
    received: dict[int, int] = {}
    try:
        store.set(_key(session, rank), server.name)
        for peer in peers:
            received[peer] = _receive(peer, rank, store, session, deadline, timeout_s)
        server.wait()
    except BaseException:
        for got in received.values():
            os.close(got)
        raise
    finally:
        server.close()
    return received


def _key(session: str, rank: int) -> str:
    return f"iris/{session}/fd-socket/{rank}"


class _Server:
    """Serves `fd` on an abstract Unix socket, in a thread, once to each of `peers`."""

    def __init__(self, fd: int, rank: int, peers: set[int], session: str, deadline: float):
        self.fd, self.rank, self.deadline = fd, rank, deadline
        self.waiting = set(peers)
        self.error: BaseException | None = None
        self.name = f"\0iris-{session[:40]}-{rank}-{secrets.token_hex(8)}".encode()
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.socket.bind(self.name)
        self.socket.listen(max(len(peers), 1))
        self.thread = threading.Thread(target=self._serve, name=f"iris-fd-server-{rank}", daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        try:
            while self.waiting:
                self.socket.settimeout(max(self.deadline - time.monotonic(), 0.001))
                try:
                    conn, _ = self.socket.accept()
                except OSError:  # past the deadline, or closed by close()
                    return
                with conn:
                    try:
                        self._serve_one(conn)
                    except OSError:  # a caller that went away or stalled: the next one
                        continue
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            self.error = e

    def _serve_one(self, conn: socket.socket) -> None:
        conn.settimeout(max(self.deadline - time.monotonic(), 0.001))
        if not _same_user(conn):
            return
        peer, = _RANK.unpack(_read_exactly(conn, _RANK.size))
        if peer in self.waiting:  # a stray or repeated caller gets nothing
            socket.send_fds(conn, [_RANK.pack(self.rank)], [self.fd])
            self.waiting.discard(peer)

    def wait(self) -> None:
        """Returns once every peer took the descriptor; else raises naming who did not."""
        self.thread.join(max(self.deadline - time.monotonic(), 0.0))
        if self.error is not None:
            raise IrisError(f"rank {self.rank}: serving its file descriptor failed: {self.error}") from self.error
        if self.waiting:
            raise PeerTimeoutError(
                f"rank {self.rank}: rank(s) {sorted(self.waiting)} never came for its file descriptor "
                "(they hang, died, or run on another host: descriptors pass only between processes of one host)")

    def close(self) -> None:
        try:  # wakes a thread still blocked in accept()
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.socket.close()
        self.thread.join(1.0)


def _receive(peer: int, rank: int, store: KeyValueStore, session: str, deadline: float, timeout_s: float) -> int:
    """Connects to peer's socket (retrying until the deadline) and returns its descriptor."""
    try:
        name = store.get(_key(session, peer), max(deadline - time.monotonic(), 0.0))
    except PeerTimeoutError:
        raise PeerTimeoutError(
            f"rank {rank}: rank {peer} did not publish its file-descriptor socket within {timeout_s:g} s "
            "(it hangs, died, or never created its heap)") from None
    while True:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                conn.connect(name)
                conn.sendall(_RANK.pack(rank))
                message, fds, _, _ = socket.recv_fds(conn, _RANK.size, 1)
            except (ConnectionError, FileNotFoundError):  # not listening (yet), or it dropped us
                message, fds = b"", []
            except TimeoutError:
                break
            if fds and message == _RANK.pack(peer):
                return fds[0]
            for fd in fds:
                os.close(fd)
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)
    raise PeerTimeoutError(
        f"rank {rank}: rank {peer} published its file-descriptor socket but did not serve it within "
        f"{timeout_s:g} s (it died or runs on another host: descriptors pass only between processes of one host)")


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("the caller closed the connection before saying its rank")
        data += chunk
    return data


def _same_user(conn: socket.socket) -> bool:
    """Whether the caller runs as this process's user (anyone on the host can reach an abstract socket)."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return uid == os.getuid()
