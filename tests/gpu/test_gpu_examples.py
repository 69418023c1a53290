"""Every example runs to completion on the GPUs (pytest -m gpu); each verifies its own result."""

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]  # one GPU: test_gpu_shared.py stands in
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


@pytest.mark.parametrize("example,expected", [
    ("00_load_store.py", "ranks (gpu-single-process)"),
    ("01_put_get.py", "ranks (gpu-single-process)"),
    ("02_atomics.py", "ranks (gpu-single-process)"),
    ("03_message_passing.py", "ranks (gpu-single-process)"),
    ("demo.py", "OK: remote stores inside jax.jit(jax.shard_map(...))"),
    ("05_tensor_parallel_mlp.py", "forward and backward match plain JAX"),
    ("09_moe_expert_parallel.py", "OK: the expert-parallel layer gives the same loss and gradients"),
    ("08_tp_fsdp_transformer.py", "OK: tp on iris, FSDP over dp by XLA"),
])
def test_example_on_gpus(example, expected):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("JAX_PLATFORMS", None)
    result = subprocess.run([sys.executable, f"examples/{example}"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    assert result.returncode == 0, result.stdout[-5000:]
    assert expected in result.stdout, result.stdout[-3000:]
    if example == "05_tensor_parallel_mlp.py":
        assert "(GPUs)" in result.stdout, result.stdout[-3000:]
    elif example == "demo.py":
        assert "ranks on the GPUs" in result.stdout, result.stdout[-3000:]
