"""`python -m iris_core.sim -n N script.py [args]`: run a script as N simulated ranks.

Each rank is a process running the script with IRIS_SIM_RANK / IRIS_SIM_WORLD_SIZE /
IRIS_SIM_SESSION / IRIS_SIM_STORE set and Triton's interpreter on; iris picks these up
and maps every rank's heap. JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID
let a script written for one process per GPU join the ranks with `jax.distributed.initialize()`
(jax_cluster.py; JAX's CPU collectives then run over gloo). Output lines are prefixed with the
rank. If a rank fails, the others are stopped and the launcher exits with that rank's status;
with `--survivors`, a rank killed by a signal leaves the others running (a script that re-forms
its world without it: JAX's `live_devices`, then iris_jax.init over them), and the launcher exits
with the first failure among the rest, else 0. Shared-memory segments of the run are removed in
every case. Ranks die with the launcher (rank_process.py),
so a killed launcher's segments are stale for the next run to remove.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from iris_core.heap.shared_memory import new_session, remove_session_segments, remove_stale_segments
from iris_core.sim import positions

RANK_PROCESS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_process.py")
JAX_CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "jax_cluster.py")


def free_port() -> int:
    """A free TCP port on localhost (for a jax.distributed coordinator)."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _pump(stream, prefix: str, out) -> None:
    for line in iter(stream.readline, b""):
        out.write(prefix + line.decode(errors="replace"))
        out.flush()


def launch_script(argv: list[str], world_size: int, timeout_s: float | None = None, survivors: bool = False) -> int:
    """Runs `python argv...` as `world_size` ranks; returns the first failing exit code or 0 (with
    `survivors`, ranks killed by a signal neither stop the others nor count)."""
    remove_stale_segments()
    session = new_session()
    store = tempfile.mkdtemp(prefix=f"iris-{session}-")
    coordinator = f"localhost:{free_port()}"
    procs, pumps = [], []
    try:
        for rank in range(world_size):
            env = dict(os.environ, IRIS_SIM_RANK=str(rank), IRIS_SIM_WORLD_SIZE=str(world_size),
                       IRIS_SIM_SESSION=session, IRIS_SIM_STORE=store, TRITON_INTERPRET="1",
                       JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1", JAX_COORDINATOR_ADDRESS=coordinator,
                       JAX_NUM_PROCESSES=str(world_size), JAX_PROCESS_ID=str(rank),
                       JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
            p = subprocess.Popen([sys.executable, RANK_PROCESS, str(os.getpid()), JAX_CLUSTER, *argv], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            t = threading.Thread(target=_pump, args=(p.stdout, f"[rank {rank}] ", sys.stdout), daemon=True)
            t.start()
            pumps.append(t)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        status, dead = 0, set()
        while any([p.poll() is None for p in procs]):  # a list: poll every rank, not up to the first running one
            failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if survivors:
                for r, code in failed:
                    if code < 0 and r not in dead:
                        dead.add(r)
                        print(f"[iris.sim] rank {r} exited with status {code}; the others go on (--survivors)",
                              file=sys.stderr)
                failed = [(r, code) for r, code in failed if r not in dead]
            if failed:
                status = failed[0][1]
                which = "; ".join(f"rank {r} exited with status {code}" for r, code in failed)
                print(f"[iris.sim] {which}; stopping the others", file=sys.stderr)
                break
            if deadline is not None and time.monotonic() > deadline:
                hung = [r for r, p in enumerate(procs) if p.poll() is None]
                print(f"[iris.sim] timeout after {timeout_s:.0f} s; ranks still running: {hung}; where each "
                      "was:", file=sys.stderr)
                for r in hung:  # each prints its position (jax_cluster.py), prefixed with its rank
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(procs[r].pid, signal.SIGUSR1)
                time.sleep(positions.ANSWER_S)
                status = 124
                break
            time.sleep(0.05)
        else:
            status = next((p.returncode for r, p in enumerate(procs) if p.returncode != 0 and r not in dead), 0)
        return status
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
            p.wait()
        for t in pumps:
            t.join(timeout=2)
        remove_session_segments(session)
        shutil.rmtree(store, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m iris_core.sim", description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--world-size", type=int, default=2, help="number of simulated ranks")
    parser.add_argument("--timeout", type=float, default=None, help="seconds before all ranks are stopped")
    parser.add_argument("--survivors", action="store_true",
                        help="a rank killed by a signal does not stop the others (they may re-form without it)")
    parser.add_argument("script", help="Python script to run on every rank")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args(argv)
    return launch_script([opts.script, *opts.args], opts.world_size, opts.timeout, opts.survivors)
