"""The device intrinsics of the GPU platform, from its vendor's module (iris_core.platform:
`GPU.intrinsics`; NVIDIA's: iris_core.device.nvidia).

    sm_id, global_timer        hardware registers: the SM a program runs on, the global clock (ns)
    load_acquire, nanosleep    an acquiring flag load; a sleep between two polls
    store_to_host, load_from_host, fence_system, stop
                               the fault path (iris_core.device.faults): uncached stores and loads
                               of host memory, a system-scope fence, how a thread stops

Device code imports them from here, so a second vendor is its own module and its record, not
edits in every importer. Under the interpreter (the simulator) the vendor's module gives host
equivalents of the first four; the fault path's are GPU-only there (None).
"""

import importlib

from iris_core.platform import GPU

_vendor = importlib.import_module(GPU.intrinsics)

sm_id = _vendor.sm_id
global_timer = _vendor.global_timer
load_acquire = _vendor.load_acquire
nanosleep = _vendor.nanosleep
store_to_host = getattr(_vendor, "store_to_host", None)
load_from_host = getattr(_vendor, "load_from_host", None)
fence_system = getattr(_vendor, "fence_system", None)
stop = getattr(_vendor, "stop", None)
