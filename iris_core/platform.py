"""Whether this machine has NVIDIA GPUs, decided without importing JAX or CUDA libraries.

Scripts that fall back to the CPU simulator must choose before JAX is imported.
"""

import shutil
import subprocess


def gpus_present() -> bool:
    """True when `nvidia-smi -L` lists at least one GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        result = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and "GPU" in result.stdout
