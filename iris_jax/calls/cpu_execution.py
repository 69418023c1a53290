"""Running the simulator's kernel calls (lowered by iris_jax.calls.cpu_lowering) under Triton's interpreter.

* one process, N CPU devices (SimulatorWorkers): the kernel runs in its rank's worker
  process. Heap buffers travel as (rank, offset), since the worker maps the heaps at other
  addresses; XLA's buffers are staged through a per-rank shared-memory area. The worker
  rebuilds the context with its own heap bases and the row's tracing words (heap offsets,
  the same in every process).
* a launched rank (SimulatorLaunched): the kernel runs here, on the real pointers.

Calls of the collective kernel whose ranks are all in this process skip the interpreter (unless
init(sim_collectives="kernels"), the race detector or device tracing asks for it): the ranks
meet in this process and combine with numpy (iris_core.sim.host_collectives), on XLA's buffers.

The ranks' launches of another kernel (a user's) may meet and run as one batched replay
(iris_jax.calls.kernel_batches).

Either way a group kernel's call is first checked against the heap (symmetric operands) and
recorded in the call table, and after it (or when it timed out) compared with the other
members' records (iris_core.sim.call_table).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import uuid
import warnings
import weakref
from dataclasses import dataclass, replace

import numpy as np

from iris_core.collectives import group_layout, kinds, ragged
from iris_core.collectives import kernels as collective_kernels
from iris_core.errors import IrisError, NotOnHeapError, PeerTimeoutError, RankDivergenceWarning, RankMismatchError
from iris_core.heap.context_layout import TRACE_WORDS, context_words, trace_offset
from iris_core.heap.shared_memory import SHM_DIR
from iris_core.sim import call_table, host_collectives, races, world
from iris_core.sim.interpreter import Pointer, batched_form, run_batched, run_kernel
from iris_jax import _runtime as runtime_lib
from iris_jax.calls import kernel_batches
from iris_jax.calls.triton_call import kernel_arguments

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
    result_params: tuple  # the results passed to the kernel, in order (jax-triton 0.4 passes no aliased one)
    symmetric: tuple  # operand indices that must lie on this rank's heap
    pass_context: bool  # the kernel's first argument is the context
    runtime: weakref.ref  # the runtime whose heaps the lowering saw (its context rows are constants)
    group_nbytes: int = 0  # >0: the kernel's second argument is the group row (collectives)
    ordered_after: int = 0  # trailing operands that only order this call after the previous one
    debug: bool = False  # triton_call(debug=True): device-side assertions raise
    signature: int = 0  # group kernels: what the ranks' records of a call must agree on (call_table)
    what: str = ""  # ... and how the call is named to the user
    site: tuple = ()  # ... and where the user's program made it: its frames, innermost first ("file.py:12")
    host: host_collectives.Collective | None = None  # a collective the host can run in the kernel's place
    ranks: tuple = ()  # the ranks of the computation, all launching this call (kernel_batches)

    @property
    def group(self) -> bool:
        return self.group_nbytes > 0

    @property
    def kernel_name(self) -> str:
        return getattr(getattr(self.kernel, "fn", None), "__name__", str(self.kernel))




def execute(spec: KernelSpec, ins: list[int], outs: list[int]) -> None:
    rt = spec.runtime()
    if rt is None:
        raise runtime_lib.stale_program_error(f"kernel {spec.kernel_name}")
    if rt.backend.host_kernels is None:
        raise IrisError(f"kernels of the {rt.mode} model run on GPUs, not on the host (internal error)")
    with rt.running_call(f"kernel {spec.kernel_name}"):  # shutdown waits for it (the call records are on the heaps)
        if rt.fault_plan is not None:
            spec = _as_planned(rt.fault_plan, spec, ctypes.c_int64.from_address(ins[0]).value)
        if spec.host is not None and runs_collectives_here(rt):
            _execute_on_host(rt, spec, ins, outs)
        else:
            _execute(rt, spec, ins, outs)


def _as_planned(plan, spec: KernelSpec, rank: int) -> KernelSpec:
    """The call as the injected faults make it on `rank` (iris_jax._runtime.injected): raises for a
    dead rank, waits for a late one, and a disagreeing call records another signature."""
    tag = plan.before_call(rank, spec.what or f"kernel {spec.kernel_name}")
    if tag is None:
        return spec
    return replace(spec, signature=spec.signature ^ 0x5EED, what=(spec.what or spec.kernel_name) + tag)


def _execute_on_host(rt, spec: KernelSpec, ins: list[int], outs: list[int]) -> None:
    """A collective call run on the host (iris_core.sim.host_collectives), checked and named as a kernel's."""
    rank = ctypes.c_int64.from_address(ins[0]).value
    group = group_row(rt, ins[1], spec.group_nbytes)
    call = rt.call_table and rt.call_table.begin(rank, group.key, spec.signature, spec.what, spec.site)
    rendezvous = rt.service("host_collectives", lambda _: host_collectives.Rendezvous())
    operands = ins[2:len(ins) - spec.ordered_after]
    detector = race_detector(rt, rank)
    if detector is not None:
        _host_reads(detector, spec, operands, outs)
    met = False
    try:
        sites_differ = rendezvous.run(spec.host, group.key, group.members, group.index, spec.signature,
                                      call.site if call else 0,  # (the call record's digest of the site)
                                      host_buffers(spec, operands, outs), workspace=group.workspace,
                                      clock=None if detector is None else detector.vc)
        met = True
    except (PeerTimeoutError, RankMismatchError) as e:
        named = named_fault(rt, call, group.members, e)
        if named is e:
            raise
        raise named from e
    finally:
        if detector is not None and not met:
            detector.end()  # the launch is over, as a kernel's is when it fails (its reports go with it)
    if detector is not None:
        _host_writes(detector, spec, outs)
        found = detector.end()
        if found:
            races.emit(rt.detect_races, found, spec.kernel)
    divergence = sites_differ and call and rt.call_table.divergence(call, group.members)
    if divergence:
        warnings.warn(f"rank {rank}: {divergence}", RankDivergenceWarning, stacklevel=1)


def _host_reads(detector, spec: KernelSpec, operands: list[int], outs: list[int]) -> None:
    """What the race detector sees of a collective run on the host, before the members meet (which
    joins their clocks: host_collectives.Rendezvous): a launch begins and the member reads its
    operands, where they lie on a heap, at the line of the program that made the call. The kernel's
    own workspace traffic is ordered by its flags and is left out (sim_collectives="kernels" checks
    the kernels themselves)."""
    detector.begin(spec.what or spec.kernel_name)
    for address, nbytes, dtype in zip(operands, spec.operand_nbytes, spec.operand_dtypes):
        if address not in outs:  # (ragged_all_to_all's output operand: written, _host_writes)
            detector.access_range(address, nbytes, dtype.itemsize, races.LOAD, _program_line(spec))


def _host_writes(detector, spec: KernelSpec, outs: list[int]) -> None:
    """... and after they met: the member writes its results."""
    for address, nbytes, dtype in zip(outs, spec.result_nbytes, spec.result_dtypes):
        detector.access_range(address, nbytes, dtype.itemsize, races.STORE, _program_line(spec))


def _program_line(spec: KernelSpec) -> str | None:
    return spec.site[0] if spec.site else None


def named_fault(rt, call, members, error: Exception) -> Exception:
    """A timeout or mismatch with what the call records say of it: the members' calls that differ,
    or the members that made fewer calls of the group and where their calls parted."""
    problem = call and rt.call_table.mismatch(call, members)
    if problem:
        return RankMismatchError(problem)
    behind = call and isinstance(error, PeerTimeoutError) and rt.call_table.behind(call, members)
    died = isinstance(error, PeerTimeoutError) and rt.fault_plan is not None and rt.fault_plan.death_note(members)
    if behind or died:  # (a rank killed by iris_faults: what it raised, as the survivor waited for it)
        return PeerTimeoutError("\n".join(str(part) for part in (error, behind, died) if part))
    return error


def _execute(rt, spec: KernelSpec, ins: list[int], outs: list[int]) -> None:
    row_ptr = ins[0]
    group_ptr = ins[1] if spec.group else None
    operand_ptrs = ins[1 + spec.group:len(ins) - spec.ordered_after]
    rank = ctypes.c_int64.from_address(row_ptr).value
    for j in spec.symmetric:
        where = rt.heap.locate(operand_ptrs[j])
        if where is None or where[0] != rank or where[1] + spec.operand_nbytes[j] > rt.heap_size:
            raise NotOnHeapError(
                f"operand {j} of kernel {spec.kernel_name} is declared symmetric but is not on "
                f"rank {rank}'s heap (inside jit it was copied or computed); pass an array made by "
                "iris_jax (zeros, to_heap, ...) straight into the jitted function. Nothing was run.")
    group = group_row(rt, group_ptr, spec.group_nbytes) if spec.group else None
    call = group and rt.call_table and rt.call_table.begin(rank, group.key, spec.signature, spec.what, spec.site)
    members = group and group.members
    try:
        if rt.backend.host_kernels == "worker":
            batch = _batch(rt, spec, rank)
            found = execute_batched(batch, rank, spec, row_ptr, operand_ptrs, outs) if batch is not None else None
            if found is None:
                found = execute_in_worker(rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs, batch)
        else:
            found = execute_here(spec, row_ptr, group_ptr, operand_ptrs, outs, race_detector(rt, rank))
    except PeerTimeoutError as e:  # a mismatch can also make the kernels wait for each other
        named = named_fault(rt, call, members, e)
        if named is e:
            raise
        raise named from e
    problem = call and rt.call_table.mismatch(call, members)
    divergence = not problem and call and rt.call_table.divergence(call, members)
    if problem:
        raise RankMismatchError(problem)
    if found:
        races.emit(rt.detect_races, found, spec.kernel)
    if divergence:
        warnings.warn(f"rank {rank}: {divergence}", RankDivergenceWarning, stacklevel=1)


@dataclass(frozen=True)
class _Group:
    """A group row as the host reads it (iris_core.collectives.group_layout)."""

    key: int  # what the call table and the rendezvous know the group by
    members: list
    index: int  # this device's place among the members
    workspace: int  # the heap offset of the group's workspace


def group_row(rt, address: int, nbytes: int) -> _Group:
    """The group row at `address`, read once per distinct row (a call site's rows never change)."""
    raw = ctypes.string_at(address, nbytes)
    groups = rt.service("group_rows", lambda _: {})
    group = groups.get(raw)
    if group is None:
        row = np.frombuffer(raw, np.int32)
        group = groups[raw] = _Group(call_table.digest(group_layout.group_key(row)), group_layout.members(row),
                                     int(row[0]), int(row[-2]) & 0xFFFFFFFF | int(row[-1]) << 32)
    return group


def host_collective(kernel, constexprs: dict, dtype: np.dtype) -> host_collectives.Collective | None:
    """What a call of the collective kernel (or ragged_all_to_all's) asks for, where the host can
    run it in the kernel's place (None: another kernel, an all-reduce algorithm whose order of
    combining differs from member order, or device tracing, which records the kernel's own events)."""
    if kernel not in (ragged.ragged_kernel, collective_kernels.collective_kernel) or constexprs.get("TRACING"):
        return None
    common = dict(members=constexprs["G"], what=constexprs["WHAT"], timeout_s=constexprs["TIMEOUT_NS"] / 1e9)
    if kernel is ragged.ragged_kernel:
        return host_collectives.Collective(kind=kinds.RAGGED_ALL_TO_ALL, op=0, variant=0, in_blocks=1, out_blocks=1,
                                           sources=(), accumulator=dtype, slices=constexprs["SLICES"], **common)
    if constexprs["KIND"] == kinds.ALL_REDUCE and constexprs["VARIANT"] not in host_collectives.ALL_REDUCE_VARIANTS:
        return None
    return host_collectives.Collective(
        kind=constexprs["KIND"], op=constexprs["OP"], variant=constexprs["VARIANT"], in_blocks=constexprs["XB"],
        out_blocks=constexprs["OB"], sources=tuple(constexprs["SOURCES"]),
        accumulator=np.dtype(kinds.accumulator(dtype.name)), **common)


def runs_collectives_here(rt) -> bool:
    """Whether this runtime's collectives run on the host (every rank in this process, and
    sim_collectives="kernels" does not ask for the kernels). The race detector sees what they read
    and write and the order they make (`_host_reads`, `_host_writes`)."""
    return rt.backend.host_kernels == "worker" and rt.sim_collectives == "host"


_RAGGED_ROW = ragged.ragged_kernel.arg_names.index("R")


def host_buffers(spec: KernelSpec, operands: list[int], outs: list[int]) -> tuple:
    """A host collective's buffers as host_collectives.Rendezvous.run takes them (no copy)."""
    if spec.host.kind != kinds.RAGGED_ALL_TO_ALL:
        return (_host_array(operands[0], spec.operand_nbytes[0], spec.operand_dtypes[0], spec.host.in_blocks),
                _host_array(outs[0], spec.result_nbytes[0], spec.result_dtypes[0], spec.host.out_blocks))
    x, output, *vectors = (_host_array(p, n, d, 1) for p, n, d in
                           zip(operands, spec.operand_nbytes, spec.operand_dtypes))
    R = dict(spec.scalars)[_RAGGED_ROW]  # the elements of a row (a scalar of the kernel's, by position)
    x, output = x.reshape(-1, R), output.reshape(-1, R)
    out = _host_array(outs[0], spec.result_nbytes[0], spec.result_dtypes[0], output.shape[0])
    if outs[0] != operands[1]:  # (XLA may give the aliased result its own buffer)
        out[:] = output
    return (x, *(v[0] for v in vectors), out)


def _host_array(address: int, nbytes: int, dtype, blocks: int) -> np.ndarray:
    flat = np.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype) if nbytes else np.zeros(0, dtype)
    return flat.reshape(blocks, -1)


def _kernel_args(spec: KernelSpec, context, group, operands: list, results: list) -> list:
    lead = ([context] if spec.pass_context else []) + ([group] if spec.group else [])
    return kernel_arguments(lead + operands, spec.scalars, [results[o] for o in spec.result_params])


def race_detector(rt, rank: int):
    """This process's race detector of `rank` (None unless detection is on)."""
    if not rt.detect_races:
        return None
    heap = rt.heap
    detector = races.detector(heap.session, rt.world_size, rt.heap_size, heap.heap_bases, rank)
    detector.allocations, detector.names = heap.allocation_table, heap.allocation_names
    return detector


def execute_here(spec, row_ptr, group_ptr, operand_ptrs, outs, detector=None) -> list[str]:
    """Runs the kernel in this process, on XLA's pointers (a launched rank); returns the races found."""
    for i in spec.zeroed:
        ctypes.memset(outs[i], 0, spec.result_nbytes[i])
    operands = [Pointer(p, d) for p, d in zip(operand_ptrs, spec.operand_dtypes)]
    results = [Pointer(p, d) for p, d in zip(outs, spec.result_dtypes)]
    with _interpreter_lock:
        group = Pointer(group_ptr, np.int32) if spec.group else None
        return run_kernel(spec.kernel, spec.grid,
                          _kernel_args(spec, Pointer(row_ptr, np.int32), group, operands, results), spec.constexprs,
                          debug=spec.debug, detector=detector)


def _batch(rt, spec: KernelSpec, rank: int) -> kernel_batches.KernelBatch | None:
    """The call site's meetings, where its launches may meet (kernel_batches): a kernel of a
    computation over several ranks, not a collective's, without debug or the race detector, on
    operands and results of at most kernel_batches.MAX_BYTES per rank."""
    if (not kernel_batches.ENABLED or len(spec.ranks) < 2 or rank not in spec.ranks or spec.group or spec.debug
            or rt.detect_races or sum(spec.operand_nbytes) + sum(spec.result_nbytes) > kernel_batches.MAX_BYTES):
        return None
    return rt.service("kernel_batches", lambda _: kernel_batches.KernelBatches()).of(spec)


def execute_batched(batch: kernel_batches.KernelBatch, rank, spec, row_ptr, operand_ptrs, outs) -> list[str] | None:
    """Runs the launch with the other ranks' launches of the call site (`batch`'s meetings), as one
    batched replay here; None where it runs alone."""
    if not batch.meets:
        return None
    for i in spec.zeroed:
        ctypes.memset(outs[i], 0, spec.result_nbytes[i])
    operands = [Pointer(p, d) for p, d in zip(operand_ptrs, spec.operand_dtypes)]
    results = [Pointer(p, d) for p, d in zip(outs, spec.result_dtypes)]
    args = _kernel_args(spec, Pointer(row_ptr, np.int32), None, operands, results)
    form = batch.form

    def run(launches: list) -> list:
        with _interpreter_lock:
            errors = run_batched(form, spec.kernel, spec.grid, launches)
        return [kernel_batches.ALONE] * len(launches) if errors is None else errors

    error = batch.launch(rank, args, run)
    if error is kernel_batches.ALONE:
        return None
    if error is not None:
        raise world.rank_failure(rank, world.error_reply(error))
    return []


def execute_in_worker(rt, rank, spec, row_ptr, group_ptr, operand_ptrs, outs, batch=None) -> list[str]:
    """Runs the kernel in rank's worker process, XLA's buffers staged through shared memory;
    returns the races found. `batch`: the call site's meetings, told the kernel's batched form
    while they ask for it."""
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
            dtype = dtype.name  # (a name unpickles faster than a numpy dtype)
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
            _copy(area.address + group[1], group_ptr, spec.group_nbytes)
        for desc, ptr, nbytes in zip(operands, operand_ptrs, spec.operand_nbytes):
            if desc[0] == "staged" and nbytes:
                _copy(area.address + desc[1], ptr, nbytes)
        for i in spec.zeroed:
            ctypes.memset(area.address + results[i][1], 0, spec.result_nbytes[i])
        args = _kernel_args(spec, ("context", trace_words), group, operands, results)
        found, form = rt.sim_world.call(rank, _run_in_worker, rt.heap.session, rank, area.path, area.size, args,
                                        spec.kernel, spec.grid, spec.constexprs, spec.debug, rt.detect_races,
                                        batch is not None and batch.asks, what=f"kernel {spec.kernel_name}")
        if batch is not None:
            batch.learn(form)
        for desc, ptr, nbytes in zip(results, outs, spec.result_nbytes):
            if nbytes:
                _copy(ptr, area.address + desc[1], nbytes)
    return found


def _copy(to: int, source: int, nbytes: int) -> None:
    """memmove holding the GIL: ctypes.memmove gives it up and takes it back, and with every
    device's thread staging at once, the switching cost more than the copy."""
    _bytes_at(to, nbytes)[:] = _bytes_at(source, nbytes)


def _bytes_at(address: int, nbytes: int):
    return memoryview((ctypes.c_ubyte * nbytes).from_address(address)).cast("B")


def _trace_words(row_ptr: int, world_size: int) -> tuple[int, ...]:
    """The tracing words of the context row XLA passed: heap offsets, valid in the worker
    too (its heap bases differ; see iris_core.tracing.buffers)."""
    words = (ctypes.c_uint64 * context_words(world_size)).from_address(row_ptr)
    return tuple(words[trace_offset(world_size):trace_offset(world_size) + TRACE_WORDS])


def _run_in_worker(state, session, rank, area_path, area_size, args, kernel, grid, constexprs, debug=False,
                   detect_races=None, ask=False):
    """One rank's launch; returns the races found and, when `ask`, the batched form of the kernel's
    program (iris_core.sim.batched; None: it has none, kernel_batches)."""
    heap = state.heaps[session]
    args = _resolved(state, session, rank, area_path, area_size, args)
    detector = None
    if detect_races:
        detector = races.detector(session, heap.world_size, heap.heap_size, heap.heap_bases, rank)
        detector.allocations, detector.names = heap.allocation_table, heap.allocation_names
    found = run_kernel(kernel, grid, args, constexprs, debug=debug, detector=detector)
    return found, batched_form(kernel, args, constexprs) if ask else None


def _resolved(state, session, rank, area_path, area_size, args) -> list:
    """A launch's arguments as pointers of this worker: the staging area's, the heaps', the context's."""
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
    contexts = state.cache.setdefault("contexts", {})  # a context never changes (bases are fixed): built once
    key = (session, rank, tuple(trace_words))
    if key not in contexts:
        contexts[key] = heap.context(rank, trace_words)
    context = contexts[key]

    def resolve(arg):
        if not isinstance(arg, tuple):
            return arg
        if arg[0] == "context":
            return Pointer(context.ctypes.data, np.int32)
        if arg[0] == "heap":
            return Pointer(heap.address(arg[1], arg[2]), arg[3])
        return Pointer(base + arg[1], arg[2])

    return [resolve(a) for a in args]


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
