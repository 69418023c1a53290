"""Triton kernels compiled for GPUs, kept on disk between processes.

jax-triton compiles each kernel again in every new process (its cache lives in memory), and
its first compile imports torch: Triton's argument specializer imports it to recognize torch
tensors. Together that is most of a process's first iris collective (RESULTS.md, "Startup").
We take over jax-triton's `get_or_create_triton_kernel` (the step its lowering calls for a
kernel's PTX): the same compiler stages, the specialization computed directly (jax-triton
passes only 16-byte-aligned pointers and unaligned scalars, so no specializer is needed), and
the result stored under a key of everything the PTX depends on:

* the kernel: Triton's cache key of its source and every @triton.jit function and constexpr
  global it reaches (what Triton's own disk cache uses), its name;
* the call: the argument types, the constexprs by name and value, the options (warps, stages,
  CTAs, fp fusion, debug), the target (compute capability, ptxas version);
* the tools: the versions of Triton and jax-triton, the environment variables Triton names
  as changing its output.

The directory is IRIS_KERNEL_CACHE_DIR (default `$XDG_CACHE_HOME/iris-jax/kernels`, i.e.
`~/.cache/iris-jax/kernels`); IRIS_KERNEL_CACHE_DIR="" turns this module off (jax-triton's own
compile, in memory, as without iris). An entry is one file written whole (a temporary file,
then a rename), so processes compiling the same kernel at once never see a partial one; an
entry that cannot be read is compiled again. Nothing is ever removed: delete the directory to
reclaim the space. jaxlib still assembles the PTX (ptxas) once per process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import threading
import zlib

_FORMAT = 2  # bump when what an entry holds changes


def cache_dir() -> str | None:
    """Where entries live; None: the disk cache is off."""
    value = os.environ.get("IRIS_KERNEL_CACHE_DIR")
    if value is not None:
        return value or None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "iris-jax", "kernels")


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What jaxlib's TritonKernel is built from."""

    name: str
    shared_mem_bytes: int
    ptx: str
    ttir: str


class KernelCache:
    """Compiled kernels by key, in memory and (where `directory` is set) on disk, one
    zlib-compressed JSON file per kernel (PTX and TTIR compress about tenfold)."""

    def __init__(self, directory: str | None):
        self.directory = directory
        self._memory: dict[str, Compiled] = {}
        self._lock = threading.Lock()
        self.compiled = self.loaded = 0  # counts, for tests and benchmarks/startup.py

    def get(self, key: str, compile_fn) -> Compiled:
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

    def _read(self, key: str) -> Compiled | None:
        if self.directory is None:
            return None
        try:
            with open(self._path(key), "rb") as f:
                entry = json.loads(zlib.decompress(f.read()))
            if entry.pop("format") != _FORMAT:
                return None
            return Compiled(**entry)
        except (OSError, ValueError, TypeError, KeyError, zlib.error):
            return None  # absent, damaged, or of another format: compile again

    def _write(self, key: str, compiled: Compiled) -> None:
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


def kernel_key(fn, signature: dict, constants: dict, attrs: dict, options, target) -> str | None:
    """The cache key of one compile, or None where a constexpr value has no stable text
    (an object printed with its address: such kernels are compiled in every process)."""
    import jax_triton
    import triton
    from triton._C.libtriton import get_cache_invalidating_env_vars

    constants_text = repr(sorted((k, getattr(v, "cache_key", v)) for k, v in constants.items()))
    if " at 0x" in constants_text:
        return None
    parts = [_FORMAT, triton.__version__, jax_triton.__version__, fn.cache_key, fn.__name__,
             sorted(signature.items()), constants_text, sorted(attrs.items()), options.hash(),
             target, sorted(get_cache_invalidating_env_vars().items())]
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def compile_kernel(cache: KernelCache, backend, platform: str, fn, arg_dtypes, scalar_args, *, num_warps,
                   num_stages, num_ctas, compute_capability, enable_fp_fusion, metaparams, dump) -> tuple:
    """jax-triton's kernel step (same arguments and stages), through `cache`. Returns the
    Compiled kernel and the specialization attributes jax-triton's lowering reads."""
    from jax_triton import triton_lib
    from triton._C import libtriton
    from triton.compiler import code_generator, compiler

    scalar_at = {i for i, _, _ in scalar_args}
    attrs = {(i,): backend.parse_attr("" if i in scalar_at else "D") for i in range(len(arg_dtypes))}
    signature = {fn.arg_names[i]: t for i, t in enumerate(arg_dtypes)}
    constants = dict(metaparams)
    constants.update({k: None for _, k, v in scalar_args if v is None})
    constants.update({fn.arg_names[i]: 1 for i, _, v in scalar_args if v == 1})
    signature.update({name: "constexpr" for name in constants})
    options = backend.parse_options({"num_warps": num_warps, "num_stages": num_stages, "num_ctas": num_ctas,
                                     "debug": dump, "enable_fp_fusion": enable_fp_fusion})

    def compile_now() -> Compiled:
        context = libtriton.ir.context()
        libtriton.ir.load_dialects(context)
        backend.load_dialects(context)
        module = code_generator.ast_to_ttir(
            fn, compiler.ASTSource(fn, constexprs=constants, signature=signature, attrs=attrs), options=options,
            codegen_fns=backend.get_codegen_implementation(options), context=context,
            module_map=backend.get_module_map())
        ttir = str(module)
        result = triton_lib.compile_ttir_inplace(module, backend, options, compute_capability, platform)
        return Compiled(result.name, result.shared_mem_bytes, result.binary, ttir)

    key = kernel_key(fn, signature, constants, attrs, options, (platform, compute_capability, backend.hash()))
    compiled = cache.get(key, compile_now) if key is not None else compile_now()
    return compiled, attrs


_state: dict = {}


def install() -> None:
    """Routes jax-triton's kernel compiles through the disk cache (once; a no-op where
    IRIS_KERNEL_CACHE_DIR="" or where jax-triton's compile step is not where we expect it)."""
    from jax_triton import triton_lib

    directory = cache_dir()
    original = getattr(triton_lib, "get_or_create_triton_kernel", None)
    if directory is None or original is None or "cache" in _state:
        return
    cache = _state["cache"] = KernelCache(directory)
    kernels: dict[tuple, object] = {}  # TritonKernel objects by compile, as jax-triton keeps them

    def get_or_create_triton_kernel(backend_init_func, platform, fn, arg_dtypes, scalar_args, *, num_warps,
                                    num_stages, num_ctas, compute_capability, enable_fp_fusion, metaparams,
                                    dump):
        if platform != "cuda" or triton_lib._JAX_TRITON_DUMP_DIR:  # ROCm passes a file path as "ptx"
            return original(backend_init_func, platform, fn, arg_dtypes, scalar_args, num_warps=num_warps,
                            num_stages=num_stages, num_ctas=num_ctas, compute_capability=compute_capability,
                            enable_fp_fusion=enable_fp_fusion, metaparams=metaparams, dump=dump)
        num_warps = 4 if num_warps is None else num_warps
        num_stages = 3 if num_stages is None else num_stages
        if compute_capability is None:
            compute_capability = triton_lib.triton_kernel_call_lib.get_compute_capability(0)
        if num_ctas > 1 and compute_capability < 90:
            raise ValueError("num_ctas > 1 unsupported before Hopper.")
        backend = backend_init_func(0, compute_capability)
        compiled, attrs = compile_kernel(
            cache, backend, platform, fn, arg_dtypes, scalar_args, num_warps=num_warps, num_stages=num_stages,
            num_ctas=num_ctas, compute_capability=compute_capability, enable_fp_fusion=enable_fp_fusion,
            metaparams=metaparams, dump=dump)
        made = (compiled, num_warps, num_ctas, compute_capability)
        if made not in kernels:
            kernels[made] = triton_lib.triton_kernel_call_lib.TritonKernel(
                compiled.name, num_warps, num_ctas, compiled.shared_mem_bytes, compiled.ptx, compiled.ttir,
                compute_capability)
        return kernels[made], attrs

    triton_lib.get_or_create_triton_kernel = get_or_create_triton_kernel


def cache() -> KernelCache | None:
    """The installed cache (None before install(), or where it is off)."""
    return _state.get("cache")
