"""iris_jax with one process per GPU (jax.distributed + CUDA IPC, two GPUs): kernels, then every
collective and all-reduce variant, against numpy (tests/gpu/scenarios.py, started by
tests/gpu/launcher.py); run: pytest -m gpu. test_gpu_shared.py runs the same scenarios with
every process on GPU 0."""

import pytest

from tests.gpu import launcher

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def test_two_processes(tmp_path):
    scenarios = ["kernels", "collectives"]
    result = launcher.start(2, scenarios, shared=False, log_dir=tmp_path, limit_s=280).wait()
    launcher.SUMMARY.append(result)
    for scenario in scenarios:
        result.check(scenario)
    result.check_exit()
