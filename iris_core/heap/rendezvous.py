"""Key-value rendezvous used to exchange heap handles between processes.

Anything with `set(key, value: bytes)` and `get(key, timeout_s) -> bytes` works;
iris_jax plugs in JAX's distributed client, the simulator a directory of files.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

from iris_core.errors import PeerTimeoutError


class KeyValueStore(Protocol):
    def set(self, key: str, value: bytes) -> None: ...

    def get(self, key: str, timeout_s: float) -> bytes: ...


def store_barrier(store: KeyValueStore, name: str, rank: int, world_size: int, timeout_s: float) -> None:
    """Returns once all `world_size` ranks called it with the same (fresh) `name`.

    Raises:
      PeerTimeoutError: naming the barrier and the first rank that had not arrived `timeout_s`
        after this rank did.
    """
    store.set(f"{name}/{rank}", b"1")
    deadline = time.monotonic() + timeout_s
    for peer in range(world_size):
        try:
            store.get(f"{name}/{peer}", max(deadline - time.monotonic(), 0.0))
        except PeerTimeoutError:
            raise PeerTimeoutError(
                f"host barrier {name!r}: rank {rank} timed out after {timeout_s:g} s waiting for rank {peer} "
                "(it never arrived: it hangs, died, or does not call this barrier)") from None


class FileStore:
    """A KeyValueStore over a directory that every process can see."""

    def __init__(self, path: str):
        self.path = path
        os.makedirs(path, exist_ok=True)

    def _file(self, key: str) -> str:
        return os.path.join(self.path, key.replace("/", "__"))

    def set(self, key: str, value: bytes) -> None:
        tmp = self._file(key) + f".tmp{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(value)
        os.replace(tmp, self._file(key))  # atomic: readers never see half a value

    def get(self, key: str, timeout_s: float = 60.0) -> bytes:
        deadline = time.monotonic() + timeout_s
        delay = 0.001
        while True:
            try:
                with open(self._file(key), "rb") as f:
                    return f.read()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise PeerTimeoutError(
                        f"rendezvous key {key!r} not published within {timeout_s:.0f} s: a peer "
                        "rank did not start or did not initialize its heap"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.05)


class DictStore:
    """In-process KeyValueStore (single-process use and tests)."""

    def __init__(self):
        self._data: dict[str, bytes] = {}

    def set(self, key: str, value: bytes) -> None:
        self._data[key] = value

    def get(self, key: str, timeout_s: float = 0.0) -> bytes:
        try:
            return self._data[key]
        except KeyError:
            raise PeerTimeoutError(f"rendezvous key {key!r} was never published") from None
