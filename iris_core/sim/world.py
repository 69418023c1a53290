"""Simulated ranks: one worker process per rank, all mapping the same shared-memory heaps.

The Triton interpreter patches global state and runs a launch's programs one after the
other, so concurrent ranks need processes. A `SimWorld` keeps its workers alive across
calls (tests reuse them); `run` executes a function on every rank at once and returns
the results, `call` runs one on a single rank (the JAX CPU lowering feeds each
device's kernels to its rank this way). A rank that raises, dies or outlives the timeout
fails the call with that rank's traceback or exit code. After a failed `run` every worker
is restarted (its peers may be blocked on the failed rank); after a failed `call` only
that rank's worker, if it died or hung: the other ranks' calls go on and end by
themselves (an iris collective waiting for the rank times out naming it).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import functools
import multiprocessing.connection
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Listener

from iris_core import c_build
from iris_core.errors import IrisError, PeerTimeoutError, SimulatedRankError
from iris_core.heap.shared_memory import SharedMemoryHeap, new_session, remove_stale_segments
from iris_core.sim import pickling, positions

DEFAULT_TIMEOUT_S = float(os.environ.get("IRIS_SIM_TIMEOUT", "120"))


@dataclass
class RankState:
    """What a function running on a simulated rank sees (its first argument)."""

    rank: int
    world_size: int
    heaps: dict = field(default_factory=dict)  # session -> SharedMemoryHeap (attached)
    cache: dict = field(default_factory=dict)  # free for callers: kernels, staging maps, ...

    def heap(self, session: str | None = None):
        if session is None:
            if len(self.heaps) != 1:
                raise RuntimeError(f"rank {self.rank} has {len(self.heaps)} heaps attached; name one")
            return next(iter(self.heaps.values()))
        return self.heaps[session]


def _serve(rank: int, world_size: int, conn) -> None:
    """A worker's loop: run each function sent, reply with its result or traceback."""
    state = RankState(rank, world_size)
    while True:
        try:
            message = conn.recv_bytes()
        except (EOFError, OSError):
            return
        try:
            fn, args = pickling.loads(message)
            reply = pickling.dumps(("ok", fn(state, *args)))
        except BaseException as e:  # report everything, including KeyboardInterrupt
            reply = pickling.dumps(("err", *error_reply(e)))
        conn.send_bytes(reply)


def error_reply(error: BaseException) -> tuple:
    """What a worker says of an error it raised: (type and message, traceback, iris error type or None)."""
    return (f"{type(error).__name__}: {error}", "".join(traceback.format_exception(error)),
            type(error) if isinstance(error, IrisError) else None)


def rank_failure(rank: int, reply: tuple) -> SimulatedRankError:
    """The error a call on `rank` raises for the worker's error_reply (of the rank's own iris error type too)."""
    message, trace, kind = reply
    return _rank_error(kind)(f"simulated rank {rank} raised {message}\n--- rank {rank} traceback ---\n{trace}")


class _Worker:
    """A rank process started as `python -m iris_core.sim.worker` (a fresh interpreter:
    the parent's __main__ is not re-imported, and interpreter mode is on from the start)."""

    def __init__(self, rank: int, world_size: int):
        authkey = os.urandom(16)
        address = os.path.join(tempfile.gettempdir(), f"iris-w{os.getpid()}-{uuid.uuid4().hex[:8]}")
        listener = Listener(address, family="AF_UNIX", authkey=authkey)
        env = dict(os.environ, TRITON_INTERPRET="1", JAX_PLATFORMS="cpu", IRIS_SIM_WORKER_AUTH=authkey.hex(),
                   IRIS_SIM_SYS_PATH=os.pathsep.join(sys.path))  # so functions pickled by reference import
        env.pop("IRIS_SIM_RANK", None)
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "iris_core.sim.worker", address, str(rank), str(world_size)],
                env=env, start_new_session=True)
            listener._listener._socket.settimeout(60)
            self.conn = listener.accept()
        finally:
            listener.close()
        self.position_path = address + ".position"  # where it answers positions.ask
        self.lock = threading.Lock()
        self.stopped: str | None = None  # why SimWorld killed this worker (None: it was not)

    def kill(self, reason: str = "the simulator's workers were restarted"):
        if self.stopped is None:
            self.stopped = reason
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        self.conn.close()


class SimWorld:
    """`world_size` simulated ranks, each a worker process running Triton's interpreter."""

    def __init__(self, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.timeout_s = timeout_s
        self._workers: list[_Worker | None] | None = None  # None: not started (or discarded) yet
        self._attached: dict[str, tuple] = {}  # session -> (world_size, heap_size)
        self._lock = threading.RLock()  # a worker that fails while starting is discarded under it
        self.id = uuid.uuid4().hex[:8]

    # -- lifetime -------------------------------------------------------------
    def _ensure_workers(self) -> list[_Worker]:
        """The workers, started where missing: at first use, after a restart, and in place
        of one that failed or exited between calls (the heaps are mapped again)."""
        with self._lock:
            if self._workers is None:
                self._workers = [None] * self.world_size
            for rank, w in enumerate(self._workers):
                if w is not None and w.process.poll() is not None and not w.lock.locked():
                    # no call was running on it (a running call reports the exit itself)
                    warnings.warn(f"simulated rank {rank}'s worker had exited (code {w.process.returncode}) "
                                  "since its last call; starting a new one", RuntimeWarning, stacklevel=3)
                    w.kill("it had exited")
                    w = None
                if w is None:
                    w = self._workers[rank] = _Worker(rank, self.world_size)
                    for session, (world_size, heap_size) in self._attached.items():
                        w.conn.send_bytes(pickling.dumps((_attach, (session, world_size, heap_size))))
                        self._collect({rank: w}, [rank], None, "attaching its heaps")
            return list(self._workers)

    def restart(self, reason: str = "the simulator's workers were restarted") -> None:
        """Kills every worker (e.g. after a hang); they restart on the next call. Calls in
        flight fail with SimulatedRankError saying `reason`."""
        with self._lock:
            workers, self._workers = self._workers, None
        for w in workers or ():
            if w is not None:
                w.kill(reason)

    def _discard(self, rank: int, worker: _Worker, reason: str) -> None:
        """Kills one rank's worker (if it is still that rank's); a new one starts on its next call."""
        with self._lock:
            if self._workers is not None and self._workers[rank] is worker:
                self._workers[rank] = None
        worker.kill(reason)

    def close(self) -> None:
        self.restart()
        self._attached.clear()

    # -- heaps ----------------------------------------------------------------
    def attach_heaps(self, session: str, world_size: int, heap_size: int) -> None:
        """Maps the shared-memory heaps of `session` in every worker (again after restarts)."""
        self._attached[session] = (world_size, heap_size)
        if self._workers is not None:
            self.run(_attach, session, world_size, heap_size)

    def detach_heaps(self, session: str) -> None:
        if self._attached.pop(session, None) is not None and self._workers is not None:
            self.run(_detach, session)

    def create_heaps(self, heap_size: int, **options) -> SharedMemoryHeap:
        """Creates one heap per rank, owned by this process and mapped by every worker
        (`options`: SharedMemoryHeap's, such as mapped_size).

        Close the returned heap (or use it as a context manager) to unmap and remove it.
        """
        remove_stale_segments()
        session = new_session(self.id)
        heap = _WorldHeap(self, self.world_size, heap_size, range(self.world_size), session, **options)
        self.attach_heaps(session, self.world_size, heap_size)
        return heap

    # -- calls ----------------------------------------------------------------
    def run(self, fn: Callable, *args, timeout_s: float | None = None) -> list:
        """Runs `fn(state, *args)` on every rank concurrently; returns the results by rank."""
        return self._run(self._ensure_workers(), fn, args, timeout_s)

    def _run(self, workers: list[_Worker], fn: Callable, args: tuple, timeout_s: float | None) -> list:
        payload = pickling.dumps((fn, args))
        for w in workers:
            w.lock.acquire()
        try:
            for rank, w in enumerate(workers):
                try:
                    w.conn.send_bytes(payload)
                except OSError:  # it died or was stopped since _ensure_workers looked
                    self.restart(f"rank {rank} was gone before running {fn.__name__}")
                    raise SimulatedRankError(f"simulated rank {rank}'s worker was gone before running "
                                             f"{fn.__name__}; the workers were restarted") from None
            return self._collect(workers, list(range(self.world_size)), timeout_s, fn.__name__)
        finally:
            for w in workers:
                w.lock.release()

    def call(self, rank: int, fn: Callable, *args, timeout_s: float | None = None, what: str | None = None):
        """Runs `fn(state, *args)` on one rank and waits for its result; `what` names the call
        in errors (default: fn's name)."""
        what = what or fn.__name__
        payload = pickling.dumps((fn, args))
        workers = self._workers
        w = workers[rank] if workers is not None else None
        if w is not None and _exchange() is not None and len(payload) < 1 << 31:
            with w.lock:
                answered, result = self._exchange(w, rank, payload, timeout_s, what)
            if answered:
                return result
        w = self._ensure_workers()[rank]
        with w.lock:
            try:
                w.conn.send_bytes(payload)
            except OSError:  # it died, or was stopped, since _ensure_workers looked
                stopped = w.stopped
                self._discard(rank, w, f"it was gone before running {what}")
                raise SimulatedRankError(
                    f"simulated rank {rank} was stopped before running {what}: {stopped}" if stopped else
                    f"simulated rank {rank} died (exit code {w.process.returncode}) before running {what}; "
                    "a new worker starts on its next call") from None
            return self._collect({rank: w}, [rank], timeout_s, what)[0]

    def _exchange(self, w: _Worker, rank: int, payload: bytes, timeout_s: float | None, what: str) -> tuple:
        """One rank's call in one step without the GIL (exchange.c): (True, its result), or (False,
        None) where the worker had exited since its last call or was stopped since the caller looked
        (nothing was sent: the caller takes Python's path). Raises as _collect does for a reply that fails."""
        try:
            fd = w.conn.fileno()
        except OSError:  # its connection is closed
            return False, None
        limit = self.timeout_s if timeout_s is None else timeout_s
        buffer = _REPLY.buffer
        length = ctypes.c_uint64()
        status = _exchange().iris_sim_exchange(fd, payload, len(payload), buffer, len(buffer),
                                               int(min(limit * 1000, 2**31 - 1)), ctypes.byref(length))
        if status == _SPOKE_FIRST:
            return False, None
        workers, ranks = {rank: w}, [rank]
        if status == _TIMED_OUT:
            self._timed_out(workers, ranks, [rank], limit, what)

        def read() -> bytes:
            if status != _DONE:  # the worker's end closed, or a system call failed
                raise EOFError
            n = length.value
            head = buffer.raw[:min(n, len(buffer))]
            return head if n <= len(buffer) else head + _read_exactly(fd, n - len(buffer))

        return True, self._answer(workers, rank, ranks, set(), read, what)

    def _collect(self, workers, ranks: list[int], timeout_s: float | None, what: str) -> list:
        """The replies of `ranks` (workers: by rank); raises for the first that fails."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        results: dict[int, object] = {}
        pending = set(ranks)
        while pending:
            ready = multiprocessing.connection.wait([workers[r].conn for r in pending],
                                       timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                self._timed_out(workers, ranks, sorted(pending), limit, what)
            for conn in ready:
                rank = next(r for r in pending if workers[r].conn is conn)
                pending.discard(rank)
                results[rank] = self._answer(workers, rank, ranks, pending, conn.recv_bytes, what)
        return [results[r] for r in ranks]

    def _timed_out(self, workers, ranks: list[int], missing: list[int], limit: float, what: str):
        everyone = self._workers or []
        busy = [r for r, w in enumerate(everyone) if r not in ranks and w.lock.locked()]  # in calls of their own
        asked = {r: workers[r] for r in missing} | {r: everyone[r] for r in busy}
        where = positions.ask({r: w.process.pid for r, w in asked.items()}, lambda r: asked[r].position_path)
        lines = [f"  rank {r}: {where[r]}" if r in missing else f"  rank {r}: finished its part of this call"
                 for r in ranks]
        lines += [f"  rank {r} (in a call of its own): {where[r]}" for r in busy]
        self._fail(workers, missing[0], ranks, f"rank(s) {missing} did not finish {what}")
        for r in missing:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(workers[r].position_path)
        raise PeerTimeoutError(
            f"simulated rank(s) {missing} did not finish within {limit:.0f} s ({what}: a wait on a "
            "peer that never arrives?); where each rank was:\n" + "\n".join(lines) + "\n"
            f"{'The workers were' if len(ranks) > 1 else 'Its worker was'} restarted. Raise the limit with "
            "IRIS_SIM_TIMEOUT or the timeout argument."
        )

    def _answer(self, workers, rank: int, ranks: list[int], pending: set, read: Callable[[], bytes], what: str):
        """Rank's reply (`read` reads it): its result, or the error it names (`pending`: the ranks
        still running, restarted when this one raised)."""
        try:
            reply = pickling.loads(read())
        except (EOFError, OSError):
            w = workers[rank]
            try:  # the connection closes before the exit can be reaped: poll() may say None
                code = w.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                code = None
            if w.stopped is not None:  # killed on purpose, by another call's failure or a restart
                raise SimulatedRankError(
                    f"simulated rank {rank} was stopped while running {what}: {w.stopped}") from None
            self._fail(workers, rank, ranks, f"rank {rank} died while running {what}")
            raise SimulatedRankError(
                f"simulated rank {rank} died (exit code {code}) while running {what}; a new worker "
                "starts on its next call") from None
        if reply[0] == "err":
            if pending:  # peers may be blocked waiting for this rank: restart everything
                self.restart(f"rank {rank} raised while running {what}")
            raise rank_failure(rank, (*reply[1:3], reply[3] if len(reply) > 3 else None))
        return reply[1]

    def _fail(self, workers, rank: int, ranks: list[int], reason: str) -> None:
        """After a rank died or hung: a call on several ranks restarts every worker (its peers
        may be blocked on that rank); a call on one rank replaces only that rank's worker."""
        if len(ranks) > 1:
            self.restart(reason)
        else:
            self._discard(rank, workers[rank], reason)


_DONE, _SPOKE_FIRST, _TIMED_OUT = 0, 1, 2  # exchange.c's answers (and CLOSED 3, FAILED 4)


EXCHANGE_SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "exchange.c")


@functools.cache
def _exchange():
    """exchange.c, built on first use (None where it cannot be built: Python's calls take its place)."""
    lib = c_build.build(EXCHANGE_SOURCE, what="the simulator's hand-off to its ranks",
                        instead="Python's connection (iris_core.sim.world.SimWorld.call)")
    if lib is not None:
        lib.iris_sim_exchange.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p,
                                          ctypes.c_uint32, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
    return lib


class _ReplyBuffer(threading.local):
    """Each calling thread's buffer for replies (a longer one's rest is read after it)."""

    def __init__(self):
        self.buffer = ctypes.create_string_buffer(1 << 16)


_REPLY = _ReplyBuffer()


def _read_exactly(fd: int, n: int) -> bytes:
    parts = []
    while n:
        part = os.read(fd, n)
        if not part:
            raise EOFError
        parts.append(part)
        n -= len(part)
    return b"".join(parts)


def _rank_error(kind: type | None) -> type:
    """SimulatedRankError, also of the rank's own iris error type (e.g. NotOnHeapError), so
    callers can catch either."""
    if kind is None or issubclass(kind, SimulatedRankError) or issubclass(SimulatedRankError, kind):
        return SimulatedRankError  # (a plain IrisError: SimulatedRankError is one)
    if kind not in _RANK_ERRORS:
        _RANK_ERRORS[kind] = type(f"Simulated{kind.__name__}", (kind, SimulatedRankError), {})
    return _RANK_ERRORS[kind]


_RANK_ERRORS: dict = {}


def _attach(state: RankState, session: str, world_size: int, heap_size: int) -> None:
    if session not in state.heaps:
        state.heaps[session] = SharedMemoryHeap(world_size, heap_size, (), session)


def _detach(state: RankState, session: str) -> None:
    heap = state.heaps.pop(session, None)
    if heap is not None:
        heap.close()


class _WorldHeap(SharedMemoryHeap):
    """A SharedMemoryHeap whose workers detach when it closes."""

    def __init__(self, world: SimWorld, *args, **options):
        self._world = world
        super().__init__(*args, **options)

    def _release(self) -> None:
        try:
            self._world.detach_heaps(self.session)
        except Exception:  # workers already gone: nothing left to detach
            pass
        super()._release()


_WORLDS: dict[int, SimWorld] = {}
_WORLDS_LOCK = threading.Lock()


def get_world(world_size: int) -> SimWorld:
    """A process-wide SimWorld of `world_size` ranks, created on first use and reused."""
    with _WORLDS_LOCK:
        if world_size not in _WORLDS:
            _WORLDS[world_size] = SimWorld(world_size)
        return _WORLDS[world_size]


@atexit.register
def _close_worlds() -> None:
    for world in _WORLDS.values():
        world.close()
