"""Runs a Triton kernel under the interpreter on raw host addresses.

Triton's own GridExecutor copies every tensor argument's whole storage to a host copy
and back; with heaps in shared memory that would copy a heap over itself and race with
peers writing into it. Here pointer arguments are plain addresses (`Pointer`), so the
kernel reads and writes the memory itself. Relies on the interpreter internals of the Triton
releases supported (3.6 to 3.9; the patches below handle where they differ).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import inspect
import itertools
import math
import os
import sys
import threading
from collections.abc import Sequence

import ml_dtypes
import numpy as np

from iris_core.errors import IrisError
from iris_core.sim import batched, language, positions, races, replay
from iris_core.sim.checks import running_kernel


class Pointer:
    """A typed raw address, accepted wherever a kernel expects a tensor argument."""

    def __init__(self, address: int, dtype, owner=None):
        self.address = int(address)
        self.dtype = _dtype_name(dtype)
        self._owner = owner  # the array the address points into, kept alive as long as the pointer

    def data_ptr(self) -> int:
        return self.address

    def __repr__(self):
        return f"Pointer(0x{self.address:x}, {self.dtype})"


@functools.lru_cache(maxsize=64)  # numpy's dtype.name is slow for the few dtypes a kernel's arguments have
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
    fn = kernel_function(kernel)
    cache = _INTERPRETED
    if fn not in cache:
        cache[fn] = InterpretedFunction(fn)
    return cache[fn]


def kernel_function(kernel):
    """The Python function of a @triton.jit kernel (through autotuner and heuristics wrappers)."""
    fn = getattr(kernel, "fn", None)
    while fn is not None and not inspect.isfunction(fn):
        fn = getattr(fn, "fn", None)
    if fn is None:
        raise TypeError(f"expected a @triton.jit kernel, got {type(kernel).__name__}")
    return fn


_INTERPRETED: dict = {}


def run_kernel(kernel, grid: Sequence[int], args: Sequence, constexprs: dict | None = None,
               debug: bool = False, detector: races.Detector | None = None) -> list[str]:
    """Runs `kernel[grid](*args, **constexprs)` under the interpreter, in this thread.

    Pointer arguments must be `Pointer`s (or anything with data_ptr() and dtype); Python
    scalars pass as scalars. Not thread-safe: the interpreter patches global state.
    `debug`: device-side assertions (tl.device_assert) raise, as they trap on GPUs for a
    kernel compiled with debug=True (the interpreter's own option is always off).
    `detector`: this rank's race detector (iris_core.sim.races), which sees every heap access
    of the launch. Returns the races it found (none without one).
    """
    from triton.runtime import interpreter as ti

    kernel = as_interpreted(kernel)
    fn = kernel.rewrite()
    call_args = _bind(kernel.fn, args, constexprs, ti)
    grid = _grid(grid)
    patch_interpreter(ti)
    key = _replay_key(kernel.fn, call_args) if replay.ENABLED and detector is None and not debug else None
    program = _PROGRAMS.get(key) if key is not None else None
    if program is not None:
        if isinstance(program, replay.Program):
            _replay(ti, kernel, program, grid, call_args)
            return []
        key = None
    kept = _LAUNCH.kept
    if not kept:
        _LAUNCH.patched = frozenset()
    patch_scope = ti._patch_lang(kernel.fn)  # (kept: patches only language modules new to this process)
    fast_scope = ti._LangPatchScope()
    if not kept:
        for obj, name, value in _FAST_LANGUAGE:
            fast_scope.set_attr(obj, name, value)
    elif not _LAUNCH.fast:
        for obj, name, value in _FAST_LANGUAGE:
            setattr(obj, name, value)
        _LAUNCH.fast = True
    if detector is not None:
        detector.begin(kernel.fn.__name__, grid[0] * grid[1] * grid[2])
        for obj, name, value in races.builder_patches(ti, detector):
            fast_scope.set_attr(obj, name, value)
    options = ti.interpreter_builder.options
    # overflow checks only matter where asserts fire (debug), as on GPUs; without them each
    # integer add of a tile costs 5 more array operations for a check that is thrown away
    ti.interpreter_builder.options = dataclasses.replace(options, debug=debug, sanitize_overflow=debug)
    positions.kernel_started(kernel.fn.__name__, fn.__code__)
    try:
        with running_kernel(kernel.fn.__name__):
            ti.interpreter_builder.set_grid_dim(*grid)
            for x in range(grid[0]):
                for y in range(grid[1]):
                    for z in range(grid[2]):
                        ti.interpreter_builder.set_grid_idx(x, y, z)
                        if detector is not None:
                            detector.begin_program(x, y, z)
                        if key is None:
                            fn(**call_args)
                            continue
                        with replay.Recorder(ti, call_args) as recorder:  # the launch's first program
                            fn(**call_args)
                        _PROGRAMS[key] = recorder.program() or recorder.why
                        key = None
    except Exception as e:
        raise _iris_cause(e) or e  # noqa: B904  (the iris error itself, as the kernel raised it)
    finally:
        positions.kernel_ended()
        ti.interpreter_builder.options = options
        fast_scope.restore()
        if not kept:
            _LAUNCH.patched = None
            patch_scope.restore()
        found = detector.end() if detector is not None else []
    return found


def _bind(fn, args: Sequence, constexprs: dict | None, ti) -> dict:
    """The arguments of the kernel function `fn` by name, as the interpreter takes them (tensors and constexprs)."""
    sig, names, is_constexpr = _parameters(fn)
    positional = names[:len(args)]
    if is_constexpr & set(positional):
        raise TypeError(
            f"kernel {fn.__name__}: constexpr parameters {sorted(is_constexpr & set(positional))} come "
            "before array or scalar parameters; put them last (jax-triton passes arrays, scalars and "
            "outputs positionally, constexprs by name)")
    bound = dict(zip(names, args))
    bound.update(constexprs or {})
    for name, param in sig.parameters.items():
        if name not in bound:
            if param.default is inspect.Parameter.empty:
                raise TypeError(f"kernel {fn.__name__} is missing argument {name!r}")
            bound[name] = param.default
    return {n: v if n in is_constexpr else _as_tensor(v, ti) for n, v in bound.items()}


def _grid(grid: Sequence[int]) -> tuple[int, int, int]:
    return tuple(int(g) for g in grid) + (1,) * (3 - len(grid))


def batched_form(kernel, args: Sequence, constexprs: dict | None = None) -> batched.BatchedProgram | None:
    """The batched form (iris_core.sim.batched) of the program this process kept for the kernel
    launched with `args`, or None: not recorded yet, not kept, or without one."""
    from triton.runtime import interpreter as ti

    fn = as_interpreted(kernel).fn
    key = _replay_key(fn, _bind(fn, args, constexprs, ti)) if replay.ENABLED else None
    program = _PROGRAMS.get(key) if key is not None else None
    if not isinstance(program, replay.Program):
        return None
    if program.batched is None:  # made once per program: the form, or why it has none
        try:
            program.batched = _prepared(ti, batched.BatchedProgram(*program.recording))
        except batched.NoRule as e:
            program.batched = f"no batched form for {e}"
    return program.batched if isinstance(program.batched, batched.BatchedProgram) else None


def _prepared(ti, form: batched.BatchedProgram) -> batched.BatchedProgram:
    """`form` compiled against this process's builder (patched as the recording's was) and helpers."""
    patch_interpreter(ti)
    return form.prepare(ti.InterpreterBuilder, ti.TensorHandle, _host_array, ti._get_np_dtype)


def run_kernel_batch(kernel, grid: Sequence[int], launches: Sequence[Sequence],
                     constexprs: dict | None = None) -> list[BaseException | None]:
    """Runs one kernel's launches of several ranks (each one's arguments, as run_kernel takes them)
    as one replay where this process kept its program and it has a batched form; else one launch
    after another (so only for kernels that wait for no other launch). Returns each launch's error, or None."""
    form = batched_form(kernel, launches[0], constexprs)
    errors = run_batched(form, kernel, grid, launches) if form is not None else None
    if errors is not None:
        return errors
    errors = []
    for args in launches:
        try:
            run_kernel(kernel, grid, args, constexprs)
            errors.append(None)
        except Exception as e:  # noqa: BLE001  (that launch's error, raised for its rank)
            errors.append(e)
    return errors


def run_batched(form: batched.BatchedProgram, kernel, grid: Sequence[int],
                launches: Sequence[Sequence]) -> list[BaseException | None] | None:
    """Runs several ranks' launches of `kernel` (each one's arguments, as run_kernel takes them) as
    one replay of its batched program `form`, in this thread (not thread-safe). The kernel's front end
    does not run: this process need not be interpreting. Returns each launch's error or None; None
    where the launches' argument types differ (each would have another program)."""
    from triton.runtime import interpreter as ti

    _prepared(ti, form)
    fn = kernel_function(kernel)
    inputs = _stacked_inputs(fn, form, launches, ti)
    if inputs is None:
        return None
    grid = _grid(grid)
    errors: list = [None] * len(launches)
    running = list(range(len(launches)))  # the launches whose rows `inputs` holds
    with _replaying(ti, fn.__name__, grid) as builder:
        for index in itertools.product(*map(range, grid)):
            if any(errors[i] is not None for i in running):  # a failed launch stopped
                keep = [j for j, i in enumerate(running) if errors[i] is None]
                running = [running[j] for j in keep]
                if not running:
                    break
                inputs = [ti.TensorHandle(h.data[keep], h.dtype) for h in inputs]
            builder.set_grid_idx(*index)
            for i, e in zip(running, form.run(builder, inputs, _TENSOR)):
                if e is not None:
                    errors[i] = _iris_cause(e) or e
    return errors


def _stacked_inputs(fn, form, launches: Sequence[Sequence], ti) -> list | None:
    """The batched program's inputs for every launch: each argument's values with the ranks'
    axis first; None where a launch's argument has another type than the recording's, or another
    value where the recording holds it as one (its program would be another)."""
    sig, names, _ = _parameters(fn)
    position = {name: i for i, name in enumerate(names)}
    baked = [i for i, name in enumerate(names[:len(launches[0])]) if name not in form.inputs]
    for args in launches[1:]:  # arguments the recording holds as values (Python floats): the same for all
        if any(type(args[i]) is not type(launches[0][i]) or args[i] != launches[0][i] for i in baked):
            return None
    inputs = []
    for name, (kind, handle_type) in zip(form.inputs, form.input_types):
        i = position[name]
        column = []
        for args in launches:
            value = args[i] if i < len(args) else sig.parameters[name].default
            if isinstance(value, Pointer) and value.dtype in _POINTER_TYPES:
                if _pointer_type_name(value.dtype) != kind:
                    return None
                column.append(np.array([value.address], np.uint64))
                continue
            found = _scalar(value, ti)
            if found[0] != kind:
                return None
            column.append(found[1])
        inputs.append(ti.TensorHandle(np.stack(column), handle_type))
    return inputs


@functools.cache
def _pointer_type_name(dtype: str) -> str:
    return str(_pointer_type(dtype))


def _scalar(value, ti) -> tuple[str, np.ndarray]:
    """A scalar argument's type name and value as the interpreter holds it (an int's remembered: a
    launch's scalars repeat, and the interpreter's conversion makes a language tensor)."""
    if type(value) is not int:  # (floats: -0.0 == 0.0 would share an entry)
        tensor = _as_tensor(value, ti)
        return str(tensor.type), tensor.handle.data
    key = value
    found = _SCALARS.get(key)
    if found is None:
        if len(_SCALARS) > 4096:
            _SCALARS.clear()
        tensor = _as_tensor(value, ti)
        found = _SCALARS[key] = (str(tensor.type), tensor.handle.data)
    return found


_SCALARS: dict = {}


def _replay_key(fn, call_args: dict):
    """What a kernel's recorded program holds for (iris_core.sim.replay): the kernel, its
    arguments' types and its constexprs' values (None: a constexpr that cannot be a key)."""
    try:
        key = (fn, *((n, str(v.type)) if isinstance(v, _TENSOR) else (n, v) for n, v in call_args.items()))
        hash(key)
    except TypeError:
        return None
    return key


def _replay(ti, kernel, program: replay.Program, grid: tuple, call_args: dict) -> None:
    """Runs a launch from its kernel's recorded program (iris_core.sim.replay)."""
    try:
        with _replaying(ti, kernel.fn.__name__, grid) as builder:
            for index in itertools.product(*map(range, grid)):
                builder.set_grid_idx(*index)
                program.run(builder, call_args, _TENSOR)
    except Exception as e:
        raise _iris_cause(e) or e  # noqa: B904


@contextlib.contextmanager
def _replaying(ti, name: str, grid: tuple):
    """The interpreter's builder set up for replays of kernel `name`'s recorded program over `grid`:
    debug off, and no check of each value's array against its type, which passed when the program
    was recorded (the same operations on the same types make the same arrays; a fifth of a small
    replay's time)."""
    builder = ti.interpreter_builder
    options = builder.options
    builder.options = _no_debug(options)
    checked = ti.TensorHandle.__post_init__
    ti.TensorHandle.__post_init__ = _unchecked
    try:
        with running_kernel(name):
            builder.set_grid_dim(*grid)
            yield builder
    finally:
        builder.options = options
        ti.TensorHandle.__post_init__ = checked


def _no_debug(options):
    if _NO_DEBUG[0] is not options:
        _NO_DEBUG[:] = [options, dataclasses.replace(options, debug=False, sanitize_overflow=False)]
    return _NO_DEBUG[1]


def _unchecked(handle) -> None:
    pass


_NO_DEBUG: list = [None, None]  # the builder's options, and them with debug off


_PROGRAMS: dict = {}  # _replay_key -> the kernel's recorded program, or why it is interpreted at every launch


@functools.lru_cache(maxsize=256)
def _parameters(fn) -> tuple[inspect.Signature, list[str], set[str]]:
    """A kernel function's signature, its parameters' names and those that are constexprs (read once:
    inspect.signature took a tenth of a small kernel's launch)."""
    sig = inspect.signature(fn)
    annotations = {k: str(v) for k, v in fn.__annotations__.items()}
    return sig, list(sig.parameters), {n for n in sig.parameters if "constexpr" in annotations.get(n, "")}


# Triton's type names of pointer arguments (what triton.runtime.jit.mangle_type says)
_POINTER_TYPES = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64", "int8": "*i8",
                  "int16": "*i16", "int32": "*i32", "int64": "*i64", "uint8": "*u8", "uint16": "*u16",
                  "uint32": "*u32", "uint64": "*u64", "bool": "*u1"}


def _as_tensor(arg, ti):
    """A kernel argument as the interpreter's tensor. Pointers of the usual dtypes are built
    here: Triton's own conversion imports torch (~1.5 s in every fresh worker)."""
    if isinstance(arg, Pointer) and arg.dtype in _POINTER_TYPES:
        import triton.language as tl

        ty = _pointer_type(arg.dtype)
        return tl.tensor(ti.TensorHandle(np.array([arg.address], dtype=np.uint64), ty), ty)
    return ti._implicit_cvt(arg)


@functools.cache
def _pointer_type(dtype: str):
    import triton.language as tl

    return tl.str_to_ty(_POINTER_TYPES[dtype], None)


def _iris_cause(error: BaseException):
    """The iris error (NotOnHeapError, PeerTimeoutError, ...) that the interpreter wrapped
    in InterpreterErrors, one per call level, or None."""
    while error is not None and not isinstance(error, IrisError):
        error = error.__cause__
    return error


class _NoPatches:
    def restore(self) -> None:
        pass


def patch_interpreter(ti) -> None:
    """Wraps the interpreter's language patching (once per process) for two reasons.

    Scalars: the interpreter holds them as 1-element arrays and converts them with int(),
    which numpy >= 2.4 refuses for arrays that are not 0-d, so `range(0, n, BLOCK)` over a
    scalar argument fails; __index__ takes the element instead.

    Speed: the interpreter patches the language again at every call of a @triton.jit helper
    (and never undoes it), an inspect.getmembers each time, and a collective kernel makes
    dozens of such calls per launch, which made small launches slow. Inside a launch, a
    helper that sees the same language modules as the ones already patched gets nothing
    new from it, so it is skipped; and a launch's patches are the same at every launch, so
    they are taken once and set again from that list.
    """
    if getattr(ti._patch_lang, "_iris_fixed", False):
        return
    original = ti._patch_lang

    def patch_lang(fn):
        langs = _LANGS_OF.get(fn)
        if langs is None:  # the language modules a helper sees: its module's globals
            langs = _LANGS_OF[fn] = frozenset(
                id(v) for v in fn.__globals__.values() if isinstance(v, type(os)) and v in _LANGS)
        if _LAUNCH.patched is None:
            return patched(fn)
        if langs <= _LAUNCH.patched:
            return _NoPatches()
        key = (langs, _LAUNCH.patched)
        _LAUNCH.patched = _LAUNCH.patched | langs
        if key not in _PATCHES:
            scope = patched(fn)
            _PATCHES[key] = [(obj, name, getattr(obj, name)) for obj, name, _ in scope._changes]
            return scope
        scope = ti._LangPatchScope()
        for obj, name, value in _PATCHES[key]:
            scope.set_attr(obj, name, value)
        return scope

    def patched(fn):
        scope = original(fn)
        import triton.language as tl

        scope.set_attr(tl.core.tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))
        scope.set_attr(tl.core.tensor, "__init__", _tensor_init(tl.core))
        return scope

    import triton.language as tl

    global _TENSOR
    _TENSOR = tl.core.tensor
    _LANGS.extend([tl, tl.core])
    _keep_freed_memory()
    patch_lang._iris_fixed = True
    ti._patch_lang = patch_lang
    ti._patch_attr = language.patch_attr(ti)
    _FAST_LANGUAGE.extend(language.launch_patches(tl.core))
    _patch_builder(ti)


def _keep_freed_memory() -> None:
    """Has glibc's malloc keep freed memory for reuse (once per interpreting process): every tile
    operation makes new arrays of up to a few MiB, which by default come as fresh pages from
    the kernel, mapped or above a trimmed heap top, and each page faults on its first write
    (a 4 MiB psum rank spent about half its CPU time so)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest: bigger arrays are still mapped
        libc.mallopt(_M_TRIM_THRESHOLD, 1 << 30)
    except (OSError, AttributeError):  # not glibc
        pass


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def _tensor_init(core):
    """tensor.__init__ as Triton's, with one shape tuple and element count per shape: Triton
    builds them (a constexpr per dimension, a language tuple and its type) for every value,
    a tenth of a launch's time."""
    shapes: dict = {}

    def init(self, handle, type):
        self.handle = handle
        self.type = type
        self.dtype = type.scalar
        shape = tuple(type.shape) if type.is_block() else ()  # plain ints: a language tuple hashes slowly
        if shape not in shapes:
            shapes[shape] = core.constexpr(math.prod(shape)), core.tuple([core.constexpr(s) for s in shape])
        self.numel, self.shape = shapes[shape]

    return init


def _patch_builder(ti) -> None:
    """Faster tile operations, with Triton's results. Its loads and stores move one element
    at a time in C++ (milliseconds for a tile of the simulator's size): a tile whose
    accessed lanes are one run of consecutive elements is copied as one slice instead, any
    other goes through Triton's own loop. Its dtype lookup builds a dict of dtypes at every
    call, its pointer arithmetic makes four passes over the offsets, and it fills a tile
    with a scalar wherever one meets a tile."""
    import triton.language as tl

    builder = ti.InterpreterBuilder
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store
    rmw, cas = builder.create_atomic_rmw, builder.create_atomic_cas
    np_dtype = ti._get_np_dtype
    np_dtypes: dict = {}

    def cached_np_dtype(tt_dtype):
        found = np_dtypes.get(tt_dtype.name)
        if found is None:
            found = np_dtypes[tt_dtype.name] = np_dtype(tt_dtype)
        return found

    # `*policy`: the cache arguments as this Triton passes them (3.6: cache_modifier, eviction_policy;
    # 3.9: cache_policy), handed on untouched
    def load(self, ptrs, mask, other, *policy):
        dtype_tt = ptrs.get_element_ty()
        if ptrs.data.size == 1 and ((policy and policy[-1]) or races.acquiring_now()):
            # a flag's read: perhaps a wait's poll (iris_core.sim.positions names it)
            out = masked_load(self, ptrs, _bool_mask(ti, mask), other, *policy)
            positions.note_read(int(ptrs.data.flat[0]), out.data.flat[0].item(), dtype_tt)
            return out
        dtype_np = cached_np_dtype(dtype_tt)
        run = _dense_run(ptrs.data, mask.data, dtype_np.itemsize)
        if run is None or (other is not None and other.data.dtype != dtype_np):
            return masked_load(self, ptrs, _bool_mask(ti, mask), other, *policy)
        address, lo, hi = run
        if other is None:
            out = np.zeros(ptrs.data.size, dtype_np)
        else:
            out = np.broadcast_to(other.data, ptrs.data.shape).reshape(-1).copy()
        out[lo:hi] = _host_array(address, hi - lo, dtype_np)
        return ti.TensorHandle(out.reshape(ptrs.data.shape), dtype_tt)

    def store(self, ptrs, value, mask, *policy):
        run = _dense_run(ptrs.data, mask.data, value.data.itemsize)
        if run is None or value.data.itemsize != max(1, ptrs.get_element_ty().primitive_bitwidth // 8):
            return masked_store(self, ptrs, value, _bool_mask(ti, mask), *policy)
        address, lo, hi = run
        values = np.broadcast_to(value.data, ptrs.data.shape).reshape(-1)
        _host_array(address, hi - lo, values.dtype)[:] = values[lo:hi]

    def atomic_rmw(self, op, ptr, value, mask, *order):
        out = rmw(self, op, ptr, value, _bool_mask(ti, mask), *order)
        if ptr.data.size == 1:
            positions.note_read(int(ptr.data.flat[0]), out.data.flat[0].item(), ptr.get_element_ty())
        return out

    def atomic_cas(self, ptr, compare, value, *order):
        out = cas(self, ptr, compare, value, *order)
        if ptr.data.size == 1:
            positions.note_read(int(ptr.data.flat[0]), out.data.flat[0].item(), ptr.get_element_ty())
        return out

    def addptr(self, ptr, offset):
        # as Triton's (offsets wrap to uint64, times the element size), in one or two array passes, not four
        element_bytes = max(1, ptr.get_element_ty().primitive_bitwidth // 8)
        if element_bytes == 1:
            return ti.TensorHandle(np.add(offset.data, ptr.data, dtype=np.uint64, casting="unsafe"), ptr.dtype)
        address = np.multiply(offset.data, element_bytes, dtype=np.uint64, casting="unsafe")
        if address.shape == ptr.data.shape or (ptr.data.size == 1 and address.ndim >= ptr.data.ndim):
            return ti.TensorHandle(np.add(address, ptr.data, out=address), ptr.dtype)
        return ti.TensorHandle(address + ptr.data, ptr.dtype)

    splat = builder.create_splat
    shapes: dict = {}  # a block type's name -> its shape and element count

    def broadcast(self, ret_ty, arg):
        # a read-only view instead of a filled tile: every operation makes a new array
        known = shapes.get(ret_ty.name)
        if known is None:
            shape = tuple(int(s) for s in ret_ty.shape)
            known = shapes[ret_ty.name] = shape, math.prod(shape)
        shape, count = known
        if count < _DENSE_MIN:
            return splat(self, ret_ty, arg)
        dtype = cached_np_dtype(arg.dtype)
        view = np.ndarray(shape, dtype, arg.data.reshape(-1)[:1].astype(dtype), 0, (0,) * len(shape))
        view.flags.writeable = False
        return ti.TensorHandle(view, arg.dtype.scalar)

    cast = builder.cast_impl

    def cast_rounded(self, src, dst_type):
        # bfloat16 (held as uint16 here) converted as a GPU converts it, rounding to nearest even:
        # Triton's interpreter truncates float32 -> bfloat16 and reinterprets other types' bits
        if tl.bfloat16 not in (src.dtype.scalar, dst_type.scalar):
            return cast(self, src, dst_type)
        data = src.data.view(ml_dtypes.bfloat16) if src.dtype.scalar == tl.bfloat16 else src.data
        if dst_type.scalar == tl.bfloat16:
            return ti.TensorHandle(data.astype(ml_dtypes.bfloat16).view(np.uint16), dst_type.scalar)
        return ti.TensorHandle(data.astype(cached_np_dtype(dst_type.scalar)), dst_type.scalar)

    ti._get_np_dtype = cached_np_dtype
    builder.cast_impl = cast_rounded
    # tl.maximum / tl.minimum without propagate_nan: a NaN loses, as in the GPU's max.f32 (and in
    # NCCL's and XLA:CPU's reductions); Triton's interpreter let it win, like propagate_nan=ALL
    builder.create_maxnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmax)
    builder.create_minnumf = lambda self, lhs, rhs: self.binary_op(lhs, rhs, np.fmin)
    builder.create_masked_load, builder.create_masked_store = load, store
    builder.create_atomic_rmw, builder.create_atomic_cas = atomic_rmw, atomic_cas
    builder.create_addptr, builder.create_splat = addptr, broadcast


def _bool_mask(ti, mask):
    """`mask` with bool data: Triton 3.9's C++ loads, stores and atomics refuse any other, and a
    scalar comparison broadcast and combined with a tile can carry integer 0/1 data."""
    if mask.data.dtype == np.bool_:
        return mask
    return ti.TensorHandle(mask.data != 0, mask.dtype)


_DENSE_MIN = 256  # elements: smaller tiles (flags, scalars) keep Triton's own loop


def _dense_run(ptrs: np.ndarray, mask: np.ndarray, itemsize: int):
    """(address, lo, hi) when the lanes in `mask` are exactly lanes [lo, hi) of the flat tile
    and their pointers consecutive aligned elements from `address` (hi == lo: none); else None.
    Only those lanes are touched, as in Triton's loop: the others may point anywhere."""
    if ptrs.size < _DENSE_MIN or mask.shape != ptrs.shape:
        return None
    flat, lanes = ptrs.reshape(-1), mask.reshape(-1)
    lo, hi = 0, flat.size
    if not lanes.all():
        lo = int(lanes.argmax())
        if not lanes[lo]:
            return 0, 0, 0
        hi = flat.size - int(lanes[::-1].argmax())
        if not lanes[lo:hi].all():
            return None
    address = int(flat[lo])
    if address % itemsize or int(flat[hi - 1]) - address != (hi - 1 - lo) * itemsize:
        return None
    if not np.array_equal(flat[lo:hi] - np.uint64(address), _steps(hi - lo, itemsize)):
        return None
    return address, lo, hi


@functools.lru_cache(maxsize=32)
def _steps(count: int, itemsize: int) -> np.ndarray:
    return np.arange(0, count * itemsize, itemsize, dtype=np.uint64)


def _host_array(address: int, count: int, dtype) -> np.ndarray:
    """`count` elements of host memory at `address` as a numpy array (no copy)."""
    return np.frombuffer((ctypes.c_char * (count * dtype.itemsize)).from_address(address), dtype)


class _Launch(threading.local):
    patched: frozenset | None = None  # ids of the language modules patched by the running launch
    kept = False  # keep_language_patched(): the language stays patched between launches
    fast = False  # ... and _FAST_LANGUAGE is set


_LAUNCH = _Launch()
_TENSOR = None  # triton.language.core.tensor (set by patch_interpreter)
_LANGS: list = []
_FAST_LANGUAGE: list = []  # (object, name, value) set during a launch (iris_core.sim.language)
_LANGS_OF: dict = {}  # function -> ids of the language modules in its globals
_PATCHES: dict = {}  # (modules to patch, modules patched before) -> [(object, name, value set)]


def keep_language_patched() -> None:
    """Leaves Triton's language patched for the interpreter after each launch, in this thread's
    launches from now on (a simulated rank's worker, which runs nothing else: patching and
    restoring it took a sixth of a small kernel's launch there). Elsewhere the patches would
    change triton.language for code that is not a kernel."""
    _LAUNCH.kept = True
    if _LAUNCH.patched is None:
        _LAUNCH.patched = frozenset()


def enable_interpreter() -> None:
    """Turns on Triton's interpreter for kernels defined from now on in this process."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton

    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        knobs.runtime.interpret = True


def pointer_to(array: np.ndarray) -> Pointer:
    """A Pointer to `array`'s data (which it keeps alive)."""
    return Pointer(array.ctypes.data, array.dtype, owner=array)


def launch(kernel, grid: Sequence[int], *args, **constexprs) -> None:
    """`kernel[grid](*args, **constexprs)` on host memory: numpy arrays pass as pointers."""
    converted = [pointer_to(a) if isinstance(a, np.ndarray) else a for a in args]
    run_kernel(kernel, grid, converted, constexprs)
