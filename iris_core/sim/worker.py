"""Entry point of a simulated rank's worker process (started by SimWorld)."""

import os
import sys
import threading
import time
from multiprocessing.connection import Client

from iris_core.sim import positions
from iris_core.sim.interpreter import enable_interpreter, keep_language_patched
from iris_core.sim.world import _serve  # (python -m imported iris_core.sim, and with it world, already)


def _exit_with(parent: int) -> None:
    """Ends this process once `parent` is gone: a worker in a long kernel would otherwise run it to
    its end for no one (minutes of CPU at 8 ranks and 4 MiB under the race detector) before it
    found its connection closed."""
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def main() -> None:
    threading.Thread(target=_exit_with, args=(os.getppid(),), daemon=True, name="iris-parent-watch").start()
    enable_interpreter()  # before any kernel is defined in this process
    keep_language_patched()  # this process runs only kernels and the simulator's own steps
    # the parent's import path (pytest's rootdirs, sys.path edits): modules whose functions
    # arrive pickled by reference must import here too
    sys.path.extend(p for p in os.environ.get("IRIS_SIM_SYS_PATH", "").split(os.pathsep) if p and p not in sys.path)
    address, rank, world_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    positions.install(address + ".position")  # a call that times out asks where this rank is
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ["IRIS_SIM_WORKER_AUTH"]))
    _serve(rank, world_size, conn)


if __name__ == "__main__":
    main()
