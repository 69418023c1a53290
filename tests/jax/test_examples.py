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


def test_fault_tolerant_training_survives_a_dead_process():
    """examples/10: 4 launched ranks (jax.distributed, JAX's recoverability on), the last SIGKILLed
    at step 3. Each survivor's step fails naming the dead rank (how soon after the psum's timeout:
    benchmarks/fault_latency.py), the survivors form a world of 3 over JAX's live devices and finish with numpy's
    parameters; the launcher exits 0 and no shared memory of the run is left."""
    import re

    result = run_python(["-m", "iris_core.sim", "--survivors", "-n", "4", "examples/10_fault_tolerant_training.py"],
                        timeout=300)
    out = result.stdout
    assert result.returncode == 0, out
    assert "[iris.sim] rank 3 exited with status -9; the others go on (--survivors)" in out, out
    for p in range(3):
        failed = re.search(rf"process {p}: step 3 failed after ([\d.]+) s: .*PeerTimeoutError: iris all_reduce\(sum\): "
                           r"timed out waiting for rank 3", out)
        assert failed, out
        assert f"process {p}: a new world of 3 ranks" in out, out
        assert f"process {p}: 8 steps, 3 ranks at the end, parameters equal numpy's" in out, out


def test_mosaic_gpu_example():
    """examples/11: a Mosaic GPU ring and JAX's all_gather_mgpu on 4 simulated devices (jax 0.12);
    on older JAX it says which JAX it needs and exits cleanly."""
    from iris_jax.pallas.mosaic_gpu import unsupported_reason

    result = run_python(["examples/11_mosaic_gpu_ring.py"], timeout=300,
                        XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stdout
    expected = ("OK: 4 devices on CPU devices (iris's simulator)" if unsupported_reason() is None else
                "skipped: iris_jax.pallas.mosaic_gpu needs jax >= 0.12")
    assert expected in result.stdout, result.stdout
