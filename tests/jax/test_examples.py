"""Every example runs to completion on the CPU simulator (4 simulated devices)."""

import pytest

from tests.jax.helpers import run_python

EXAMPLES = ["00_load_store.py", "01_put_get.py", "02_atomics.py", "03_message_passing.py"]


@pytest.mark.parametrize("example", EXAMPLES)
def test_example(example):
    result = run_python([f"examples/{example}"], timeout=300, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stdout
    assert "OK" in result.stdout, result.stdout
    assert "4 ranks (sim-workers)" in result.stdout, result.stdout


def test_example_falls_back_to_the_simulator_by_itself():
    """Without JAX_PLATFORMS / XLA_FLAGS the example picks its platform (CPU: 4 simulated ranks)."""
    from iris_core.platform import gpus_present

    result = run_python(["examples/00_load_store.py"], timeout=300, JAX_PLATFORMS=None)
    assert result.returncode == 0, result.stdout
    assert "OK" in result.stdout, result.stdout
    if not gpus_present():
        assert "4 ranks (sim-workers)" in result.stdout, result.stdout


@pytest.mark.parametrize("example,expected", [
    ("demo.py", "OK: remote stores inside jax.jit(jax.shard_map(...))"),
    ("05_tensor_parallel_mlp.py", "forward and backward match plain JAX"),
    ("09_moe_expert_parallel.py", "OK: the expert-parallel layer gives the same loss and gradients"),
    ("08_tp_fsdp_transformer.py", "OK: tp on iris, FSDP over dp by XLA"),
])
def test_demo_and_mlp_example(example, expected):
    result = run_python([f"examples/{example}"], timeout=300, XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stdout
    assert expected in result.stdout, result.stdout
