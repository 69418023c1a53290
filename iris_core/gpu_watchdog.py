"""Ends a process whose CUDA context has failed, instead of letting it hang.

When an iris kernel gives up on a peer it traps, and the process's CUDA context is lost for
good ("sticky" error: every later CUDA call fails). JAX reports that as a JaxRuntimeError when
something it launches after the trap sees the error; but when every launch of the program came
before the trap, JAX's wait for the results never ends (seen with 4 and 8 processes sharing one
GPU: the waiting thread sleeps on a host event that the failed stream never signals).

The watchdog is a daemon thread that polls one of its own CUDA streams once a second per local
device (cuStreamQuery returns the context's sticky error). When the context has failed it
prints why on stderr and, after a grace period that lets the main thread handle the error
itself (JAX's exception, a checkpoint to host memory...), ends the process with exit code
EXIT_CODE. `IRIS_DEAD_CONTEXT_EXIT_S` sets the grace in seconds (default 30); 0 turns the
watchdog off.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Sequence

EXIT_CODE = 75
GRACE_S = float(os.environ.get("IRIS_DEAD_CONTEXT_EXIT_S", 30))
POLL_S = 1.0
_started: set[int] = set()


def watch(devices: Sequence[int], grace_s: float = GRACE_S) -> None:
    """Starts the watchdog for these CUDA ordinals (once per ordinal and process)."""
    devices = [d for d in devices if d not in _started]
    if grace_s <= 0 or not devices:
        return
    _started.update(devices)
    threading.Thread(target=_run, args=(devices, grace_s), name="iris-gpu-watchdog", daemon=True).start()


def _run(devices: Sequence[int], grace_s: float) -> None:
    from cuda.bindings import driver

    streams = []
    for ordinal in devices:
        err, device = driver.cuDeviceGet(ordinal)
        err, context = driver.cuDevicePrimaryCtxRetain(device) if int(err) == 0 else (err, None)
        if int(err) == 0:
            driver.cuCtxSetCurrent(context)
            err, stream = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
        if int(err) != 0:
            return  # no watchdog where it cannot even start (the process has bigger problems)
        streams.append((ordinal, context, stream))
    fine = {int(driver.CUresult.CUDA_SUCCESS), int(driver.CUresult.CUDA_ERROR_NOT_READY),
            int(driver.CUresult.CUDA_ERROR_DEINITIALIZED)}  # (the last: the driver going away at exit)
    while True:
        time.sleep(POLL_S)
        for ordinal, context, stream in streams:
            driver.cuCtxSetCurrent(context)
            (err,) = driver.cuStreamQuery(stream)
            if int(err) not in fine:
                _give_up(ordinal, err, grace_s)


def _give_up(ordinal: int, err, grace_s: float) -> None:
    print(f"iris: the CUDA context of GPU {ordinal} in this process failed ({getattr(err, 'name', err)}): a kernel "
          "aborted (an iris kernel that gave up on a peer prints `iris: timed out waiting for a peer rank` above). "
          f"Nothing more can run on it; ending the process in {grace_s:.0f} s unless it ends first "
          "(IRIS_DEAD_CONTEXT_EXIT_S sets the delay, 0 turns this off).", file=sys.stderr, flush=True)
    time.sleep(grace_s)
    print(f"iris: ending the process (exit code {EXIT_CODE}): its CUDA context failed {grace_s:.0f} s ago",
          file=sys.stderr, flush=True)
    os._exit(EXIT_CODE)
