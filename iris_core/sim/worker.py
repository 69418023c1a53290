"""Entry point of a simulated rank's worker process (started by SimWorld)."""

import os
import sys
from multiprocessing.connection import Client

from iris_core.sim.interpreter import enable_interpreter, keep_language_patched
from iris_core.sim.world import _serve  # (python -m imported iris_core.sim, and with it world, already)


def main() -> None:
    enable_interpreter()  # before any kernel is defined in this process
    keep_language_patched()  # this process runs only kernels and the simulator's own steps
    # the parent's import path (pytest's rootdirs, sys.path edits): modules whose functions
    # arrive pickled by reference must import here too
    sys.path.extend(p for p in os.environ.get("IRIS_SIM_SYS_PATH", "").split(os.pathsep) if p and p not in sys.path)
    address, rank, world_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    conn = Client(address, family="AF_UNIX", authkey=bytes.fromhex(os.environ["IRIS_SIM_WORKER_AUTH"]))
    _serve(rank, world_size, conn)


if __name__ == "__main__":
    main()
