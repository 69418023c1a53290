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
