"""Shared setup for the examples: every local GPU when there are GPUs, else the CPU simulator.

`setup()` must run before JAX is imported: on a machine without NVIDIA GPUs it selects
JAX's CPU platform with 4 simulated devices (one simulated rank each).
"""

import os
import sys


def setup(cpu_devices: int = 4) -> None:
    """Picks GPUs or the CPU simulator; call before `import jax`."""
    # run from a source checkout without `pip install -e .`
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(1, root)
    from iris_core.platform import gpus_present

    if not gpus_present():
        if not os.environ.get("JAX_PLATFORMS"):
            os.environ["JAX_PLATFORMS"] = "cpu"
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={cpu_devices}".strip()
