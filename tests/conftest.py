"""Test configuration: CPU simulator by default, 8 simulated CPU devices in this process.

`pytest` runs the CPU suite (GPU tests are deselected by the default `-m 'not gpu'`);
`pytest -m gpu` runs the GPU tests on the machine's GPUs. The environment is set in
pytest_configure, before any test module imports JAX.

Every test runs under JAX's strict settings, as JAX's own suite does (`STRICT_JAX`): its internal
consistency checks, rank promotion `raise` and dtype promotion `strict`. They are set through the
environment, so that the processes a test starts (the simulator's ranks, launched worker
processes) run under them too; a variable already set wins (`JAX_ENABLE_CHECKS=0 pytest ...`).

On the CPU, XLA compiles the tests' programs without LLVM's optimizations (`CPU_XLA_FLAGS`):
their arrays are small, and compiling them is the largest single cost of the suite (docs/testing.md).
"""

import os
import sys

import pytest

STRICT_JAX = {
    "JAX_ENABLE_CHECKS": "1",
    "JAX_NUMPY_RANK_PROMOTION": "raise",
    "JAX_NUMPY_DTYPE_PROMOTION": "strict",
}

# compiling at LLVM's -O0 takes a fifth less time than XLA:CPU's default; a flag already set wins
CPU_XLA_FLAGS = {"xla_force_host_platform_device_count": "8", "xla_backend_optimization_level": "0"}


def _strict_jax():
    """JAX's strict settings in the environment (and in JAX, where a plugin imported it already)."""
    for name, value in STRICT_JAX.items():
        os.environ.setdefault(name, value)
    if "jax" in sys.modules:
        import jax

        for name in STRICT_JAX:
            value = os.environ[name]
            jax.config.update(name.lower(), value == "1" if name == "JAX_ENABLE_CHECKS" else value)


def pytest_configure(config):
    _strict_jax()
    if "gpu" in (config.option.markexpr or "") and "not gpu" not in config.option.markexpr:
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    # the simulator checks every remote access against its live allocation (iris_core.sim.checks)
    os.environ.setdefault("IRIS_SIM_CHECKED", "1")
    flags = os.environ.get("XLA_FLAGS", "")
    flags += "".join(f" --{name}={value}" for name, value in CPU_XLA_FLAGS.items() if name not in flags)
    os.environ["XLA_FLAGS"] = flags.strip()


@pytest.fixture(scope="session")
def rng():
    import numpy as np

    return np.random.default_rng(0)
