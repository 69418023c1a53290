"""`@pytest.mark.iris(ranks=N, processes=True)`: the test as N processes, one per rank.

Code written for one process per GPU (`jax.distributed.initialize()`, then `iris_jax.init()`)
runs as `python -m iris_core.sim -n N` runs a script: the launcher starts N processes, each
of which runs pytest on this one test (`rank_main.py`) with IRIS_PYTEST_RANK set; there the
plugin joins the world (JAX's distributed runtime over the launcher's coordinator) and gives the
test a runtime over every process's device. The test passes when every rank's run passed; a
rank that fails stops the others, and the test fails with every rank's output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from pytest_iris.settings import Settings

RANK_MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_main.py")
IN_RANK = "IRIS_PYTEST_RANK"
STARTUP_S = 60.0  # a rank's start (Python, JAX, pytest's collection) on top of the test's own bound
OUTPUT_CHARS = 6000


def in_rank() -> bool:
    """Whether this pytest runs one rank of a processes=True test."""
    return os.environ.get(IN_RANK) == "1"


def join_world() -> list:
    """This process joins the launched world (once per process); every process's device, in rank order."""
    import jax
    from jax._src import distributed

    if distributed.global_state.client is None:
        jax.distributed.initialize()  # the launcher's JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID
    return sorted(jax.devices(), key=lambda d: d.process_index)


def run(item, settings: Settings) -> None:
    """Runs `item` in settings.ranks launched processes; fails it with their output unless all passed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IRIS_SIM_", "PYTEST_"))}
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env.update(XLA_FLAGS=flags, **{IN_RANK: "1"})  # a launched rank has one CPU device
    root = str(item.config.rootpath)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    limit = settings.timeout_s + STARTUP_S
    command = [sys.executable, "-m", "iris_core.sim", "-n", str(settings.ranks), "--timeout", f"{limit:g}",
               RANK_MAIN, root, item.nodeid]
    try:
        done = subprocess.run(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=limit + 30)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the {settings.ranks} ranks' processes did not end within {limit + 30:.0f} s:\n"
                    f"{_tail(e.stdout or '')}", pytrace=False)
    if done.returncode != 0:
        pytest.fail(f"{_verdict(done.returncode)} in the {settings.ranks} ranks' processes (each ran this test; "
                    f"output prefixed with its rank):\n{_tail(done.stdout)}", pytrace=False)


def _verdict(code: int) -> str:
    return {1: "the test failed", 5: "the test was not found", 124: "a rank outlived the test's bound"}.get(
        code, f"a rank exited with status {code}")


def _tail(text: str) -> str:
    return text if len(text) <= OUTPUT_CHARS else "...\n" + text[-OUTPUT_CHARS:]
