"""iris_jax with one process per GPU (jax.distributed + CUDA IPC): kernels, then every collective and
all-reduce variant against lax (tests/gpu/mp_script.py); run: pytest -m gpu."""

import os
import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def test_two_processes(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    script = os.path.join(os.path.dirname(__file__), "mp_script.py")
    procs, logs = [], []
    for i in range(2):
        # one GPU per process (local_device_ids in mp_script); both GPUs stay visible so that the
        # IPC-mapped peer heap is reachable over NVLink; peers' heaps arrive through CUDA IPC
        env = dict(os.environ, XLA_PYTHON_CLIENT_MEM_FRACTION="0.4", PYTHONUNBUFFERED="1")
        env.pop("JAX_PLATFORMS", None)
        log = open(tmp_path / f"process{i}.log", "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, script, str(i), str(port)], env=env, stdout=log,
                                      stderr=subprocess.STDOUT, text=True))
    timed_out = False
    try:
        for p in procs:
            p.wait(timeout=170)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    assert not timed_out, "timed out after 170 s:\n" + "\n".join(f"--- process {i}:\n{o[-3000:]}" for i, o in
                                                              enumerate(outputs))
    for i, (p, out) in enumerate(zip(procs, outputs)):
        assert p.returncode == 0, f"process {i} failed (exit {p.returncode}):\n{out[-6000:]}"
        assert f"process {i}: OK" in out
