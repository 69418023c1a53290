"""CPU simulator: the same Triton kernels on simulated ranks over shared host memory.

* `SimWorld(n)`: n rank processes; `world.run(fn, ...)` runs `fn(state, ...)` on all.
* `python -m iris_core.sim -n N script.py`: runs a script as N ranks (one process each).
* `launch(kernel, grid, *args)`: runs a kernel under the interpreter on host memory.
"""

from iris_core.sim.interpreter import Pointer, enable_interpreter, launch, run_kernel
from iris_core.sim.world import RankState, SimWorld, get_world

__all__ = ["Pointer", "RankState", "SimWorld", "enable_interpreter", "get_world", "launch", "run_kernel"]
