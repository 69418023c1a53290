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

from iris_core.compat import interpreting
from iris_core.platform import GPU, SIMULATOR

_vendor = importlib.import_module((SIMULATOR if interpreting() else GPU).intrinsics)

sm_id = _vendor.sm_id
global_timer = _vendor.global_timer
load_acquire = _vendor.load_acquire
nanosleep = _vendor.nanosleep
store_to_host = getattr(_vendor, "store_to_host", None)
load_from_host = getattr(_vendor, "load_from_host", None)
fence_system = getattr(_vendor, "fence_system", None)
stop = getattr(_vendor, "stop", None)
