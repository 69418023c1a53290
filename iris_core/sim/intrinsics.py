"""The simulator's device intrinsics (iris_core.platform.SIMULATOR): what device code takes
from iris_core.device.intrinsics when Triton interprets it on the host.

There is no SM and no global timer: `sm_id` is the program id and `global_timer` reads the host
clock (nanoseconds), which keeps traces and timeouts meaningful. The fault path's intrinsics
(host stores, fences, exit / trap) are GPU-only: the simulator's `fail` raises instead
(iris_core.device.faults).
"""

import time

import triton.language as tl

from iris_core.sim import races, replay

# the simulator: how long a flag read first yields the core, doubling up to _MAX_POLL_S
# while the same flag keeps its value (ranks outnumber cores in tests, and a rank spinning
# in the interpreter takes the core from the one that would set its flag)
_POLL_S, _MAX_POLL_S = 50e-6, 2e-3


def sm_id():
    return tl.program_id(0)


def global_timer():
    replay.host_only("the clock")
    return tl.full((), time.time_ns(), tl.int64)


_last_poll = {"flag": None, "value": None, "misses": 0}


def load_acquire(ptr):
    # the simulator's ranks share host memory; a flag read is a poll, so it lets the
    # ranks that would set the flag run first
    replay.host_only("a flag wait")
    flag = ptr.handle.data.tobytes()
    again = flag == _last_poll["flag"]
    time.sleep(min(_POLL_S * 2 ** _last_poll["misses"], _MAX_POLL_S) if again else _POLL_S)
    with races.acquiring():  # what the race detector takes for an acquiring flag read
        value = tl.load(ptr, volatile=True)
    seen = value.handle.data.tobytes()
    unchanged = again and seen == _last_poll["value"]
    _last_poll.update(flag=flag, value=seen, misses=min(_last_poll["misses"] + 1, 16) if unchanged else 0)
    return value


def nanosleep(ns):
    replay.host_only("a sleep")
    time.sleep(int(ns) * 1e-9)
