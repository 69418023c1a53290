"""Shared setup for the examples: every local GPU when there are GPUs, else the CPU simulator.

`setup()` must run before JAX is imported: on a machine without NVIDIA GPUs it selects
JAX's CPU platform with 4 simulated devices (one simulated rank each).
"""

import os
import shutil
import subprocess
import sys


def have_gpus() -> bool:
    """True when nvidia-smi exists and lists at least one GPU (cheap: JAX is not imported)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        result = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and "GPU" in result.stdout


def setup(cpu_devices: int = 4) -> None:
    """Picks GPUs or the CPU simulator; call before `import jax`."""
    if not have_gpus():
        if not os.environ.get("JAX_PLATFORMS"):
            os.environ["JAX_PLATFORMS"] = "cpu"
        flags = os.environ.get("XLA_FLAGS", "")
        if "xla_force_host_platform_device_count" not in flags:
            os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={cpu_devices}".strip()
    # run from a source checkout without `pip install -e .`
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if root not in sys.path:
        sys.path.insert(1, root)
