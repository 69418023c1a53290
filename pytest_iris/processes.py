"""`@pytest.mark.iris(ranks=N, processes=True)`: the test as N processes, one per rank.

Code written for one process per GPU (`jax.distributed.initialize()`, then `iris_jax.init()`)
runs as `python -m iris_core.sim -n N` runs a script: the launcher starts N processes, each
of which runs pytest on this one test (`rank_main.py`) with IRIS_PYTEST_RANK set; there the
plugin joins the world (JAX's distributed runtime over the launcher's coordinator) and gives the
test a runtime over every process's device. The test passes when every rank's run passed; a
rank that fails stops the others, and the test fails with every rank's output.

Under `--iris-gpu` the processes are launched here instead, process r on GPU r mod the GPU count
(IRIS_PYTEST_GPU): with fewer GPUs than ranks, several processes share one, as iris's own GPU
suite runs 2, 4 and 8 ranks on one GPU; JAX allocates on demand in each.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

from pytest_iris.settings import Settings

RANK_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py")
IN_RANK = "IRIS_PYTEST_RANK"
STARTUP_S = 60.0  # a rank's start (Python, JAX, pytest's collection) on top of the test's own bound
OUTPUT_CHARS = 6000


def in_rank() -> bool:
    """Whether this pytest runs one rank of a processes=True test."""
    return os.environ.get(IN_RANK) == "1"


GPU = "IRIS_PYTEST_GPU"  # the CUDA ordinal of a launched rank's GPU (--iris-gpu)


def join_world() -> list:
    """This process joins the launched world (once per process); every process's device, in rank order."""
    import jax
    from jax._src import distributed

    if distributed.global_state.client is None:
        if GPU in os.environ:  # launched here (_launch_on_gpus), on one GPU
            jax.distributed.initialize(os.environ["JAX_COORDINATOR_ADDRESS"], int(os.environ["JAX_NUM_PROCESSES"]),
                                       int(os.environ["JAX_PROCESS_ID"]), local_device_ids=[int(os.environ[GPU])])
        else:
            jax.distributed.initialize()  # the launcher's JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID
    return sorted(jax.devices(), key=lambda d: d.process_index)


def run(item, settings: Settings, gpu: bool = False) -> None:
    """Runs `item` in settings.ranks launched processes (on the simulator, or on this machine's GPUs);
    fails it with their output unless all passed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IRIS_SIM_", "PYTEST_"))}
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env.update(XLA_FLAGS=flags, **{IN_RANK: "1"})  # a launched rank has one device
    root = str(item.config.rootpath)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    limit = settings.timeout_s + STARTUP_S
    argv = [RANK_MAIN, root, item.nodeid]
    if gpu:
        code, output = _launch_on_gpus(settings.ranks, argv, env, root, limit)
    else:
        command = [sys.executable, "-m", "iris_core.sim", "-n", str(settings.ranks), "--timeout", f"{limit:g}", *argv]
        try:
            done = subprocess.run(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=limit + 30)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"the {settings.ranks} ranks' processes did not end within {limit + 30:.0f} s:\n"
                        f"{_tail(e.stdout or '')}", pytrace=False)
        code, output = done.returncode, done.stdout
    if code != 0:
        pytest.fail(f"{_verdict(code)} in the {settings.ranks} ranks' processes (each ran this test; "
                    f"output prefixed with its rank):\n{_tail(output)}", pytrace=False)


def _launch_on_gpus(ranks: int, argv: list[str], env: dict[str, str], root: str, limit_s: float) -> tuple[int, str]:
    """Runs `python argv...` as `ranks` processes, process r on GPU r mod the GPU count; (the first failing
    exit code, or 124 past limit_s, or 0; their output, each line prefixed with its rank). A failing rank
    stops the others."""
    from iris_core.heap.cuda import gpu_count
    from iris_core.sim.launcher import free_port

    gpus = gpu_count()
    if gpus == 0:
        pytest.skip("processes=True under --iris-gpu needs a GPU; this machine's CUDA driver sees none")
    coordinator = f"localhost:{free_port()}"
    env = dict(env, JAX_COORDINATOR_ADDRESS=coordinator, JAX_NUM_PROCESSES=str(ranks), PYTHONUNBUFFERED="1",
               XLA_PYTHON_CLIENT_PREALLOCATE="false")  # processes that share a GPU take memory as they need it
    env.pop("JAX_PLATFORMS", None)
    with tempfile.TemporaryDirectory(prefix="iris-pytest-") as logs:
        paths = [os.path.join(logs, f"rank{r}.log") for r in range(ranks)]
        procs = []
        for r, path in enumerate(paths):
            with open(path, "w") as log:
                procs.append(subprocess.Popen([sys.executable, *argv], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                                              env=dict(env, JAX_PROCESS_ID=str(r), **{GPU: str(r % gpus)})))
        deadline, code = time.monotonic() + limit_s, 0
        while any(p.poll() is None for p in procs):
            code = next((p.returncode for p in procs if p.returncode not in (None, 0)), 0)
            if code or time.monotonic() > deadline:
                code = code or 124
                break
            time.sleep(0.05)
        else:
            code = next((p.returncode for p in procs if p.returncode != 0), 0)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        output = "".join(f"[rank {r}] {line}" for r, path in enumerate(paths) for line in open(path).readlines())
    return code, output


def _verdict(code: int) -> str:
    return {1: "the test failed", 5: "the test was not found", 124: "a rank outlived the test's bound"}.get(
        code, f"a rank exited with status {code}")


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_CHARS else "...\n" + text[-OUTPUT_CHARS:]
