"""Run by test_launched.py as `python -m iris_core.sim -n W launched_early_exit.py`.

The last rank writes a marker into its own heap and exits right after `iris_jax.init()`.
The others attach slowly (0.3 s per peer heap, as on a loaded machine), so they
are still attaching when it leaves: they must find its heap and then read the marker from
it (a read of a peer's heap, no collective: nothing waits on the rank that left).
"""

import os
import time

import numpy as np

import iris_jax
from iris_core.heap.rendezvous import FileStore

if int(os.environ["IRIS_SIM_RANK"]) != int(os.environ["IRIS_SIM_WORLD_SIZE"]) - 1:
    _get = FileStore.get

    def slow_get(self, key, timeout_s=60.0):
        value = _get(self, key, timeout_s)
        if "/heap/" in key:
            time.sleep(0.3)  # between learning of a peer's heap and mapping it
        return value

    FileStore.get = slow_get


def marker(rt, rank):
    """The last word of `rank`'s heap, as this process maps it."""
    return rt.heap.host_view(rank, rt.heap_size - 8, (1,), np.int64)


def main():
    rt = iris_jax.init()
    (device,) = rt.devices
    rank, last = rt.rank_of(device), rt.world_size - 1
    if rank == last:
        marker(rt, rank)[0] = 1000 + rank
        print(f"rank {rank}: wrote the marker, exiting", flush=True)
        return
    deadline = time.monotonic() + 30
    while int(marker(rt, last)[0]) != 1000 + last:  # the last rank may not have written it yet
        assert time.monotonic() < deadline, f"rank {last}'s marker never arrived"
        time.sleep(0.01)
    print(f"rank {rank}: read rank {last}'s marker OK", flush=True)


if __name__ == "__main__":
    main()
