"""The device intrinsics of the platform that runs device code, from its module
(iris_core.platform: `GPU.intrinsics`, NVIDIA's iris_core.device.nvidia; under Triton's
interpreter `SIMULATOR.intrinsics`, iris_core.sim.intrinsics).

    sm_id, global_timer        hardware registers: the SM a program runs on, the global clock (ns)
    load_acquire, nanosleep    an acquiring flag load; a sleep between two polls
    store_to_host, load_from_host, fence_system, stop
                               the fault path (iris_core.device.faults): uncached stores and loads
                               of host memory, a system-scope fence, how a thread stops

Device code imports them from here, so a second vendor is its own module and its record, not
edits in every importer. The simulator's module has host equivalents of the first four; the
fault path's are GPU-only (None there).
"""

import importlib

import triton

from iris_core.compat import interpreting
from iris_core.platform import GPU, SIMULATOR

_vendor = importlib.import_module((SIMULATOR if interpreting() else GPU).intrinsics)
_sm_id, _global_timer, _load_acquire, _nanosleep = _vendor.sm_id, _vendor.global_timer, _vendor.load_acquire, \
    _vendor.nanosleep


# The four that kernels of users call are functions of this module, not the vendor's: a kernel
# pickled into a simulated rank's process (cloudpickle keeps references to importable functions)
# then finds the intrinsics of that process, the simulator's, where it names the vendor's
# inline PTX otherwise. Compiled, each call inlines to the vendor's.
@triton.jit
def sm_id():
    """The SM this program runs on (the simulator: the program id)."""
    return _sm_id()


@triton.jit
def global_timer():
    """The global clock in nanoseconds (the simulator: the host clock)."""
    return _global_timer()


@triton.jit
def load_acquire(ptr):
    """Reads a flag (int32 or int64, one address) with acquire semantics at system scope: every
    later read of this thread sees what the writer released before raising the flag."""
    return _load_acquire(ptr)


@triton.jit
def nanosleep(ns):
    """Suspends the thread for about `ns` nanoseconds (at most ~1 ms), e.g. between two polls."""
    _nanosleep(ns)
store_to_host = getattr(_vendor, "store_to_host", None)
load_from_host = getattr(_vendor, "load_from_host", None)
fence_system = getattr(_vendor, "fence_system", None)
stop = getattr(_vendor, "stop", None)
