"""iris_jax with one process per GPU (jax.distributed + CUDA IPC); run: pytest -m gpu."""

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_two_processes():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    script = os.path.join(os.path.dirname(__file__), "mp_script.py")
    env = dict(os.environ, IRIS_TEST_GPU="1")
    env.pop("JAX_PLATFORMS", None)
    procs = [subprocess.Popen([sys.executable, script, str(i), str(port)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} failed:\n{out[-4000:]}"
        assert f"process {i}: OK" in out
