"""CPU lowering of Triton kernel calls: run them under Triton's interpreter.

Registered for both `iris_triton_call` and jax-triton's own `triton_kernel_call`, so a
plain `jax_triton.triton_call` kernel also runs on CPU. Each call site becomes an FFI
custom call (see _ffi) that XLA invokes on the device's thread with buffer pointers; its
first operand is the device's context row, which names the rank.

* simulator worker mode (one process, N CPU devices): the kernel runs in its rank's
  worker process. Heap buffers travel as (rank, offset), since the worker maps the heaps
  at other addresses; XLA's buffers are staged through a per-rank shared-memory area.
  The worker rebuilds the context with its own heap bases and the row's tracing words
  (heap offsets, the same in every process).
* launched mode (one rank per process): the kernel runs here, on the real pointers.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import mmap
import os
import threading
import uuid
import warnings
import weakref
from dataclasses import dataclass

import jax
import numpy as np
from jax._src import source_info_util
from jax.interpreters import mlir

from iris_core.errors import NotOnHeapError, PeerTimeoutError, RankDivergenceWarning, RankMismatchError
from iris_core.heap.context_layout import context_words, trace_offset
from iris_core.heap.shared_memory import SHM_DIR
from iris_core.sim import call_table
from iris_core.sim.interpreter import Pointer, run_kernel
from iris_jax import _runtime as runtime_lib
from iris_jax._ffi import register_cpu_target
from iris_jax.call import iris_triton_call_p
from iris_jax.operands import extra_operands
from iris_jax.cpu_autotune import resolve_kernel

_CALL_PARAMS = {"name", "custom_call_target_name", "num_warps", "num_stages", "num_ctas",
                "compute_capability", "enable_fp_fusion", "debug", "serialized_metadata"}
_interpreter_lock = threading.Lock()
_ALIGN = 256


@dataclass(frozen=True)
class KernelSpec:
    """What the executor needs about one call site besides the buffer pointers."""

    kernel: object
    grid: tuple
    scalars: tuple  # (position among the kernel's arguments, value), ascending
    constexprs: dict
    operand_dtypes: tuple  # array operands after the context row
    operand_nbytes: tuple
    result_dtypes: tuple
    result_nbytes: tuple
    zeroed: tuple  # result indices to zero before the launch
    symmetric: tuple  # operand indices that must lie on this rank's heap
    pass_context: bool  # the kernel's first argument is the context
    runtime: weakref.ref  # the runtime whose heaps the lowering saw (its context rows are constants)
    group_nbytes: int = 0  # >0: the kernel's second argument is the group row (collectives)
    ordered_after: int = 0  # trailing operands that only order this call after the previous one
    debug: bool = False  # triton_call(debug=True): device-side assertions raise
    signature: int = 0  # group kernels: what the ranks' records of a call must agree on (call_table)
    what: str = ""  # ... and how the call is named to the user
    site: tuple = ()  # ... and where the user's program made it: its frames, innermost first ("file.py:12")

    @property
    def group(self) -> bool:
        return self.group_nbytes > 0


def _lower(ctx, operands, avals_in, *, pass_context, fn, scalar_args, out_shapes, grid,
           input_output_aliases, zeroed_outputs, symmetric=(), group_axes=None, workspace="collective", **params):
    from jax_triton.triton_lib import normalize_grid

    metaparams = {k: v for k, v in params.items() if k not in _CALL_PARAMS}
    group = 1 if group_axes else 0
    scalars = tuple(sorted((i + group, v) for i, _, v in scalar_args))
    extra, extra_avals = extra_operands(ctx, group_axes, workspace)
    launch = _resolve(fn, extra_avals if pass_context else [], avals_in, scalars, ctx.avals_out, metaparams,
                      input_output_aliases, pass_context)
    zeroed = zeroed_outputs(launch.constexprs) if callable(zeroed_outputs) else zeroed_outputs
    zeroed = sorted({*zeroed, *launch.reset_outputs})
    spec = KernelSpec(
        kernel=launch.kernel, grid=tuple(normalize_grid(grid, launch.constexprs)),
        scalars=scalars, constexprs=launch.constexprs,
        operand_dtypes=tuple(np.dtype(a.dtype) for a in avals_in),
        operand_nbytes=tuple(_nbytes(a) for a in avals_in),
        result_dtypes=tuple(np.dtype(s.dtype) for s in out_shapes),
        result_nbytes=tuple(_nbytes(s) for s in out_shapes),
        zeroed=tuple(zeroed), symmetric=tuple(symmetric), pass_context=pass_context,
        runtime=weakref.ref(runtime_lib.runtime()), debug=bool(params.get("debug", False)))
    if group_axes:
        spec = dataclasses.replace(spec, group_nbytes=_nbytes(extra_avals[1]), site=_site(ctx),
                                   **_signature(spec, avals_in))
    # the custom call's operands are [context row, group row?, *operands, previous result?]
    offset = len(extra) - (1 if pass_context else 0)
    aliases = {i + offset: o for i, o in input_output_aliases}
    previous = _previous_call(ctx)
    if previous is not None:
        spec = dataclasses.replace(spec, ordered_after=1)
    name = register_cpu_target("iris_cpu_kernel", lambda ins, outs: execute(spec, ins, outs))
    tail, tail_avals = ([previous[0]], [previous[1]]) if previous is not None else ([], [])
    call_ctx = ctx.replace(avals_in=[*extra_avals, *avals_in, *tail_avals])
    results = jax.ffi.ffi_lowering(name, operand_output_aliases=aliases, has_side_effect=True)(
        call_ctx, *extra, *operands, *tail)
    if results:
        _remember_call(ctx, results[0], ctx.avals_out[0])
    return results


def _signature(spec: KernelSpec, avals_in) -> dict:
    """A group kernel's signature and name (see iris_core.sim.call_table)."""
    what = spec.constexprs.get("WHAT") or _kernel_name(spec)
    shapes = ", ".join(f"{np.dtype(a.dtype).name}{list(a.shape)}" for a in avals_in)
    stable = {k: _stable(v) for k, v in sorted(spec.constexprs.items())}
    key = (_kernel_name(spec), stable, spec.scalars, spec.grid, spec.operand_nbytes, spec.result_nbytes,
           [str(d) for d in spec.operand_dtypes])
    return {"signature": call_table.digest(key), "what": f"iris {what} of ({shapes})"}


_enclosing_site: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("iris_call_site", default=None)


@contextlib.contextmanager
def calls_made_at(ctx):
    """The kernel calls lowered inside this block were made at `ctx`'s line (a collective's
    rule lowers its kernels through lower_fun, whose tracebacks start at the rule)."""
    token = _enclosing_site.set(_user_frames(ctx.traceback))
    try:
        yield
    finally:
        _enclosing_site.reset(token)


def _site(ctx) -> tuple[str, ...]:
    """Where the user's program made this call: its frames ("file.py:12"), innermost first
    (all of them: a helper that wraps the collective is one frame of several)."""
    enclosing = _enclosing_site.get()
    return enclosing if enclosing is not None else _user_frames(ctx.traceback)


def _user_frames(traceback) -> tuple[str, ...]:
    # iris's own frames are not the user's: iris_jax registers them with JAX as library code
    return tuple(f"{os.path.basename(f.file_name)}:{f.start_line}" for f in source_info_util.user_frames(traceback))


def _stable(value):
    """`value` as a repr that is the same in every process (no object addresses)."""
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return tuple(_stable(v) for v in value)
    return f"{type(value).__name__}:{getattr(value, '__name__', None) or str(value).split(' at 0x')[0]}"


def _resolve(fn, lead_avals, avals_in, scalars, avals_out, metaparams, input_output_aliases, pass_context):
    """`fn`'s autotuners and heuristics resolved against the kernel's arguments in launch order
    (see _kernel_args): lead (context, group row), array operands with scalars at their positions."""
    scalar_at = dict(scalars)
    arrays = iter([*lead_avals, *avals_in])
    count = len(lead_avals) + len(avals_in) + len(scalars)
    args = [scalar_at[p] if p in scalar_at else next(arrays) for p in range(count)]
    array_at = [p for p in range(count) if p not in scalar_at]
    # iris_triton_call numbers its operands after the device index (hence - pass_context)
    aliases = {array_at[len(lead_avals) + i - pass_context]: o for i, o in input_output_aliases}
    return resolve_kernel(fn, args, avals_out, metaparams, aliases)


# XLA:CPU starts independent operations as soon as their inputs are ready, so two kernel
# calls with no data dependency (two collectives over independent arrays) could run in a
# different order on different devices and pair up wrongly. Each kernel call therefore
# takes the previous call of the same block as an extra, ignored operand: calls run in
# program order on every device. (GPUs execute one stream in program order already.)
_last_call: dict = {}


def _previous_call(ctx):
    block = mlir.ir.InsertionPoint.current.block
    entry = _last_call.get(_module_key(ctx))
    if entry is None or entry[0] != block:
        return None
    return entry[1], entry[2]


def _remember_call(ctx, value, aval) -> None:
    if len(_last_call) > 64:  # modules lowered long ago: their values are dead
        _last_call.clear()
    _last_call[_module_key(ctx)] = (mlir.ir.InsertionPoint.current.block, value, aval)


def _module_key(ctx):
    return id(ctx.module_context.module)


def _nbytes(aval) -> int:
    return int(np.dtype(aval.dtype).itemsize * np.prod(aval.shape, dtype=np.int64))


def _iris_lowering(ctx, device_index, *args, fn, **params):
    del device_index  # carries the outputs' varying axes; the row comes from partition_id
    return _lower(ctx, args, ctx.avals_in[1:], pass_context=True, fn=fn, **params)


def _jax_triton_lowering(ctx, *args, fn, **params):
    return _lower(ctx, args, ctx.avals_in, pass_context=False, fn=fn, **params)


def register() -> None:
    """Registers the CPU lowerings (idempotent; done on import of iris_jax)."""
    from jax_triton.triton_lib import triton_kernel_call_p

    # not cacheable: every call site is lowered on its own, so it can be chained to the previous one
    mlir.register_lowering(iris_triton_call_p, _iris_lowering, platform="cpu", cacheable=False)
    mlir.register_lowering(triton_kernel_call_p, _jax_triton_lowering, platform="cpu", cacheable=False)


# -- execution --------------------------------------------------------------------------
def execute(spec: KernelSpec, ins: list[int], outs: list[int]) -> None:
    rt = spec.runtime()
    if rt is None:
        raise runtime_lib.stale_program_error(f"kernel {_kernel_name(spec)}")
    with rt.running_call(f"kernel {_kernel_name(spec)}"):
        _execute(rt, spec, ins, outs)


def _execute(rt, spec: KernelSpec, ins: list[int], outs: list[int]) -> None:
    row_ptr = ins[0]
    group_ptr = ins[1] if spec.group else None
    operand_ptrs = ins[1 + spec.group:len(ins) - spec.ordered_after]
    rank = ctypes.c_int64.from_address(row_ptr).value
    for j in spec.symmetric:
        where = rt.heap.locate(operand_ptrs[j])
        if where is None or where[0] != rank or where[1] + spec.operand_nbytes[j] > rt.heap_size:
            raise NotOnHeapError(
                f"operand {j} of kernel {_kernel_name(spec)} is declared symmetric but is not on "
                f"rank {rank}'s heap (inside jit it was copied or computed); pass an array made by "
                "iris_jax (zeros, to_heap, ...) straight into the jitted function. Nothing was run.")
    call = members = None
    if spec.group and rt.call_table is not None:
        row = np.frombuffer(ctypes.string_at(group_ptr, spec.group_nbytes), np.int32)
        members = [int(m) for m in row[1:-2]]  # row: [my index, members..., workspace offset (2 words)]
        call = rt.call_table.begin(rank, call_table.digest(row[1:].tolist()), spec.signature, spec.what, spec.site)
    try:
        rt.backend.execute(rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs)  # here or in rank's worker
    except PeerTimeoutError as e:  # a mismatch can also make the kernels wait for each other
        problem = call and rt.call_table.mismatch(call, members)
        if problem:
            raise RankMismatchError(problem) from e
        behind = call and rt.call_table.behind(call, members)
        if behind:
            raise PeerTimeoutError(f"{e}\n{behind}") from e
        raise
    problem = call and rt.call_table.mismatch(call, members)
    if problem:
        raise RankMismatchError(problem)
    divergence = call and rt.call_table.divergence(call, members)
    if divergence:
        warnings.warn(f"rank {rank}: {divergence}", RankDivergenceWarning, stacklevel=1)


def _kernel_name(spec) -> str:
    return getattr(getattr(spec.kernel, "fn", None), "__name__", str(spec.kernel))


def _kernel_args(spec: KernelSpec, context, group, operands: list, results: list) -> list:
    args = ([context] if spec.pass_context else []) + ([group] if spec.group else []) + operands
    for position, value in spec.scalars:
        args.insert(position, value)
    return args + results


def execute_here(spec, row_ptr, group_ptr, operand_ptrs, outs):
    """Runs the kernel in this process, on XLA's pointers (a launched rank)."""
    for i in spec.zeroed:
        ctypes.memset(outs[i], 0, spec.result_nbytes[i])
    operands = [Pointer(p, d) for p, d in zip(operand_ptrs, spec.operand_dtypes)]
    results = [Pointer(p, d) for p, d in zip(outs, spec.result_dtypes)]
    with _interpreter_lock:
        group = Pointer(group_ptr, np.int32) if spec.group else None
        run_kernel(spec.kernel, spec.grid,
                   _kernel_args(spec, Pointer(row_ptr, np.int32), group, operands, results), spec.constexprs,
                   debug=spec.debug)


def execute_in_worker(rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs):
    """Runs the kernel in rank's worker process, XLA's buffers staged through shared memory."""
    trace_words = _trace_words(row_ptr, rt.world_size)
    staging = rt.service("cpu_staging", lambda _: StagingAreas()).for_rank(rank)
    with staging.lock:
        layout: dict[int, int] = {}  # pointer -> staged offset
        needed = 0

        def place(ptr, nbytes):
            nonlocal needed
            if ptr not in layout:
                layout[ptr] = needed
                needed += (nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
            return layout[ptr]

        def describe(ptr, nbytes, dtype, copy_in):
            where = rt.heap.locate(ptr) if nbytes else None
            if where is not None:
                return ("heap", where[0], where[1], dtype)
            return ("staged", place(ptr, nbytes), dtype, copy_in)

        operands = [describe(p, n, d, True) for p, n, d in
                    zip(operand_ptrs, spec.operand_nbytes, spec.operand_dtypes)]
        results = [describe(p, n, d, False) for p, n, d in zip(outs, spec.result_nbytes, spec.result_dtypes)]
        group = describe(group_ptr, spec.group_nbytes, np.dtype(np.int32), True) if spec.group else None
        area = staging.ensure(needed)
        if group is not None:
            ctypes.memmove(area.address + group[1], group_ptr, spec.group_nbytes)
        for desc, ptr, nbytes in zip(operands, operand_ptrs, spec.operand_nbytes):
            if desc[0] == "staged" and nbytes:
                ctypes.memmove(area.address + desc[1], ptr, nbytes)
        for i in spec.zeroed:
            ctypes.memset(area.address + results[i][1], 0, spec.result_nbytes[i])
        args = _kernel_args(spec, ("context", trace_words), group, operands, results)
        rt.sim_world.call(rank, _run_in_worker, rt.heap.session, area.path, area.size, spec.kernel,
                          spec.grid, args, spec.constexprs, rank, spec.debug, what=f"kernel {_kernel_name(spec)}")
        for desc, ptr, nbytes in zip(results, outs, spec.result_nbytes):
            if nbytes:
                ctypes.memmove(ptr, area.address + desc[1], nbytes)


def _trace_words(row_ptr: int, world_size: int) -> tuple[int, ...]:
    """The tracing words of the context row XLA passed: heap offsets, valid in the worker
    too (its heap bases differ; see iris_core.tracing.buffers)."""
    words = (ctypes.c_uint64 * context_words(world_size)).from_address(row_ptr)
    return tuple(words[trace_offset(world_size):])


def _run_in_worker(state, session, area_path, area_size, kernel, grid, args, constexprs, rank, debug=False):
    heap = state.heaps[session]
    areas = state.cache.setdefault("staging", {})
    if areas.get(rank, (None,))[0] != area_path:
        fd = os.open(area_path, os.O_RDWR)
        try:
            mapping = mmap.mmap(fd, area_size)
        finally:
            os.close(fd)
        buffer = np.frombuffer(mapping, np.uint8)
        areas[rank] = (area_path, mapping, buffer)
    base = int(areas[rank][2].ctypes.data)
    trace_words = next((a[1] for a in args if isinstance(a, tuple) and a[0] == "context"), ())
    context = heap.context(rank, trace_words)

    def resolve(arg):
        if not isinstance(arg, tuple):
            return arg
        if arg[0] == "context":
            return Pointer(context.ctypes.data, np.int32)
        if arg[0] == "heap":
            return Pointer(heap.address(arg[1], arg[2]), arg[3])
        return Pointer(base + arg[1], arg[2])

    run_kernel(kernel, grid, [resolve(a) for a in args], constexprs, debug=debug)


class _Area:
    def __init__(self, size: int):
        self.size = size
        self.path = os.path.join(SHM_DIR, f"iris-staging-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            self.mapping = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self.buffer = np.frombuffer(self.mapping, np.uint8)
        self.address = int(self.buffer.ctypes.data)

    def close(self):
        self.buffer = None
        try:
            self.mapping.close()
        except BufferError:
            pass
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


class _RankStaging:
    def __init__(self):
        self.lock = threading.Lock()
        self.area: _Area | None = None

    def ensure(self, nbytes: int) -> _Area:
        if self.area is None or self.area.size < nbytes:
            if self.area is not None:
                self.area.close()
            self.area = _Area(max(1 << 20, 1 << max(nbytes - 1, 1).bit_length()))
        return self.area


class StagingAreas:
    """Per-rank shared-memory areas through which XLA's buffers reach the workers."""

    def __init__(self):
        self._ranks: dict[int, _RankStaging] = {}
        self._lock = threading.Lock()

    def for_rank(self, rank: int) -> _RankStaging:
        with self._lock:
            return self._ranks.setdefault(rank, _RankStaging())

    def close(self):
        for staging in self._ranks.values():
            if staging.area is not None:
                staging.area.close()
