"""One process per GPU on the simulator: a multi-controller script (tests/jax/multicontroller.py, in
tests/gpu/mp_script.py's shape) run unchanged by `python -m iris_core.sim -n W`."""

import pytest

from tests.jax.helpers import run_python
from tests.jax.multicontroller import GPU_SCENARIOS, SCENARIOS

# a run inside a Slurm job still joins the launcher's ranks, not the job's (one task here)
SLURM_JOB = {"SLURM_JOB_ID": "1", "SLURM_STEP_NODELIST": "localhost", "SLURM_NTASKS": "1", "SLURM_PROCID": "0",
             "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_multi_controller_script_runs_unchanged_on_the_simulator(world_size):
    result = run_python(["-m", "iris_core.sim", "-n", str(world_size), "--timeout", "170",
                         "tests/jax/multicontroller.py"], timeout=200, **SLURM_JOB)
    assert result.returncode == 0, result.stdout
    for p in range(world_size):
        prefix = f"[rank {p}] process {p}:"
        assert f"{prefix} distributed up, " in result.stdout and f" of {world_size}\n" in result.stdout, result.stdout
        assert f"{prefix} rank [{p}], heaps mapped Runtime(mode='sim-launched', world_size={world_size}" in result.stdout
        for name in [*SCENARIOS, *GPU_SCENARIOS]:
            assert f"{prefix} scenario {name} OK" in result.stdout, result.stdout
        assert f"{prefix} OK" in result.stdout, result.stdout
