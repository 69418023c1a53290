"""Test configuration: CPU simulator by default, 8 simulated CPU devices in this process.

`pytest` runs the CPU suite (GPU tests are deselected by the default `-m 'not gpu'`);
`pytest -m gpu` runs the GPU tests on the machine's GPUs. The environment is set in
pytest_configure, before any test module imports JAX.
"""

import os

import pytest


def pytest_configure(config):
    if "gpu" in (config.option.markexpr or "") and "not gpu" not in config.option.markexpr:
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # the simulator checks every remote access against its live allocation (iris_core.sim.checks)
    os.environ.setdefault("IRIS_SIM_CHECKED", "1")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()


@pytest.fixture(scope="session")
def rng():
    import numpy as np

    return np.random.default_rng(0)
