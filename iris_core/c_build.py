"""Building iris's C host steps with the system's C compiler on first use, as Triton builds its
launchers: named by a digest of the sources and flags, so that a process reuses what an earlier
one built. Where no compiler works, the caller keeps a Python step (and a warning says so)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Sequence


def build(source: str, *, headers: Sequence[str] = (), flags: Sequence[str] = (), what: str,
          directory: str | None = None) -> ctypes.CDLL | None:
    """The C file `source` (which includes `headers`) as a shared library in `directory` (default: the
    temporary folder); None (having warned that `what` takes a slower Python path) where no C
    compiler is found or the build fails."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        warnings.warn(f"no C compiler (cc, gcc or $CC) for {what}: a Python step, slower, takes its place",
                      stacklevel=3)
        return None
    digest = hashlib.sha256(" ".join(flags).encode())
    for path in (source, *headers):
        with open(path, "rb") as f:
            digest.update(f.read())
    name = os.path.splitext(os.path.basename(source))[0]
    directory = directory or tempfile.gettempdir()
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
