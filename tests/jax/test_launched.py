"""The multi-process simulator: `python -m iris_core.sim -n W script.py`, one process per rank."""

import pytest

from tests.jax.helpers import run_python


@pytest.mark.parametrize("world_size", [2, 3])
def test_launched_ring(world_size):
    result = run_python(["-m", "iris_core.sim", "-n", str(world_size), "--timeout", "240",
                         "tests/jax/launched_ring.py"], timeout=300)
    assert result.returncode == 0, result.stdout
    for rank in range(world_size):
        prev = (rank - 1) % world_size
        assert f"[rank {rank}] rank {rank}/{world_size}: received from rank {prev} OK" in result.stdout, result.stdout


def test_a_rank_that_exits_right_after_init_keeps_its_heap_until_the_peers_attached():
    result = run_python(["-m", "iris_core.sim", "-n", "3", "--timeout", "120", "tests/jax/launched_early_exit.py"],
                        timeout=180)
    assert result.returncode == 0, result.stdout
    assert "[rank 2] rank 2: wrote the marker, exiting" in result.stdout, result.stdout
    for rank in (0, 1):
        assert f"[rank {rank}] rank {rank}: read rank 2's marker OK" in result.stdout, result.stdout



def test_processes_a_test_starts_run_under_the_suites_strict_settings():
    """tests/conftest.py sets JAX's strict settings through the environment: every process a test
    starts (a launched rank, a simulated rank, this child) runs under them, as pytest's does."""
    script = ("import jax; c = jax.config; "
              "print('strict', c.jax_enable_checks, c.jax_numpy_rank_promotion, c.jax_numpy_dtype_promotion)")
    result = run_python(["-c", script], timeout=120)
    assert result.returncode == 0, result.stdout
    assert "strict True raise strict" in result.stdout, result.stdout


def test_the_heap_grows_on_every_rank_and_a_rank_out_of_memory_fails_it_everywhere():
    """launched_growth.py: two processes grow their heaps together past the initial mapping and
    address the new range from a kernel; a growth past rank 1's simulated device memory raises
    HeapExhaustedError on both ranks and changes nothing."""
    result = run_python(["-m", "iris_core.sim", "-n", "2", "--timeout", "240", "tests/jax/launched_growth.py"],
                        timeout=300, IRIS_SIM_DEVICE_MEMORY=f"1:{160 << 20}")
    assert result.returncode == 0, result.stdout
    for rank, prev in ((0, 1), (1, 0)):
        assert f"[rank {rank}] rank {rank}: grew to 128 MiB, received from rank {prev} in the new range OK" \
            in result.stdout, result.stdout
        assert f"[rank {rank}] rank {rank}: HeapExhaustedError naming rank 1's device" in result.stdout, result.stdout
        assert f"[rank {rank}] rank {rank}: nothing changed, smaller arrays still fit" in result.stdout, result.stdout
