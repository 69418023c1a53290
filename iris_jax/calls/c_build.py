"""Building iris_jax's C host steps (fault_gate.c, host_meeting.c, with the XLA FFI structures of
xla_ffi.h) on first use, into the kernel cache's directory (iris_core.c_build)."""

from __future__ import annotations

import ctypes
import os

from iris_core import c_build
from iris_jax.calls import kernel_cache

_HERE = os.path.dirname(os.path.abspath(__file__))


def build(name: str, *, flags: tuple = (), what: str, instead: str) -> ctypes.CDLL | None:
    """`name`.c of this folder as a shared library; None (having warned, naming the file and `instead`,
    the Python step that takes its place) where it cannot be built."""
    return c_build.build(os.path.join(_HERE, f"{name}.c"), headers=[os.path.join(_HERE, "xla_ffi.h")], flags=flags,
                         what=what, instead=instead, directory=kernel_cache.cache_dir())
