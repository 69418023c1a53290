"""Building iris's C host steps with the system's C compiler on first use, as Triton builds its
launchers: named by a digest of the sources and flags, so that a process reuses what an earlier
one built. Where a step cannot be built (no compiler, a source missing, a failed build), the caller
keeps a Python step, and one CStepWarning names the file and that Python step.

The C sources are package data: pyproject.toml ships them in the wheel and the sdist, and
tests/test_wheel.py checks that every path handed to `build` (`requested`) is in the built wheel."""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Sequence

from iris_core.errors import CStepWarning

requested: set[str] = set()  # every source and header `build` was asked for in this process (tests/test_wheel.py)


def build(source: str, *, headers: Sequence[str] = (), flags: Sequence[str] = (), what: str, instead: str,
          directory: str | None = None) -> ctypes.CDLL | None:
    """The C file `source` (which includes `headers`) as a shared library in `directory` (default: the
    temporary folder); None, having warned once, where it cannot be built: the warning names the file,
    `what` it is and `instead`, the Python step that takes its place."""

    def fall_back(reason: str) -> None:
        warnings.warn(f"iris: {what} ({source}) did not build: {reason}; {instead} takes its place (slower)",
                      CStepWarning, stacklevel=3)

    requested.update((source, *headers))
    missing = [path for path in (source, *headers) if not os.path.isfile(path)]
    if missing:  # (an install that lacks package data)
        fall_back(f"{', '.join(missing)} not found")
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        fall_back("no C compiler (cc, gcc or $CC)")
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
            # a file of its own per build (threads of one process build at once too), renamed atomically: builders
            # racing each leave a whole library
            handle, partial = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=directory)
            os.close(handle)
            try:
                command = [compiler, "-O2", "-shared", "-fPIC", *flags, source, "-o", partial, "-ldl", "-lpthread"]
                result = subprocess.run(command, capture_output=True, text=True)
                if result.returncode != 0:
                    raise OSError(f"{compiler}: {result.stderr.strip()[:500]}")
                os.chmod(partial, 0o755)
                os.replace(partial, path)
            finally:
                if os.path.exists(partial):
                    os.unlink(partial)
        return ctypes.CDLL(path)
    except OSError as e:  # no compiler that works, a folder that cannot be written, a library that will not load
        fall_back(str(e))
        return None
