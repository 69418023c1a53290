"""Multi-device Mosaic GPU kernels on JAX's GPU interpreter: iris's rules for what crosses devices.

JAX's GPU interpret mode (jax 0.12) runs a Mosaic GPU kernel's local work on CPU devices (TMA,
barriers, wgmma, warpgroups as threads) but refuses everything that reaches another device. It
interprets the kernel at lowering time into io_callbacks on one process-wide memory keyed by
(memory space, device, block, thread, ref count, buffer id); every device makes the same
allocations in the same order, so a buffer's key on a peer differs from ours only in its device.

The seam: a JaxprInterpreter subclass with a rule table for the multi-device primitives (remote
refs, semaphores, multimem, pl.get_global), delegating every other equation to JAX's own
interpreter, and ten small patches of JAX's interpreter (install()). A remote access is the local
key with its device field replaced, read and written through JAX's own callbacks; a semaphore is an
int32 word in GMEM, zero at launch (one from plgpu.alloc_semaphore keeps its count between launches,
as on a GPU). A grid of at most core_count blocks runs resident, its blocks as
threads at once, as a persistent grid does on a GPU (_resident).

Races (`simulate(detect_races=True)`): JAX's detector keeps a vector clock per thread of every
device and checks each buffer's reads and writes; a remote access goes through it as the calling
thread's access of the peer's buffer, so it is checked against the peer's own accesses. A semaphore
signal releases (its clock goes with the count it added) and a wait that returns acquires the clocks
of the earliest signals that make up the count it waited for; multimem stores and loads are a write
and a read of every device's buffer, a plgpu atomic a read-modify-write that no other atomic races
with. Reports take iris's form (`_RaceState`): the buffer's name, both accesses with their devices
and source lines, and the remedy.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import functools
import inspect
import itertools
import math
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax._src import config as jax_config
from jax._src import core as jax_core
from jax._src import dispatch, source_info_util
from jax._src.interpreters import mlir
from jax._src.pallas import core as pallas_core
from jax._src.pallas import pallas_call as pallas_call_module
from jax._src.pallas import primitives as pallas_primitives
from jax._src.pallas import utils as pallas_utils
from jax._src.pallas.mosaic.interpret import race_detection_state as generic_races
from jax._src.pallas.mosaic.interpret import shared_memory as generic_memory
from jax._src.pallas.mosaic.interpret import thread_map
from jax._src.pallas.mosaic.interpret import utils as interpret_utils
from jax._src.pallas.mosaic_gpu import core as gpu_core
from jax._src.pallas.mosaic_gpu import primitives as gpu_primitives
from jax._src.pallas.mosaic_gpu.interpret import gpu_callbacks, jaxpr_interpret
from jax._src.pallas.mosaic_gpu.interpret import interpret_pallas_call as gpu_interpret_call
from jax._src.pallas.mosaic_gpu.interpret import params as gpu_params
from jax._src.pallas.mosaic_gpu.interpret import race_detection_state as gpu_races
from jax._src.pallas.mosaic_gpu.interpret import shared_memory as gpu_memory
from jax._src.state import indexing
from jax._src.state import primitives as state_primitives
from jax._src.state import types as state_types
from jax.experimental import io_callback
from jax.experimental.pallas import mosaic_gpu as plgpu_module

from iris_core.errors import PeerTimeoutError, RaceError, RaceWarning, RankMismatchError

DEFAULT_TIMEOUT_S = 30.0
_TOKEN = gpu_callbacks.TOKEN_SHAPE_DTYPE
_POLL_S = 0.02  # how often a semaphore wait looks again (signals also wake it)


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterpretGPUParams(gpu_params.InterpretGPUParams):
    """JAX's GPU interpret parameters plus iris's: how long a semaphore wait may wait.

    Named as JAX's class: pallas_call forwards the kernel's arguments' transforms to the GPU
    interpreter only for a class of that name.
    """

    semaphore_timeout_s: float = DEFAULT_TIMEOUT_S


# ------------------------------------------------------------------------------------------------
# Host side: the callbacks, run on each device's thread against JAX's shared memory


@dataclasses.dataclass(frozen=True)
class _Site:
    """Where an op sits, for error messages: the kernel's name and the op's source line."""

    kernel: str
    line: str
    blocks: str = ""  # how the grid's blocks run (_resident)

    def __str__(self) -> str:
        return f"{self.kernel} at {self.line}"


@dataclasses.dataclass(frozen=True)
class _DeviceIdCheck:
    """A device id the kernel named, statically: what each checked value means and its bound."""

    form: str  # "dict", "tuple", "scalar" or "logical": how to show the values
    labels: tuple[str, ...]  # the axis (or joint axes) of each value
    bounds: tuple[int, ...]  # each value must be in [0, bound)
    mesh: str  # the mesh's axes and sizes, shown
    op: str
    site: _Site

    def shown(self, values: Sequence[int]) -> str:
        """The device id as the kernel wrote it, with its values."""
        if self.form == "dict":
            return "{" + ", ".join(f"{label}: {v}" for label, v in zip(self.labels, values)) + "}"
        if self.form == "tuple":
            return "(" + ", ".join(str(v) for v in values) + ")"
        return f"logical id {values[0]}" if self.form == "logical" else str(values[0])

    def error(self, values: Sequence[int], device: int | None) -> RankMismatchError | None:
        """The error for `values` outside the mesh, or None where every value is inside it."""
        bad = [(label, v, bound) for label, v, bound in zip(self.labels, values, self.bounds) if not 0 <= v < bound]
        if not bad:
            return None
        on = "" if device is None else f" on device {device}"
        ranges = "; ".join(f"{label} must be in [0, {bound}), got {v}" for label, v, bound in bad)
        return RankMismatchError(
            f"{self.op} in Mosaic GPU kernel {self.site}{on} names device_id {self.shown(values)}, which is outside "
            f"the mesh {self.mesh}: {ranges}. Mosaic GPU does not check this (a GPU would reach memory that is no "
            "peer's); pass mesh coordinates within the shard_map's mesh."
        )


def _key(key_array: Any) -> gpu_memory.HostAllocationKey:
    return gpu_memory.HostAllocationKey.from_array(np.asarray(key_array))


def _view(memory: Any, key: gpu_memory.HostAllocationKey, transforms: Sequence[Any]) -> np.ndarray:
    """A numpy view of buffer `key` after `transforms` (the caller holds memory.lock)."""
    return _transformed(memory.mem[key].content, transforms)


def _access(memory: Any, key: gpu_memory.HostAllocationKey, transforms: Sequence[Any]):
    """What `transforms` reach of buffer `key`, as JAX's race detector takes it: JAX's own Access, or
    where a reshape is among them (which JAX's callbacks refuse), the bounding box of the elements reached."""
    if not _reshaped(transforms):
        return memory.access(key, transforms)
    shape = memory.buffer_shape_and_dtype(key).shape
    reached = _transformed(np.arange(math.prod(shape)).reshape(shape), transforms).reshape(-1)
    if reached.size == 0:
        return memory.access(key, ())
    box = np.unravel_index(reached, shape)
    return interpret_utils.Access(tuple(slice(int(i.min()), int(i.max()) + 1) for i in box), None)


def _reshaped(transforms) -> bool:
    """Whether a reshape is among `transforms` (JAX's callbacks refuse one)."""
    return any(isinstance(t, state_types.ReshapeTransform) for t in transforms)


def _transformed(base: np.ndarray, transforms: Sequence[Any]) -> np.ndarray:
    view = base
    for transform in transforms:
        if isinstance(transform, gpu_memory.LAYOUT_TRANSFORMS):
            continue
        if isinstance(transform, indexing.NDIndexer):
            access = interpret_utils.to_access((transform,), view.shape)
            # an integer index as a slice of one, that axis then dropped: a view even of one element
            kept = tuple(r if isinstance(r, slice) else slice(int(r), int(r) + 1) for r in access.range)
            dropped = [axis for axis, r in enumerate(access.range) if not isinstance(r, slice)]
            view = view[kept]
            view = view.reshape([size for axis, size in enumerate(view.shape) if axis not in dropped])
            if access.permutation is not None:
                view = view.transpose(access.permutation)
        elif isinstance(transform, state_types.TransposeTransform):
            view = view.transpose(transform.permutation)
        elif isinstance(transform, state_types.ReshapeTransform):
            view = view.reshape(transform.shape)
            if view.size and not np.shares_memory(view, base):
                raise NotImplementedError(f"iris's Mosaic GPU interpreter: a reshape that copies ({transform})")
        else:
            raise NotImplementedError(f"iris's Mosaic GPU interpreter: transform {transform}")
    return view


@gpu_callbacks.fail_on_exception
def _check_device_id(token, values, device, *, check: _DeviceIdCheck):
    """Fails the launch when a device id computed at run time lies outside the mesh."""
    error = check.error([int(v) for v in np.asarray(values)], int(device))
    if error is not None:
        raise error
    return token


@gpu_callbacks.fail_on_exception
def _read(token, key_array, transforms):
    memory = gpu_callbacks._get_shared_memory()
    with memory.lock:
        return token, np.array(_view(memory, _key(key_array), transforms))


@gpu_callbacks.fail_on_exception
def _write(token, key_array, transforms, value):
    """Stores `value` and returns what was there (a swap), atomically."""
    memory = gpu_callbacks._get_shared_memory()
    with memory.lock:
        view = _view(memory, _key(key_array), transforms)
        old = np.array(view)
        view[...] = value
    return token, old


_ATOMIC_OPS = {"add": np.add, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
               "xor": np.bitwise_xor}


@gpu_callbacks.fail_on_exception
def _atomic(token, key_array, transforms, value, thread, *, op: str, source_info=None):
    """Combines `value` into the buffer element by element, atomically (plgpu.atomic_*); the race detector
    sees a read-modify-write that races with plain accesses, never with another atomic."""
    memory = gpu_callbacks._get_shared_memory()
    key = _key(key_array)
    with memory.lock:
        view = _view(memory, key, transforms)
        view[...] = _ATOMIC_OPS[op](view, np.asarray(value, view.dtype))
    _checked(memory, thread, [key], transforms, "atomic", source_info)
    return token


def _checked(memory, thread, keys, transforms, kind: str, source_info) -> None:
    """The race detector's check of one access ("load", "store" or "atomic") by `thread` of each buffer in
    `keys` (detection on)."""
    if not memory.detect_races:
        return
    clock = memory.incr_clock(thread)
    races = gpu_callbacks.get_races()
    check = {"load": races.check_read, "store": races.check_write, "atomic": races.check_atomic}[kind]
    for key in keys:
        check(thread, clock.generic_clock, key, _access(memory, key, transforms), source_info=source_info)


@gpu_callbacks.fail_on_exception
def _store_everywhere(token, key_array, transforms, value, thread, *, num_devices: int, source_info=None):
    """multimem_store: the same value into every device's copy of the buffer, at once."""
    memory = gpu_callbacks._get_shared_memory()
    key = _key(key_array)
    keys = [dataclasses.replace(key, device_id=device) for device in range(num_devices)]
    with memory.lock:
        for each in keys:
            _view(memory, each, transforms)[...] = value
    _checked(memory, thread, keys, transforms, "store", source_info)
    return token


_REDUCTIONS = {
    "add": np.add,
    "min": np.minimum,
    "max": np.maximum,
    "and": np.bitwise_and,
    "or": np.bitwise_or,
    "xor": np.bitwise_xor,
}


@gpu_callbacks.fail_on_exception
def _load_reduced(token, key_array, transforms, thread, *, num_devices: int, reduction: str, dtype: Any,
                  source_info=None):
    """multimem_load_reduce: every device's copy of the buffer, combined in device order."""
    memory = gpu_callbacks._get_shared_memory()
    key = _key(key_array)
    keys = [dataclasses.replace(key, device_id=d) for d in range(num_devices)]
    with memory.lock:
        reduced = functools.reduce(_REDUCTIONS[reduction], [_view(memory, k, transforms) for k in keys]).astype(dtype)
    _checked(memory, thread, keys, transforms, "load", source_info)
    return token, reduced


# wakes semaphore waiters; taken before memory.lock wherever both are held
_SIGNALLED = threading.Condition()


def _semaphore(memory: Any, key: gpu_memory.HostAllocationKey, shape: tuple[int, ...]) -> np.ndarray:
    """The semaphore's words, created zero where a peer signals it before its owner allocated it."""
    if key not in memory.mem:
        memory.mem[key] = generic_memory.Buffer(np.zeros(shape, np.int32), ref_count=key.initial_ref_count)
    return memory.mem[key].content


def _pending(memory, key, view: np.ndarray, count_before: int) -> collections.deque:
    """The race detector's record of what one semaphore word holds: [count, clock] entries in signal order,
    each signal's clock (what it released); the first entry's clock is None where the word came into this
    launch with a count (a semaphore from plgpu.alloc_semaphore keeps its count between launches)."""
    base = memory.mem[key].content
    slot = (key, view.__array_interface__["data"][0] - base.__array_interface__["data"][0])
    pending = memory.__dict__.setdefault("_iris_pending", {})
    if slot not in pending:
        pending[slot] = collections.deque([[count_before, None]] if count_before > 0 else [])
    return pending[slot]


@gpu_callbacks.fail_on_exception
def _signal(token, key_array, transforms, increment, thread, *, shape: tuple[int, ...]):
    """Adds `increment` to the semaphore; with race detection, releases the signalling thread's clock."""
    memory = gpu_callbacks._get_shared_memory()
    key = _key(key_array)
    with _SIGNALLED:
        with memory.lock:
            _semaphore(memory, key, shape)
            view = _view(memory, key, transforms)
            if memory.detect_races:
                entries = _pending(memory, key, view, int(view.flat[0]))
                entries.append([int(increment), memory.incr_clock(thread, take_lock=False)])
            view[...] += int(increment)
        _SIGNALLED.notify_all()
    return token


@gpu_callbacks.fail_on_exception
def _read_semaphore(token, key_array, transforms, *, shape: tuple[int, ...]):
    """The semaphore's count now (a plain read: it orders nothing, as on a GPU)."""
    memory = gpu_callbacks._get_shared_memory()
    key = _key(key_array)
    with memory.lock:
        _semaphore(memory, key, shape)
        return token, np.int32(_view(memory, key, transforms))


@gpu_callbacks.fail_on_exception
def _wait(
    token,
    key_array,
    transforms,
    value,
    device,
    thread,
    *,
    decrement: bool,
    shape: tuple[int, ...],
    timeout_s: float,
    site: _Site,
):
    """Waits until the semaphore reaches `value` (then takes it off if `decrement`); fails after timeout_s."""
    memory = gpu_callbacks._get_shared_memory()
    key, value = _key(key_array), int(value)
    deadline = time.monotonic() + timeout_s
    with _SIGNALLED:
        while True:
            memory.check_failed()  # another device failed: end this wait too
            with memory.lock:
                _semaphore(memory, key, shape)
                view = _view(memory, key, transforms)
                count = int(view)
                if count >= value:
                    if memory.detect_races:
                        _acquire(memory, thread, _pending(memory, key, view, count), value, decrement, site, device)
                    if decrement:
                        view[...] -= value
                    return token
            if time.monotonic() >= deadline:
                raise PeerTimeoutError(_wait_timeout_message(site, int(device), count, value, timeout_s))
            _SIGNALLED.wait(_POLL_S)


def _acquire(memory, thread, entries: collections.deque, value: int, decrement: bool, site: _Site, device) -> None:
    """A wait that returned acquires what the signals that satisfied it released: the earliest ones, `value`
    of their count (taken off with `decrement`). A count that came from an earlier launch orders nothing in
    this one; the thread keeps a note of it for a race report."""
    taken, carried = 0, 0
    for entry in list(entries):
        if taken >= value:
            break
        count, clock = entry
        used = min(count, value - taken)
        taken += used
        if clock is None:
            carried += used
        else:
            memory.clocks[thread].update(clock)
        if decrement:
            entry[0] -= used
            if entry[0] == 0:
                entries.popleft()
    if carried:
        memory.__dict__.setdefault("_iris_carried", {})[thread] = (
            f"device {int(device)}'s semaphore_wait at {site.line} returned on a count of {carried} left by an earlier "
            "launch, which orders nothing in this one: a semaphore that outlives a launch (plgpu.alloc_semaphore) "
            "must end each launch at zero (wait with decrement=True for every signal)"
        )


def _wait_timeout_message(site: _Site, device: int, count: int, value: int, timeout_s: float) -> str:
    unstarted = _unstarted_threads()
    why = (f"{unstarted} of the kernel's threads are still waiting inside XLA to start: its CPU runtime runs at "
           "most 32 computations of one device at once, and threads that wait hold theirs; run fewer threads at "
           "once (simulate(core_count=...))" if unstarted else
           "No device signalled it enough: a semaphore_signal (with this device's id) is missing, or the signalling "
           "block cannot run while this one waits" + (f" ({site.blocks})" if site.blocks else ""))
    return (
        f"semaphore_wait in Mosaic GPU kernel {site} on device {device} timed out after {timeout_s:g} s: the "
        f"semaphore's count is {count}, waiting for {value}. {why}. Set the time with "
        "iris_jax.pallas.mosaic_gpu.simulate(timeout_s=...)."
    )


_EXECUTE = os.path.join("interpreters", "pxla.py")  # where JAX hands a computation to XLA


def _unstarted_threads() -> int:
    """How many of the interpreter's threads sit in XLA's execute call with no frame of theirs running on
    top (no callback of their computation has started): waiting for a slot of XLA's per-device limit."""
    frames = sys._current_frames()
    with _ON_DEVICE_LOCK:
        idents = list(_RUNNING)
    return sum(1 for ident in idents
               if ident in frames and frames[ident].f_code.co_filename.endswith(_EXECUTE))


@gpu_callbacks.fail_on_exception
def _global_semaphore(token, device, *, uid: int, shape: tuple[int, ...]):
    """pl.get_global: one zeroed int32 buffer per device and call site, for the whole launch."""
    memory = gpu_callbacks._get_shared_memory()
    key = gpu_memory.HostAllocationKey(
        memory_space_id=gpu_memory.get_memory_space_idx(gpu_core.MemorySpace.GMEM),
        device_id=int(device),
        block_id=0,
        thread_id=0,
        initial_ref_count=1,
        buffer_id=-1 - uid,
    )  # JAX's buffer ids are positive
    with memory.lock:
        _semaphore(memory, key, shape)  # a peer may have created it by signalling first
    return token, key.as_np_array


class _RaceState(gpu_races.GPURaceDetectionState):
    """JAX's race detection state (every read and write of every buffer, with its thread's vector
    clock), reporting in iris's form: the buffer, both accesses with their devices, threads and
    source lines, and what would order them; RaceError, or RaceWarning where on_race is "warn"."""

    # which earlier accesses an access races with where nothing orders them: a load with stores and atomics,
    # a store with every access, an atomic with plain loads and stores (atomics among themselves are ordered
    # by the hardware)
    _RACES_WITH = {"load": ("store", "atomic"), "store": ("store", "load", "atomic"), "atomic": ("store", "load")}

    def check_read(self, thread, clock, buffer_key, rnge, source_info=None):
        self._check(thread, clock, buffer_key, rnge.range, source_info, "load")
        self._check_ref_union(thread, clock, buffer_key, False, source_info)

    def check_write(self, thread, clock, buffer_key, rnge, source_info=None):
        self._check(thread, clock, buffer_key, rnge.range, source_info, "store")
        self._check_ref_union(thread, clock, buffer_key, True, source_info)

    def check_atomic(self, thread, clock, buffer_key, rnge, source_info=None):
        """A plgpu atomic's read-modify-write (JAX's detector knows none)."""
        self._check(thread, clock, buffer_key, rnge.range, source_info, "atomic")

    def _records(self, kind: str, key) -> list:
        if kind == "store":
            return self.writes[key]
        if kind == "load":
            return self.reads[key]
        return self.__dict__.setdefault("_iris_atomics", collections.defaultdict(list))[key]

    def _check(self, thread, clock, key, rnge, source_info, kind: str) -> None:
        line = source_info_util.summarize(source_info) if source_info is not None else "pallas_call"
        with self.lock:  # the records made before this one (the lists only grow: read below without the lock)
            earlier = [(other, self._records(other, key)) for other in self._RACES_WITH[kind]]
            earlier = [(other, records, len(records)) for other, records in earlier]
            self._records(kind, key).append((thread, clock, rnge, line))
        for other_kind, records, count in earlier:
            for other, other_clock, other_range, other_line in itertools.islice(records, count):
                if other_clock.ordered(clock) or not generic_races._ranges_overlap(rnge, other_range):
                    continue
                with self.lock:
                    self.races_found = True
                self._report(key, rnge, (kind, thread, line), (other_kind, other, other_line))
                return

    def _report(self, key, rnge, this, other) -> None:
        memory = gpu_callbacks._get_shared_memory()
        where = f"{_SPACES.get(key.memory_space_id, 'memory space ' + str(key.memory_space_id))} buffer {key.buffer_id}"
        name = memory.__dict__.get("_iris_names", {}).get(key)
        carried = memory.__dict__.get("_iris_carried", {})
        notes = "".join(f"\n    {carried[t]}" for t in dict.fromkeys((other[1], this[1])) if t in carried)
        text = (
            f"data race on device {key.device_id}'s {f'{name} ({where})' if name else where}, elements "
            f"{_shown_range(rnge)}:\n"
            f"    {other[0]} by {_thread_shown(other[1])} at {other[2]}\n"
            f"    {this[0]} by {_thread_shown(this[1])} at {this[2]}\n"
            "    nothing orders them: the writer must pl.semaphore_signal after its access and the other side "
            "pl.semaphore_wait on that semaphore before its own (a release, then an acquire), or a barrier between."
            + notes
        )
        if self.on_race == "raise":
            raise RaceError(text)
        warnings.warn(text, RaceWarning, stacklevel=2)


_SPACES = {index: space.name for space, index in gpu_memory.IDX_BY_GPU_MEMORY_SPACE.items()}  # GMEM, SMEM, ...


def _thread_shown(thread) -> str:
    """A thread of JAX's GPU interpreter as the report names it."""
    device = getattr(thread, "device_id", None)
    if device is None:
        return f"a TMA copy ({thread})"
    parts = [f"device {device}", f"block {thread.block_id}", f"warpgroup {thread.warpgroup_id}"]
    if hasattr(thread, "warp_id"):
        parts.append(f"warp {thread.warp_id}")
    return ", ".join(parts)


def _shown_range(rnge) -> str:
    def one(r):
        if isinstance(r, slice):
            return f"{r.start if r.start is not None else ''}:{r.stop if r.stop is not None else ''}"
        return str(r)
    return "[" + ", ".join(one(r) for r in rnge) + "]"


# ------------------------------------------------------------------------------------------------
# Trace side: the interpreter and its rules, run once while the kernel is lowered

_ONE_EQUATION = jax_core.DebugInfo("iris_mosaic_gpu", "one equation of a Mosaic GPU kernel", None, None)
_LAUNCH = threading.local()  # the kernel being interpreted (name, jaxpr, how its blocks run), on the lowering thread
_GLOBAL_IDS = itertools.count()


@dataclasses.dataclass(frozen=True)
class _Rule:
    """How iris interprets one primitive: `applies` (default: always) picks the equations it takes."""

    run: Callable[..., tuple[Any, list[Any]]]
    applies: Callable[[Any], bool] = lambda eqn: True


_RULES: dict[jax_core.Primitive, _Rule] = {}


def _rule(*primitives: jax_core.Primitive, applies: Callable[[Any], bool] | None = None):
    def register(run):
        for primitive in primitives:
            _RULES[primitive] = _Rule(run, applies) if applies else _Rule(run)
        return run

    return register


class IrisJaxprInterpreter(jaxpr_interpret.JaxprInterpreter):
    """JAX's GPU interpreter with iris's rules for the primitives that cross devices."""

    def interpret(self, jaxpr, token, *args):
        env = interpret_utils.JaxprEnv(vars=jaxpr.constvars + jaxpr.invars, values=args)
        for eqn in jaxpr.eqns:
            rule = _RULES.get(eqn.primitive)
            if rule is not None and rule.applies(eqn):
                with source_info_util.user_context(eqn.source_info.traceback, name_stack=eqn.source_info.name_stack):
                    token, out = rule.run(self, eqn, token, env.read_many(eqn.invars))
            else:
                token, out = self._delegate(eqn, token, env)
            env.write_many(eqn.outvars, out)
        return token, env.read_many(jaxpr.outvars)

    def _delegate(self, eqn, token, env):
        """One equation through JAX's own interpreter (its nested jaxprs come back through ours)."""
        invars = list(dict.fromkeys(v for v in eqn.invars if isinstance(v, jax_core.Var)))
        single = jax_core.Jaxpr([], invars, eqn.outvars, [eqn], debug_info=_ONE_EQUATION)
        return super().interpret(single, token, *env.read_many(invars))

    def site(self, eqn) -> _Site:
        kernel = getattr(_LAUNCH, "name", None)
        return _Site(repr(kernel) if kernel else "(unnamed)", source_info_util.summarize(eqn.source_info),
                     getattr(_LAUNCH, "blocks", None) or "")

    @property
    def mesh_shown(self) -> str:
        return "{" + ", ".join(f"{name!r}: {size}" for name, size in self.device_info.axis_sizes.items()) + "}"

    def peer_key(self, token, key_array, device_id, device_id_type, op: str, eqn):
        """(token, the key of the buffer `key_array` names on device `device_id`), the id checked."""
        device, token = self.logical_device(token, device_id, device_id_type, op, eqn)
        return token, key_array.at[1].set(device)

    def logical_device(self, token, device_id, device_id_type, op: str, eqn):
        """(the logical id of the device `device_id` names, token); an id outside the mesh fails."""
        info = self.device_info
        names, sizes = tuple(info.axis_sizes), tuple(info.axis_sizes.values())
        device_id_type = device_id_type or pallas_primitives.DeviceIdType.MESH
        mesh_info = pallas_utils.MeshInfo(sizes, names, pallas_utils.strides_from_shape(sizes))
        axis_index = info.axis_indices.__getitem__
        # JAX's own checks and messages: dict ids need the MESH type, one id per mesh axis
        logical, non_mesh_axes = pallas_primitives.device_id_to_logical(
            mesh_info, device_id, device_id_type, axis_index
        )
        if non_mesh_axes:
            raise ValueError(f"Unrecognized axes in device_id: {non_mesh_axes}")
        form, labels, values, bounds = _device_id_parts(device_id, device_id_type, dict(info.axis_sizes))
        check = _DeviceIdCheck(form, labels, bounds, self.mesh_shown, op, self.site(eqn))
        static = [int(v) if not isinstance(v, jax_core.Tracer) else 0 for v in values]
        if (error := check.error(static, None)) is not None:
            raise error
        if any(isinstance(v, jax_core.Tracer) for v in values):
            token = io_callback(
                functools.partial(_check_device_id, check=check),
                _TOKEN,
                token,
                jnp.stack([jnp.asarray(v, jnp.int32) for v in values]),
                jnp.int32(info.device_id),
            )
        return jnp.asarray(logical, jnp.int32), token

    def split_peer(self, token, key_array, transforms, op: str, eqn):
        """(token, the key of the buffer the transforms reach, the transforms without PeerMemRef)."""
        rest = []
        for transform in transforms:
            if isinstance(transform, gpu_core.PeerMemRef):
                token, key_array = self.peer_key(
                    token, key_array, transform.device_id, transform.device_id_type, op, eqn
                )
            else:
                rest.append(transform)
        return token, key_array, tuple(rest)


def _device_id_parts(device_id, device_id_type, sizes: dict[Hashable, int]):
    """(form, labels, values, bounds) of a device id: each value the kernel gave, and its bound."""
    if device_id_type == pallas_primitives.DeviceIdType.LOGICAL:
        return "logical", ("the logical id",), (device_id,), (math.prod(sizes.values()),)
    if isinstance(device_id, dict):
        items = [
            ((axis[0] if isinstance(axis, tuple) and len(axis) == 1 else axis), v) for axis, v in device_id.items()
        ]
        labels = tuple(repr(axis) for axis, _ in items)
        bounds = tuple(
            math.prod(sizes[a] for a in axis) if isinstance(axis, tuple) else sizes[axis] for axis, _ in items
        )
        return "dict", labels, tuple(v for _, v in items), bounds
    values = tuple(jax.tree.leaves(device_id))
    return (
        ("tuple" if isinstance(device_id, (tuple, list)) else "scalar"),
        tuple(repr(n) for n in sizes),
        values,
        tuple(sizes.values()),
    )


def _reaches_further(transforms) -> bool:
    """Whether JAX's callbacks would refuse these transforms: a peer's ref, or a reshape."""
    return any(isinstance(t, (gpu_core.PeerMemRef, state_types.ReshapeTransform)) for t in transforms)


def _transforms_of(eqn, first: int):
    return jax.tree.unflatten(eqn.params["tree"], eqn.invars[first:])


@_rule(state_primitives.get_p, gpu_primitives.load_p, applies=lambda eqn: _reaches_further(_transforms_of(eqn, 1)))
def _get(self, eqn, token, invals):
    """A read of a peer's ref: JAX's own read (and race check) of the peer's buffer by this thread."""
    key_array, *leaves = invals
    token, key_array, transforms = self.split_peer(
        token, key_array, jax.tree.unflatten(eqn.params["tree"], leaves), "a read of plgpu.remote_ref", eqn
    )
    if _reshaped(transforms):  # JAX's callbacks refuse a reshape (and see no race through it)
        token, value = io_callback(_read, (_TOKEN, eqn.outvars[0].aval), token, key_array, transforms)
        return token, [value]
    ref, transforms = jaxpr_interpret.resolve_ref(eqn.invars[0].aval, key_array, transforms)
    token, value = gpu_callbacks.call_get(
        token=token, result_shape_and_dtype=eqn.outvars[0].aval, mesh_location=self.mesh_location,
        thread=self.thread, allocation_key_as_array=ref, transforms=transforms, source_info=eqn.source_info)
    return token, [value]


@_rule(state_primitives.swap_p, gpu_primitives.store_p, applies=lambda eqn: _reaches_further(_transforms_of(eqn, 2)))
def _swap(self, eqn, token, invals):
    """A write to a peer's ref: JAX's own swap (and race check) of the peer's buffer by this thread."""
    key_array, value, *leaves = invals
    token, key_array, transforms = self.split_peer(
        token, key_array, jax.tree.unflatten(eqn.params["tree"], leaves), "a write to plgpu.remote_ref", eqn
    )
    if _reshaped(transforms):
        token, old = io_callback(_write, (_TOKEN, eqn.invars[1].aval), token, key_array, transforms, value)
    else:
        ref, transforms = jaxpr_interpret.resolve_ref(eqn.invars[0].aval, key_array, transforms)
        token, old = gpu_callbacks.call_swap(
            token=token, result_shape_and_dtype=eqn.invars[1].aval, mesh_location=self.mesh_location,
            thread=self.thread, allocation_key_as_array=ref, transforms=transforms, val=value, mask=None,
            source_info=eqn.source_info)
    return token, ([] if eqn.primitive is gpu_primitives.store_p else [old])


@_rule(gpu_primitives.atomic_store_p)
def _atomic_store(self, eqn, token, invals):
    """plgpu.atomic_add / min / max / and / or / xor, into this device's ref or a peer's (remote_ref); JAX's
    interpreter has no rule for them; the race detector sees a read-modify-write."""
    ref, transforms, value, *mask = jax.tree.unflatten(eqn.params["args_tree"], invals)
    if mask and mask[0] is not None:
        raise NotImplementedError("a masked plgpu atomic store is not simulated")
    op = eqn.params["atomic_type"].value
    token, key_array, transforms = self.split_peer(token, ref, transforms or (), f"plgpu.atomic_{op}", eqn)
    atomic = functools.partial(_atomic, op=op, source_info=eqn.source_info)
    return io_callback(atomic, _TOKEN, token, key_array, transforms, value, self.thread), []


_REMOTE = (gpu_core.PeerMemRef, gpu_core.MulticastRef)


def _holds(tree: jax.tree_util.PyTreeDef, kinds: tuple[type, ...] = _REMOTE) -> bool:
    """Whether a tree of transforms holds one of `kinds` (a remote or multicast ref): its structure says,
    whatever its leaves."""
    nodes = jax.tree.leaves(jax.tree.unflatten(tree, [None] * tree.num_leaves), is_leaf=lambda x: isinstance(x, kinds))
    return any(isinstance(node, kinds) for node in nodes)


def _copy_to_peer(eqn) -> bool:
    return _holds(eqn.params["dst_transforms_treedef"])


@_rule(gpu_primitives.copy_smem_to_gmem_p, applies=_copy_to_peer)
def _copy_smem_to_peer(self, eqn, token, invals):
    """A TMA copy into a peer's GMEM (remote_ref), or into every device's (multicast_ref): JAX's copy, to
    each destination's key."""
    params = eqn.params
    src, dst, *flat = invals
    num_src, num_dst = params["src_transforms_treedef"].num_leaves, params["dst_transforms_treedef"].num_leaves
    src_leaves, dst_leaves, rest = flat[:num_src], flat[num_src : num_src + num_dst], flat[num_src + num_dst :]
    dst_transforms = jax.tree.unflatten(params["dst_transforms_treedef"], dst_leaves)
    multicast = [t for t in dst_transforms if isinstance(t, gpu_core.MulticastRef)]
    if multicast:
        _whole_mesh(self, multicast[0].collective_axes, "copy_smem_to_gmem into a multicast_ref", NotImplementedError,
                    _MULTIMEM_AXES)
        dst_transforms = tuple(t for t in dst_transforms if not isinstance(t, gpu_core.MulticastRef))
        destinations = [dst.at[1].set(device) for device in range(self.device_info.num_devices)]
    else:
        token, dst, dst_transforms = self.split_peer(token, dst, dst_transforms, "copy_smem_to_gmem", eqn)
        destinations = [dst]
    new_leaves, new_tree = jax.tree.flatten(dst_transforms)
    local = dict(params, dst_transforms_treedef=new_tree)
    out = []
    for destination in destinations:
        token, out = self._interpret_copy_smem_to_gmem_p(eqn, token, src, destination, *src_leaves, *new_leaves, *rest,
                                                          **local)
    return token, out


def _copy_from_peer(eqn) -> bool:
    return _holds(eqn.params["src_transforms_treedef"], (gpu_core.PeerMemRef,))


@_rule(gpu_primitives.copy_gmem_to_smem_p, applies=_copy_from_peer)
def _copy_peer_to_smem(self, eqn, token, invals):
    """A TMA copy from a peer's GMEM into SMEM: JAX's copy (and its barrier's arrival), from the peer's key."""
    params = eqn.params
    num_src = params["src_transforms_treedef"].num_leaves
    (src, dst, barrier), src_leaves, rest = invals[:3], invals[3 : 3 + num_src], invals[3 + num_src :]
    token, src, src_transforms = self.split_peer(
        token, src, jax.tree.unflatten(params["src_transforms_treedef"], src_leaves), "copy_gmem_to_smem", eqn
    )
    new_leaves, new_tree = jax.tree.flatten(src_transforms)
    local = eqn.replace(params=dict(params, src_transforms_treedef=new_tree))
    return self._interpret_copy_gmem_to_smem_p(local, token, lambda: [src, dst, barrier, *new_leaves, *rest])


def _semaphore_shape(eqn) -> tuple[int, ...]:
    return tuple(eqn.invars[0].aval.shape)


@_rule(pallas_primitives.semaphore_signal_p, gpu_primitives.semaphore_signal_p)
def _semaphore_signal(self, eqn, token, invals):
    semaphore, transforms, increment, device_id, core_index = jax.tree.unflatten(eqn.params["args_tree"], invals)
    if core_index is not None:
        raise NotImplementedError(
            "Mosaic GPU backend does not support the concept of cores, but core_index is specified"
        )
    if device_id is not None:
        if eqn.params.get("memory_scope") == "gpu":
            raise ValueError(
                "Cannot signal a GPU-local semaphore from a remote device. Please use `memory_scope='sys'` instead."
            )
        token, semaphore = self.peer_key(
            token, semaphore, device_id, eqn.params["device_id_type"], "semaphore_signal", eqn
        )
    signal = functools.partial(_signal, shape=_semaphore_shape(eqn))
    return io_callback(signal, _TOKEN, token, semaphore, transforms, increment, self.thread), []


@_rule(gpu_primitives.semaphore_signal_parallel_p)
def _semaphore_signal_parallel(self, eqn, token, invals):
    semaphores, all_transforms, increments, device_ids = jax.tree.unflatten(eqn.params["args_tree"], invals)
    for k, (semaphore, transforms, increment, device_id) in enumerate(
        zip(semaphores, all_transforms, increments, device_ids)
    ):
        if device_id is not None:
            token, semaphore = self.peer_key(token, semaphore, device_id, None, "semaphore_signal_parallel", eqn)
        signal = functools.partial(_signal, shape=tuple(eqn.invars[k].aval.shape))
        token = io_callback(signal, _TOKEN, token, semaphore, transforms, increment, self.thread)
    return token, []


def _whole_mesh(self, axes, op: str, error: type[Exception], message: str) -> None:
    """The check Mosaic GPU's lowering makes: collective axes must be every axis of the mesh."""
    axes = tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)
    names = tuple(self.device_info.axis_sizes)
    if not names:
        raise ValueError(f"JAX device mesh is required by {op}, but not defined.")
    if set(axes) != set(names):
        raise error(message.format(axes=axes, names=names))


_MULTIMEM_AXES = "Only collective_axes that include all JAX device mesh ({names}) axes are supported, but got {axes}"


@_rule(gpu_primitives.semaphore_signal_multicast_p)
def _semaphore_signal_multicast(self, eqn, token, invals):
    _whole_mesh(
        self,
        eqn.params["collective_axes"],
        "semaphore_signal_multicast",
        ValueError,
        "collective_axes {axes} must equal entire mesh axes {names}",
    )
    semaphore, transforms, increment = jax.tree.unflatten(eqn.params["args_tree"], invals)
    signal = functools.partial(_signal, shape=_semaphore_shape(eqn))
    for device in range(self.device_info.num_devices):
        token = io_callback(signal, _TOKEN, token, semaphore.at[1].set(device), transforms, increment, self.thread)
    return token, []


@_rule(pallas_primitives.semaphore_wait_p, gpu_primitives.semaphore_wait_p)
def _semaphore_wait(self, eqn, token, invals):
    semaphore, transforms, value, decrement = jax.tree.unflatten(eqn.params["args_tree"], invals)
    timeout_s = getattr(self.interpret_params, "semaphore_timeout_s", DEFAULT_TIMEOUT_S)  # JAX's own params
    wait = functools.partial(
        _wait, decrement=bool(decrement), shape=_semaphore_shape(eqn), timeout_s=timeout_s, site=self.site(eqn)
    )
    return io_callback(
        wait, _TOKEN, token, semaphore, transforms, value, jnp.int32(self.device_info.device_id), self.thread
    ), []


@_rule(pallas_primitives.semaphore_read_p)
def _semaphore_read(self, eqn, token, invals):
    semaphore, transforms = jax.tree.unflatten(eqn.params["args_tree"], invals)
    read = functools.partial(_read_semaphore, shape=_semaphore_shape(eqn))
    token, value = io_callback(read, (_TOKEN, jax.ShapeDtypeStruct((), jnp.int32)), token, semaphore, transforms)
    return token, [value]


@_rule(gpu_primitives.multimem_store_p)
def _multimem_store(self, eqn, token, invals):
    _whole_mesh(self, eqn.params["collective_axes"], "multimem_store", NotImplementedError, _MULTIMEM_AXES)
    value, key_array, *leaves = invals
    tree = eqn.params["transforms_tree"]
    transforms = () if tree is None else jax.tree.unflatten(tree, leaves)
    store = functools.partial(_store_everywhere, num_devices=self.device_info.num_devices, source_info=eqn.source_info)
    return io_callback(store, _TOKEN, token, key_array, transforms, value, self.thread), []


@_rule(gpu_primitives.multimem_load_reduce_p)
def _multimem_load_reduce(self, eqn, token, invals):
    _whole_mesh(self, eqn.params["collective_axes"], "multimem_load_reduce", NotImplementedError, _MULTIMEM_AXES)
    key_array, *leaves = invals
    tree = eqn.params["tree"]
    transforms = () if tree is None else jax.tree.unflatten(tree, leaves)
    out = eqn.outvars[0].aval
    load = functools.partial(
        _load_reduced, num_devices=self.device_info.num_devices, reduction=eqn.params["reduction_op"], dtype=out.dtype,
        source_info=eqn.source_info,
    )
    token, value = io_callback(load, (_TOKEN, out), token, key_array, transforms, self.thread)
    return token, [value]


@_rule(pallas_primitives.get_global_p)
def _get_global(self, eqn, token, invals):
    what = eqn.params["what"]
    allocate = functools.partial(_global_semaphore, uid=next(_GLOBAL_IDS), shape=tuple(what.shape))
    token, key_array = io_callback(
        allocate, (_TOKEN, gpu_memory.HostAllocationKey.shape_and_dtype()), token, jnp.int32(self.device_info.device_id)
    )
    return token, [key_array]


# ------------------------------------------------------------------------------------------------
# Installing: ten patches of JAX's GPU interpreter, once per process

_INSTALL_LOCK = threading.Lock()
_ORIGINALS: dict[str, Any] = {}


def _zeroed_semaphores(original):
    """Semaphores are int32 words, zero at launch as Mosaic GPU guarantees (JAX allocates none)."""

    @functools.wraps(original)
    def get_uninitialized_array(shape, dtype, memory_space, uninitialized_memory):
        if jnp.issubdtype(dtype, pallas_core.semaphore_dtype):
            return jnp.zeros(shape, jnp.int32)
        return original(shape, dtype, memory_space, uninitialized_memory)

    return get_uninitialized_array


@gpu_callbacks.fail_on_exception
def _meet_every_device(token):
    """Every device waits for the others: Mosaic GPU's barrier before a launch, and before its outputs are read."""
    memory = gpu_callbacks._get_shared_memory()
    if memory.num_devices > 1:
        try:
            memory.barrier.wait()
        except threading.BrokenBarrierError:
            memory.check_failed()  # a failing device broke it: raise that device's error, not the barrier's
            raise
    return token


def _with_device_barrier(original):
    @functools.wraps(original)
    def update_clocks_for_device_barrier(token, device):
        return _meet_every_device(original(token, device))

    return update_clocks_for_device_barrier


def _keeping_other_devices_state(original):
    """JAX resets every device's per-cluster state after each grid point: with peers still running, skip it."""

    @functools.wraps(original)
    def cluster_finished(*, token):
        if gpu_callbacks._get_shared_memory().num_devices > 1:
            return token
        return original(token=token)

    return cluster_finished


DEFAULT_POOL = 48  # XLA's CPU pool without PJRT_NPROC, as a resident grid sees it (jax 0.12, measured)


def thread_pool() -> int:
    """The size of XLA's CPU thread pool, on which a kernel's interpreter threads wait in callbacks:
    PJRT_NPROC (or NPROC) when JAX started, else DEFAULT_POOL."""
    for name in ("PJRT_NPROC", "NPROC"):
        value = os.environ.get(name, "")
        if value.strip().isdigit():
            return int(value)
    return DEFAULT_POOL


def _resident(mesh, num_devices: int):
    """(`mesh` with its grid run as blocks of one cluster, all at once, where a GPU keeps them
    resident; how the grid's blocks run, for the timeout's message).

    JAX's interpreter runs a kernel's grid points one after another (only a cluster's blocks and their
    warpgroups run as threads), so a persistent kernel whose blocks wait on each other's signals (the
    collective matmul waits for one signal per SM) waits forever. On a GPU a grid of at most one block
    per SM runs at once: such a grid becomes the leading cluster axes here (`lax.axis_index` of a grid
    axis reads the block's coordinate instead). A larger grid, or one whose threads on every device
    outnumber what XLA's CPU pool holds (thread_pool), still runs point after point."""
    if not isinstance(mesh, gpu_core.Mesh) or math.prod(mesh.grid) <= 1:
        return mesh, ""  # one block (or a pallas_call grid, which JAX's interpreter runs point by point)
    blocks = math.prod(mesh.grid)
    threads = num_devices * blocks * math.prod(mesh.cluster) * (mesh.num_threads or 1)
    if blocks > _CORE_COUNT[0]:
        return mesh, (f"the grid's {blocks} blocks run one after another: more than the device's core_count "
                      f"({_CORE_COUNT[0]}), as a GPU runs more blocks than SMs in waves")
    if 2 * threads > thread_pool():  # a pool of just the threads hung at times (benchmarks/RESULTS.md)
        return mesh, (f"the grid's {blocks} blocks run one after another: all resident, {threads} threads "
                      f"(devices x blocks x warpgroups) would wait at once on XLA's CPU pool of {thread_pool()}, "
                      f"which needs twice as many; set PJRT_NPROC={2 * threads} (or more) before JAX starts, or "
                      "a smaller core_count")
    folded = copy.copy(mesh)  # not dataclasses.replace: its check allows 3 cluster axes, a GPU's limit
    for name, value in (("grid", ()), ("grid_names", ()), ("cluster", (*mesh.grid, *mesh.cluster)),
                        ("cluster_names", (*mesh.grid_names, *mesh.cluster_names))):
        object.__setattr__(folded, name, value)
    return folded, f"the grid's {blocks} blocks are resident at once, as on a GPU"


_PER_DEVICE = 24  # threads' computations on one CPU device: XLA lets 32 run at once, the rest wait in line
_ON_DEVICE: list[int] = []  # how many run on each CPU device now
_RUNNING: set[int] = set()  # the Python threads that run one now
_ON_DEVICE_LOCK = threading.Lock()


def _spread(original):
    """JAX's thread_map runs each thread's part of a kernel as a computation on the default device,
    but XLA runs at most 32 computations of one CPU device at once: a kernel of more threads (a resident
    grid of 4 blocks of 3 warpgroups on 4 devices: 48) leaves the rest queued behind threads that wait
    for them, forever. Each thread's computation goes to the first CPU device with room."""

    @functools.wraps(original)
    def run_jaxpr(jaxpr, consts, *args):
        devices = jax.local_devices(backend="cpu")
        with _ON_DEVICE_LOCK:
            _ON_DEVICE.extend([0] * (len(devices) - len(_ON_DEVICE)))
            index = next((i for i, n in enumerate(_ON_DEVICE) if n < _PER_DEVICE),
                         min(range(len(devices)), key=_ON_DEVICE.__getitem__))
            _ON_DEVICE[index] += 1
            _RUNNING.add(threading.get_ident())
        try:
            with jax.default_device(devices[index]):
                return original(jaxpr, consts, *args)
        finally:
            with _ON_DEVICE_LOCK:
                _ON_DEVICE[index] -= 1
                _RUNNING.discard(threading.get_ident())

    return run_jaxpr


def _with_gmem_scratch(original):
    """JAX's collection of a pallas_call's kernel buffers, plus GMEM scratch (a semaphore in
    `scratch_shapes`), which JAX's asserts is an input or an output: a zeroed buffer per device."""

    @functools.wraps(original)
    def get_kernel_buffers(token, device, num_threads, grid_mapping, invars, arg_transforms, *rest):
        first = grid_mapping.num_inputs + grid_mapping.num_outputs
        scratch = [i for i, var in enumerate(invars)
                   if i >= first and gpu_callbacks.is_gmem_memory_space(var.aval.memory_space)]
        if not scratch:
            return original(token, device, num_threads, grid_mapping, invars, arg_transforms, *rest)
        kept = [i for i in range(len(invars)) if i not in scratch]
        transforms = [arg_transforms[i] for i in kept] if arg_transforms else arg_transforms
        token, keys = original(token, device, num_threads, grid_mapping, [invars[i] for i in kept], transforms, *rest)
        found = dict(zip(kept, keys))
        for i in scratch:
            aval = invars[i].aval
            token, request = gpu_callbacks.call_make_allocation_request_array(
                token=token, compute_unit=device, initial_ref_count=num_threads,
                memory_space_id=gpu_memory.get_memory_space_idx(gpu_core.MemorySpace.GMEM))
            zeros = jnp.zeros(aval.shape, jnp.int32 if jnp.issubdtype(aval.dtype, pallas_core.semaphore_dtype)
                              else aval.dtype)
            token, found[i] = gpu_callbacks.call_allocate_buffer_for_all_threads(token, None, device, request, zeros)
        return token, [found[i] for i in range(len(invars))]

    return get_kernel_buffers


def _for_iris(original):
    """JAX's collection of a kernel's buffers, then what iris keeps of them: a semaphore from
    plgpu.alloc_semaphore takes the count it ended its last launch with (_adopt_semaphores) and, with race
    detection, each buffer's name for the reports (_name_buffers)."""

    @functools.wraps(original)
    def get_kernel_buffers(token, device, num_threads, grid_mapping, invars, *rest):
        token, keys = original(token, device, num_threads, grid_mapping, invars, *rest)
        semaphores = [keys[i] for i in range(grid_mapping.num_inputs)
                      if jnp.issubdtype(invars[i].aval.dtype, pallas_core.semaphore_dtype)]
        if semaphores:
            token = io_callback(_adopt_semaphores, _TOKEN, token, jnp.stack(semaphores))
        if rest[-1].detect_races and keys:  # JAX's InterpretGPUParams
            names = _buffer_names(_kernel_params(_LAUNCH.jaxpr), grid_mapping, len(keys))
            token = io_callback(functools.partial(_name_buffers, names=names), _TOKEN, token, jnp.stack(keys))
        return token, keys

    return get_kernel_buffers


def _kernel_params(jaxpr) -> tuple[str, ...] | None:
    """The kernel body's parameter names: the jaxpr's own, or where plgpu.kernel's wrapper took them as
    `*refs`, those of the body function that the first of its equations came from (its code object)."""
    names = getattr(jaxpr.debug_info, "arg_names", None)
    if names and all(name.isidentifier() for name in names):
        return tuple(names)
    body = getattr(jaxpr.debug_info, "func_name", None)
    for eqn in _equations(jaxpr):
        try:
            codes, _ = eqn.source_info.traceback.raw_frames()
        except AttributeError:  # no traceback kept
            continue
        for code in codes:
            if code.co_name == body and not code.co_flags & inspect.CO_VARARGS:
                return tuple(code.co_varnames[: code.co_argcount])
    return None


def _equations(jaxpr, depth: int = 3):
    """The jaxpr's equations, then those of the jaxprs in their parameters (run_scoped's body), to `depth`."""
    yield from jaxpr.eqns
    if depth:
        for eqn in jaxpr.eqns:
            for value in eqn.params.values():
                inner = getattr(value, "jaxpr", value)
                if isinstance(inner, jax_core.Jaxpr):
                    yield from _equations(inner, depth - 1)


def _buffer_names(arg_names, grid_mapping, count: int) -> tuple[str, ...]:
    """Each kernel buffer's name: the kernel's parameter, or its place (plgpu.kernel's body takes *refs)."""
    names = []
    for i in range(count):
        if arg_names and i < len(arg_names):
            names.append(arg_names[i])
        elif i < grid_mapping.num_inputs:
            names.append(f"input {i}")
        elif i < grid_mapping.num_inputs + grid_mapping.num_outputs:
            names.append(f"output {i - grid_mapping.num_inputs}")
        else:
            names.append(f"scratch {i - grid_mapping.num_inputs - grid_mapping.num_outputs}")
    return tuple(names)


@gpu_callbacks.fail_on_exception
def _name_buffers(token, keys, *, names: tuple[str, ...]):
    memory = gpu_callbacks._get_shared_memory()
    with memory.lock:
        found = memory.__dict__.setdefault("_iris_names", {})
        for key, name in zip(np.asarray(keys), names):
            found[_key(key)] = name
    return token


# plgpu.alloc_semaphore's semaphores, by handle: each keeps its count between launches, as its GMEM words do
# on a GPU (JAX's interpreter copies a kernel's inputs in and drops them after)
_SEMAPHORES: dict[int, np.ndarray] = {}
_SEMAPHORES_LOCK = threading.Lock()
_HANDLES = itertools.count(1 << 24)  # far from any count a kernel reaches


def _new_semaphore(*, shape: tuple[int, ...]):
    with _SEMAPHORES_LOCK:
        handle = next(_HANDLES)
        _SEMAPHORES[handle] = np.zeros(shape, np.int32)
    return np.int32(handle)


def _simulated_alloc_semaphore(original):
    """plgpu.alloc_semaphore under GPU interpret mode: the semaphore's words hold a handle to a zeroed
    array that every launch given it works on (_adopt_semaphores), made anew each time the program runs."""

    @functools.wraps(original)
    def alloc_semaphore(shape: tuple[int, ...] = ()):
        if not isinstance(jax_config.pallas_tpu_interpret_mode_context_manager.value, gpu_params.InterpretGPUParams):
            return original(shape)
        shape = tuple(shape)
        handle = io_callback(functools.partial(_new_semaphore, shape=shape), jax.ShapeDtypeStruct((), jnp.int32))
        words = jax.lax.convert_element_type(jnp.full(shape, handle, jnp.int32), pallas_core.Semaphore())
        return jax_core.new_ref(words, memory_space=gpu_core.MemorySpace.GMEM)

    return alloc_semaphore


@gpu_callbacks.fail_on_exception
def _adopt_semaphores(token, keys):
    """Each semaphore input that holds a handle works on that handle's array from now on."""
    memory = gpu_callbacks._get_shared_memory()
    with memory.lock, _SEMAPHORES_LOCK:
        for key in map(_key, np.asarray(keys)):
            buffer = memory.mem[key]
            words = buffer.content.reshape(-1)
            kept = _SEMAPHORES.get(int(words[0])) if words.size else None
            if kept is not None and kept.shape == buffer.content.shape and (words == words[0]).all():
                memory.mem[key] = generic_memory.Buffer(kept, ref_count=buffer._ref_count,
                                                        logical_shape=buffer.logical_shape)
    return token


_COMMUNICATING = (gpu_primitives.semaphore_signal_parallel_p, gpu_primitives.semaphore_signal_multicast_p,
                  gpu_primitives.multimem_store_p, gpu_primitives.multimem_load_reduce_p)


def _communicates(jaxpr) -> bool:
    """Whether a kernel reaches another device (what Mosaic GPU's lowering asks of the module it built):
    a remote or multicast ref among an op's transforms, a signal with a device id, multimem."""
    for eqn in jaxpr.eqns:
        if eqn.primitive in _COMMUNICATING:
            return True
        if eqn.primitive in (pallas_primitives.semaphore_signal_p, gpu_primitives.semaphore_signal_p):
            if jax.tree.unflatten(eqn.params["args_tree"], eqn.invars)[3] is not None:  # its device_id
                return True
        for value in eqn.params.values():
            for item in value if isinstance(value, tuple) else (value,):
                item = getattr(item, "jaxpr", item)  # a closed jaxpr's own
                if isinstance(item, jax_core.Jaxpr) and _communicates(item):
                    return True
                if isinstance(item, jax.tree_util.PyTreeDef) and _holds(item):
                    return True
    return False


_MESH = threading.local()  # the concrete mesh of the kernel being lowered, on the lowering thread


def _recording_the_mesh(original):
    """pallas_call's lowering (which interprets the kernel in GPU interpret mode) with the concrete mesh
    of its shard_map kept for the interpreter, which sees only the mesh's sizes (_refuse_permuted_mesh)."""

    @functools.wraps(original)
    def lowering(ctx, *args, **params):
        axis_context = ctx.module_context.axis_context
        if isinstance(params.get("interpret"), gpu_params.InterpretGPUParams):
            _refuse_partially_manual(axis_context, params)
        previous, _MESH.mesh = getattr(_MESH, "mesh", None), getattr(axis_context, "mesh", None)
        try:
            return original(ctx, *args, **params)
        finally:
            _MESH.mesh = previous

    return lowering


def _refuse_partially_manual(axis_context, params) -> None:
    """A kernel in a shard_map that leaves some mesh axes automatic: XLA runs no callback there (and so no
    interpreted kernel), and what a GPU does with such a kernel is not yet known here; say so, before
    anything runs, instead of XLA's message."""
    manual, mesh = getattr(axis_context, "manual_axes", None), getattr(axis_context, "mesh", None)
    if not manual or mesh is None or set(manual) == set(mesh.axis_names):
        return
    automatic = [name for name in mesh.axis_names if name not in manual]
    shown = ", ".join(f"{name!r}: {size}" for name, size in mesh.shape.items())
    raise NotImplementedError(
        f"iris's Mosaic GPU simulator: kernel {params.get('name')!r} is in a partially manual shard_map (manual "
        f"axes {sorted(manual)}, automatic {automatic} of the mesh {{{shown}}}), which it does not run yet: make "
        "every mesh axis manual (jax.shard_map without axis_names, or naming them all) around the kernel."
    )


def _refuse_permuted_mesh(jaxpr) -> None:
    """Mosaic GPU's lowering refuses a kernel that reaches other devices under a mesh whose devices are not
    in row-major id order (its device ids are NVSHMEM's PE ids): the same error, before anything runs."""
    ids = getattr(getattr(_MESH, "mesh", None), "device_ids", None)
    if ids is not None and not np.array_equal(np.ravel(ids), np.arange(np.size(ids))) and _communicates(jaxpr):
        raise NotImplementedError(
            "Mosaic GPU only supports meshes with device ordering that follows row-major device ids. "
            f"Got: {np.ravel(ids)} device ids."
        )


def _launching(original):
    """JAX's interpret_pallas_call with the kernel's name kept on the lowering thread while JAX
    interprets it (for error messages) and its grid resident where a GPU's would be (_resident)."""

    @functools.wraps(original)
    def interpret_pallas_call(*args, **params):
        _refuse_permuted_mesh(params["jaxpr"])
        previous = _LAUNCH.__dict__.copy()
        _LAUNCH.name = params.get("name")
        _LAUNCH.jaxpr = params["jaxpr"]  # its parameters name the buffers in race reports (_for_iris)
        params["mesh"], _LAUNCH.blocks = _resident(params.get("mesh"), jaxpr_interpret.DeviceInfo().num_devices)
        try:
            return original(*args, **params)
        finally:
            _LAUNCH.__dict__.clear()
            _LAUNCH.__dict__.update(previous)

    return interpret_pallas_call


def install() -> None:
    """Puts iris's rules into JAX's GPU interpreter; idempotent and thread-safe."""
    with _INSTALL_LOCK:
        if _ORIGINALS:
            return
        _ORIGINALS.update(
            get_uninitialized_array=jaxpr_interpret.get_uninitialized_array,
            JaxprInterpreter=jaxpr_interpret.JaxprInterpreter,
            update_clocks=gpu_callbacks._update_clocks_for_device_barrier,
            cluster_finished=gpu_callbacks.cluster_finished,
            interpret_pallas_call=gpu_interpret_call.interpret_pallas_call,
            kernel_buffers=gpu_interpret_call._get_kernel_buffers,
            lowering=pallas_call_module._pallas_call_lowering,
            races=gpu_callbacks.GPURaceDetectionState,
            run_jaxpr=thread_map._run_jaxpr,
            alloc_semaphore=gpu_core.alloc_semaphore,
        )
        jaxpr_interpret.get_uninitialized_array = _zeroed_semaphores(_ORIGINALS["get_uninitialized_array"])
        jaxpr_interpret.JaxprInterpreter = IrisJaxprInterpreter  # looked up when each kernel is interpreted
        gpu_callbacks._update_clocks_for_device_barrier = _with_device_barrier(_ORIGINALS["update_clocks"])
        gpu_callbacks.cluster_finished = _keeping_other_devices_state(_ORIGINALS["cluster_finished"])
        gpu_interpret_call.interpret_pallas_call = _launching(_ORIGINALS["interpret_pallas_call"])
        gpu_interpret_call._get_kernel_buffers = _for_iris(_with_gmem_scratch(_ORIGINALS["kernel_buffers"]))
        # looked up by attribute when a user's program allocates one (plgpu.alloc_semaphore)
        gpu_core.alloc_semaphore = plgpu_module.alloc_semaphore = _simulated_alloc_semaphore(
            _ORIGINALS["alloc_semaphore"])
        # the lowering is found by name (plgpu.kernel's mpmd_map) and through pallas_call_p's rule
        pallas_call_module._pallas_call_lowering = _recording_the_mesh(_ORIGINALS["lowering"])
        mlir.register_lowering(pallas_call_module.pallas_call_p, pallas_call_module._pallas_call_lowering)
        gpu_callbacks.GPURaceDetectionState = _RaceState  # made by the first launch with detect_races
        thread_map._run_jaxpr = _spread(_ORIGINALS["run_jaxpr"])


DEFAULT_CORE_COUNT = 132  # an H100 SXM's SMs
_CORE_COUNT = [DEFAULT_CORE_COUNT]


def set_core_count(count: int | None) -> int:
    """What CPU devices report as `core_count` from now on (None: DEFAULT_CORE_COUNT); returns the
    count before. Mosaic GPU ops read it (`jax.devices()[0].core_count`, `backend.get_default_device()`)
    as their default block count; CPU devices have none. Installed as a property of JAX's device class
    that answers for CPU devices only (a GPU's own attribute is looked up as before)."""
    count = DEFAULT_CORE_COUNT if count is None else count
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"core_count must be a positive int, got {count!r}")
    device_class = type(jax.devices("cpu")[0])
    if not isinstance(device_class.__dict__.get("core_count"), _CoreCount):
        device_class.core_count = _CoreCount(getattr(device_class, "__getattr__", None))
    before, _CORE_COUNT[0] = _CORE_COUNT[0], count
    return before


class _CoreCount:
    """`device.core_count`: the simulated count for a CPU device, the device's own attribute otherwise."""

    def __init__(self, lookup):
        self.lookup = lookup

    def __get__(self, device, owner=None):
        if device is None:
            return self
        if device.platform == "cpu":
            return _CORE_COUNT[0]
        if self.lookup is None:
            raise AttributeError("core_count")
        return self.lookup(device, "core_count")


def installed() -> bool:
    """Whether install() has run in this process."""
    return bool(_ORIGINALS)


def interpret_params(timeout_s: float | None = None, **params: Any) -> InterpretGPUParams:
    """GPU interpret mode's parameters with iris's semaphore timeout (`params`: JAX's InterpretGPUParams fields)."""
    timeout_s = DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
    return InterpretGPUParams(semaphore_timeout_s=float(timeout_s), **params)


set_interpret_mode = gpu_params.set_gpu_interpret_mode
interpret_mode = gpu_params.force_gpu_interpret_mode


def reset_state() -> None:
    """Clears JAX's interpreter state and the failed launch's ordered-effect tokens (which would re-raise its error)."""
    gpu_callbacks.reset_gpu_interpret_mode_state()
    dispatch.runtime_tokens.clear()
    with _SEMAPHORES_LOCK:
        _SEMAPHORES.clear()
