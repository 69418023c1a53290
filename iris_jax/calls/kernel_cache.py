"""Triton kernels compiled for GPUs, kept on disk between processes.

iris_jax.calls.gpu_lowering compiles every kernel it lowers (iris_core.compat.compile_for_launcher),
and a new process would compile each one again: most of a process's first iris collective.
Compiles are stored under a key of everything the compiled kernel (NVIDIA: its PTX) depends on:

* the kernel: Triton's cache key of its source and every @triton.jit function and constexpr
  global it reaches (what Triton's own disk cache uses), its name;
* the call: the argument types, the constexprs by name and value, the options (warps, stages,
  CTAs, fp fusion, debug), the target (compute capability, the backend's hash: ptxas version);
* the tools: Triton's version, the environment variables Triton names as changing its output.

The directory is IRIS_KERNEL_CACHE_DIR (default `$XDG_CACHE_HOME/iris-jax/kernels`, i.e.
`~/.cache/iris-jax/kernels`); IRIS_KERNEL_CACHE_DIR="" keeps compiles in memory only. An entry is
one file written whole (a temporary file, then a rename), so processes compiling the same kernel
at once never see a partial one; an entry that cannot be read is compiled again. Nothing is ever
removed: delete the directory to reclaim the space. jaxlib still assembles the PTX (ptxas) once
per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import tempfile
import threading
import zlib

import numpy as np

from iris_core.compat import CompiledKernel, compile_for_launcher, gpu_backend

_FORMAT = 4  # bump when what an entry holds changes


def cache_dir() -> str | None:
    """Where entries live; None: the disk cache is off."""
    value = os.environ.get("IRIS_KERNEL_CACHE_DIR")
    if value is not None:
        return value or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "iris-jax", "kernels")


class KernelCache:
    """Compiled kernels by key, in memory and (where `directory` is set) on disk, one
    zlib-compressed JSON file per kernel (PTX and TTIR compress about tenfold)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self._memory: dict[str, CompiledKernel] = {}
        self._lock = threading.Lock()
        self.compiled = self.loaded = 0  # counts, for tests and benchmarks/startup.py

    def get(self, key: str, compile_fn) -> CompiledKernel:
        with self._lock:
            found = self._memory.get(key)
        if found is None:
            found = self._read(key)
            if found is not None:
                self.loaded += 1
            else:
                found = compile_fn()
                self.compiled += 1
                self._write(key, found)
            with self._lock:
                self._memory[key] = found
        return found

    def _path(self, key: str) -> str:
        return os.path.join(self.directory, key[:2], key + ".json.z")

    def _read(self, key: str) -> CompiledKernel | None:
        if self.directory is None:
            return None
        try:
            with open(self._path(key), "rb") as f:
                entry = json.loads(zlib.decompress(f.read()))
            if entry.pop("format") != _FORMAT:
                return None
            scratch = entry.pop("global_scratch")
            return CompiledKernel(**entry, global_scratch=tuple(scratch) if scratch else None)
        except (OSError, ValueError, TypeError, KeyError, zlib.error):
            return None  # absent, damaged, or of another format: compile again

    def _write(self, key: str, compiled: CompiledKernel) -> None:
        if self.directory is None:
            return
        path = self._path(key)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(zlib.compress(json.dumps({"format": _FORMAT, **dataclasses.asdict(compiled)}).encode()))
            os.replace(tmp, path)  # whole or not at all, also with processes writing the same entry
        except OSError:
            pass  # a read-only or full disk costs the next process a compile, nothing else


def kernel_key(fn, signature: dict, constants: dict, attrs: dict, options: dict, compute_capability: int) -> str | None:
    """The cache key of one compile, or None where a constexpr value has no stable text
    (an object printed with its address: such kernels are compiled in every process)."""
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars

    constants_text = repr(sorted((k, getattr(v, "cache_key", v)) for k, v in constants.items()))
    if " at 0x" in constants_text:
        return None
    parts = [_FORMAT, triton.__version__, fn.cache_key, fn.__name__, sorted(signature.items()), constants_text,
             sorted(attrs.items()), sorted(options.items()), compute_capability,
             gpu_backend(compute_capability).hash(), sorted(get_cache_invalidating_env_vars().items())]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def compile_kernel(cache: KernelCache, fn, arg_types: list[str], scalar_args, *, options: dict,
                   compute_capability: int, metaparams: dict) -> tuple[CompiledKernel, dict]:
    """Compiles `fn` for `compute_capability` through `cache`.

    Args:
      arg_types: Triton's type of each non-constexpr argument ("*fp32", "i32", ...).
      scalar_args: (position, type, value) of the scalar arguments; an int equal to 1 becomes a
        constexpr (`is_one`), as Triton's own launcher specializes it.
      options: backend options: num_warps, num_stages, num_ctas, debug, enable_fp_fusion.
    Returns:
      The compiled kernel and each argument's specialization attributes (array pointers are
      16-byte aligned: iris and jax-triton keep every array so; scalars carry none).
    """
    scalar_at = {i for i, _, _ in scalar_args}
    backend = gpu_backend(compute_capability)
    attrs = {(i,): backend.parse_attr("" if i in scalar_at else "D") for i in range(len(arg_types))}
    signature = {fn.arg_names[i]: "i1" if t == "B" else t for i, t in enumerate(arg_types)}
    constants = {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    constants.update(metaparams)
    constants.update({fn.arg_names[i]: 1 for i, _, v in scalar_args if is_one(v)})
    signature.update({name: "constexpr" for name in constants})

    def compile_now() -> CompiledKernel:
        return compile_for_launcher(fn, signature, constants, attrs, compute_capability, options)

    key = kernel_key(fn, signature, constants, attrs, options, compute_capability)
    if key is None:
        return compile_now(), attrs
    return cache.get(key, compile_now), attrs


def is_one(value) -> bool:
    """A scalar argument compiled in as the constant 1 (and passed to no launch)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value == 1


_state: dict = {}


def cache() -> KernelCache:
    """This process's cache (in memory only where IRIS_KERNEL_CACHE_DIR="")."""
    if "cache" not in _state:
        directory = cache_dir()
        _state["cache"] = KernelCache(directory)
    return _state["cache"]
