"""Runs a Triton kernel under the interpreter on raw host addresses.

Triton's own GridExecutor copies every tensor argument's whole storage to a host copy
and back; with heaps in shared memory that would copy a heap over itself and race with
peers writing into it. Here pointer arguments are plain addresses (`Pointer`), so the
kernel reads and writes the memory itself. Relies on triton 3.6 interpreter internals.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import threading
from collections.abc import Sequence

import numpy as np


class Pointer:
    """A typed raw address, accepted wherever a kernel expects a tensor argument."""

    def __init__(self, address: int, dtype):
        self.address = int(address)
        self.dtype = _dtype_name(dtype)

    def data_ptr(self) -> int:
        return self.address

    def __repr__(self):
        return f"Pointer(0x{self.address:x}, {self.dtype})"


def _dtype_name(dtype) -> str:
    if not isinstance(dtype, str):
        try:
            return np.dtype(dtype).name  # numpy and ml_dtypes (bfloat16) types
        except TypeError:
            dtype = str(dtype)  # torch.float32 and friends
    return dtype.split(".")[-1]


def as_interpreted(kernel):
    """The kernel as an InterpretedFunction (kernels defined before interpret mode was on,
    or unpickled from a process that was not interpreting, arrive as JITFunctions)."""
    from triton.runtime.interpreter import InterpretedFunction

    if isinstance(kernel, InterpretedFunction):
        return kernel
    fn = getattr(kernel, "fn", None)
    while fn is not None and not inspect.isfunction(fn):  # autotuner / heuristics wrappers
        fn = getattr(fn, "fn", None)
    if fn is None:
        raise TypeError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    cache = _INTERPRETED
    if fn not in cache:
        cache[fn] = InterpretedFunction(fn)
    return cache[fn]


_INTERPRETED: dict = {}


def run_kernel(kernel, grid: Sequence[int], args: Sequence, constexprs: dict | None = None,
               debug: bool = False) -> None:
    """Runs `kernel[grid](*args, **constexprs)` under the interpreter, in this thread.

    Pointer arguments must be `Pointer`s (or anything with data_ptr() and dtype); Python
    scalars pass as scalars. Not thread-safe: the interpreter patches global state.
    `debug`: device-side assertions (tl.device_assert) raise, as they trap on GPUs for a
    kernel compiled with debug=True (the interpreter's own option is always off).
    """
    from triton.runtime import interpreter as ti

    from iris_core.sim.checks import running_kernel

    kernel = as_interpreted(kernel)
    fn = kernel.rewrite()
    constexprs = dict(constexprs or {})
    sig = inspect.signature(kernel.fn)
    names = list(sig.parameters)
    annotations = {k: str(v) for k, v in kernel.fn.__annotations__.items()}
    is_constexpr = {n for n in names if "constexpr" in annotations.get(n, "")}
    positional = names[:len(args)]
    if is_constexpr & set(positional):
        raise TypeError(
            f"kernel {kernel.fn.__name__}: constexpr parameters {sorted(is_constexpr & set(positional))} come "
            "before array or scalar parameters; put them last (jax-triton passes arrays, scalars and "
            "outputs positionally, constexprs by name)")
    bound = dict(zip(names, args))
    bound.update(constexprs)
    for name, param in sig.parameters.items():
        if name not in bound:
            if param.default is inspect.Parameter.empty:
                raise TypeError(f"kernel {kernel.fn.__name__} is missing argument {name!r}")
            bound[name] = param.default
    call_args = {n: v if n in is_constexpr else _as_tensor(v, ti) for n, v in bound.items()}
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    _patch_interpreter(ti)
    _LAUNCH.patched = frozenset()
    patch_scope = ti._patch_lang(kernel.fn)
    options = ti.interpreter_builder.options
    # overflow checks only matter where asserts fire (debug), as on GPUs; without them each
    # integer add of a tile costs 5 more array operations for a check that is thrown away
    ti.interpreter_builder.options = dataclasses.replace(options, debug=debug, sanitize_overflow=debug)
    try:
        with running_kernel(kernel.fn.__name__):
            ti.interpreter_builder.set_grid_dim(*grid)
            for x in range(grid[0]):
                for y in range(grid[1]):
                    for z in range(grid[2]):
                        ti.interpreter_builder.set_grid_idx(x, y, z)
                        fn(**call_args)
    except Exception as e:
        raise _iris_cause(e) or e
    finally:
        _LAUNCH.patched = None
        ti.interpreter_builder.options = options
        patch_scope.restore()


# Triton's type names of pointer arguments (what triton.runtime.jit.mangle_type says)
_POINTER_TYPES = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "int8": "*i8",
                  "int16": "*i16", "int32": "*i32", "int64": "*i64", "uint8": "*u8", "uint16": "*u16",
                  "uint32": "*u32", "uint64": "*u64", "bool": "*u1"}


def _as_tensor(arg, ti):
    """A kernel argument as the interpreter's tensor. Pointers of the usual dtypes are built
    here: Triton's own conversion imports torch (~1.5 s in every fresh worker)."""
    if isinstance(arg, Pointer) and arg.dtype in _POINTER_TYPES:
        import triton.language as tl

        ty = tl.str_to_ty(_POINTER_TYPES[arg.dtype], None)
        return tl.tensor(ti.TensorHandle(np.array([arg.address], dtype=np.uint64), ty), ty)
    return ti._implicit_cvt(arg)


def _iris_cause(error: BaseException):
    """The iris error (NotOnHeapError, PeerTimeoutError, ...) that the interpreter wrapped
    in InterpreterErrors, one per call level, or None."""
    from iris_core.errors import IrisError

    while error is not None and not isinstance(error, IrisError):
        error = error.__cause__
    return error


class _NoPatches:
    def restore(self) -> None:
        pass


def _patch_interpreter(ti) -> None:
    """Wraps triton 3.6's language patching (once per process) for two reasons.

    Scalars: the interpreter holds them as 1-element arrays and converts them with int(),
    which numpy >= 2.4 refuses for arrays that are not 0-d, so `range(0, n, BLOCK)` over a
    scalar argument fails; __index__ takes the element instead.

    Speed: the interpreter patches the language again at every call of a @triton.jit helper
    (and never undoes it), an inspect.getmembers each time, and a collective kernel makes
    dozens of such calls per launch (RESULTS.md, "Simulator speed"). Inside a launch, a
    helper that sees the same language modules as the ones already patched gets nothing
    new from it, so it is skipped.
    """
    if getattr(ti._patch_lang, "_iris_fixed", False):
        return
    original = ti._patch_lang

    def patch_lang(fn):
        langs = _LANGS_OF.get(fn)
        if langs is None:  # the language modules a helper sees: its module's globals
            langs = _LANGS_OF[fn] = frozenset(
                id(v) for v in fn.__globals__.values() if isinstance(v, type(os)) and v in _LANGS)
        if _LAUNCH.patched is not None and langs <= _LAUNCH.patched:
            return _NoPatches()
        scope = original(fn)
        import triton.language as tl

        scope.set_attr(tl.core.tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
        if _LAUNCH.patched is not None:
            _LAUNCH.patched = _LAUNCH.patched | langs
        return scope

    import triton.language as tl

    _LANGS.extend([tl, tl.core])
    patch_lang._iris_fixed = True
    ti._patch_lang = patch_lang


class _Launch(threading.local):
    patched: frozenset | None = None  # ids of the language modules patched by the running launch


_LAUNCH = _Launch()
_LANGS: list = []
_LANGS_OF: dict = {}  # function -> ids of the language modules in its globals


def enable_interpreter() -> None:
    """Turns on Triton's interpreter for kernels defined from now on in this process."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        knobs.runtime.interpret = True


def pointer_to(array: np.ndarray) -> Pointer:
    return Pointer(array.ctypes.data, array.dtype)


def launch(kernel, grid: Sequence[int], *args, **constexprs) -> None:
    """`kernel[grid](*args, **constexprs)` on host memory: numpy arrays pass as pointers."""
    converted = [pointer_to(a) if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(kernel, grid, converted, constexprs)
