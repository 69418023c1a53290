"""Building iris's C host steps (fault_gate.c, host_meeting.c) with the system's C compiler on first
use, as Triton builds its launchers: into the kernel cache's directory (or a temporary one), named
by a digest of the sources and flags, so that a process reuses what an earlier one built."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings

from iris_jax.calls import kernel_cache

_HERE = os.path.dirname(os.path.abspath(__file__))
_HEADERS = ("xla_ffi.h",)


def build(name: str, *, flags: tuple = (), what: str) -> ctypes.CDLL | None:
    """`name`.c of this folder as a shared library; None (having warned that `what` takes a slower
    Python path) where no C compiler is found or the build fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        warnings.warn(f"no C compiler (cc, gcc or $CC) for {what}: a Python step, slower, takes its place",
                      stacklevel=3)
        return None
    source = os.path.join(_HERE, f"{name}.c")
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in (source, *(os.path.join(_HERE, h) for h in _HEADERS)):
        with open(path, "rb") as f:
            digest.update(f.read())
    directory = kernel_cache.cache_dir() or tempfile.gettempdir()
    path = os.path.join(directory, f"iris_{name}_{digest.hexdigest()[:16]}.so")
    try:
        if not os.path.exists(path):
            os.makedirs(directory, exist_ok=True)
            partial = f"{path}.{os.getpid()}"
            command = [compiler, "-O2", "-shared", "-fPIC", *flags, source, "-o", partial, "-ldl", "-lpthread"]
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode != 0:
                raise OSError(f"{compiler}: {result.stderr.strip()[:500]}")
            os.replace(partial, path)  # (atomic: processes building at once each leave a whole library)
        return ctypes.CDLL(path)
    except OSError as e:  # no compiler that works, a folder that cannot be written, a library that will not load
        warnings.warn(f"{what} did not build ({e}); a Python step, slower, takes its place", stacklevel=3)
        return None
