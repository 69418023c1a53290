"""The fault gate: on GPUs, the outputs of a program in which an iris kernel gave up are never values.

A GPU kernel that gives up (a peer that never came, a peer that gave up, ranks that disagree)
records why on its rank's fault page and exits, so that the CUDA context survives; its launch
completes, and XLA would hand back whatever its outputs held. The gate closes that hole: the
GPU lowering follows every iris kernel with it, an FFI call on the host whose results alias the
kernel's outputs (no copy, no kernel). Where the gate waits, it synchronizes the stream and
reads the fault page (iris_core.heap.cuda: CudaHeap.outcome); when the rank recorded a fault,
or the heap guard refused an access, it fails the execution with the named error. XLA then
fails every output of that execution, so JAX's own reads (`jax.block_until_ready`,
`np.asarray`, `float`, `jax.device_get`, printing, a later program that consumes one) raise
JaxRuntimeError carrying "PeerTimeoutError: iris all_reduce: ... on rank 1 ...".

Which gates wait (`init(fault_gate=...)`, environment IRIS_FAULT_GATE):

* "step" (default): one per execution, however many iris calls the jitted step holds (the
  host waits once for the step's iris kernels, as a `jax.block_until_ready` would). A gate
  that runs whatever the data (lowered outside `cond`, `switch`, `while_loop`, `scan` and the
  other control flow: an *anchor*) counts itself at XLA's PREPARE stage, which comes before every EXECUTE of an
  execution; a gate leaves the wait to a later one only while an anchor is still to run, so
  the last anchor waits, and a gate inside control flow after it waits itself. The anchors of
  one function form a chain (each takes the token of the one before): when a function's next
  anchor is lowered, the one before it becomes a *passed* gate, which XLA captures into its
  CUDA graph and which runs nothing. A host step cuts XLA's graph, so a function keeps one cut
  however many iris calls it holds, and its one anchor runs after every kernel of the
  function (the tokens order it so). One hole: JAX
  lowers a jitted function once per program, so a jitted function holding an iris call, used
  both outside and (with the same shapes) inside a `cond` or `while_loop` of one program,
  carries anchors into the control flow; a step whose branch skips it may then hand back a
  failed call's outputs. Use "call" for such programs;
* "call": every gate (a host wait after each iris kernel: the error as early as possible);
* "off": no gate is lowered; faults are named only by the watchdog and iris's entry points
  (`iris_jax.block_until_ready`, `check_faults`, the next iris call).

The host step is C (fault_gate.c, built with the system's C compiler on first use, as Triton
builds its launchers): XLA runs it on its own threads while the Python thread that dispatches
programs holds the GIL, so a Python handler would wait for the GIL at every call. Without a
compiler a Python handler does the same, slower (a warning says so).

The simulator needs no gate: its kernels raise, which fails the execution in the same way.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import threading

import jax
from jax._src import core
from jax._src.lib.mlir import ir
from jax._src.lib.mlir.dialects import hlo

from iris_core import faults
from iris_core.platform import GPU
from iris_jax import _runtime as runtime_lib
from iris_jax.calls import _ffi, c_build

TARGET = "iris_fault_gate"  # an anchor: lowered where it runs once per execution
NESTED_TARGET = "iris_fault_gate_nested"  # inside control flow
PASSED_TARGET = "iris_fault_gate_passed"  # an anchor that a later one of its function took over
_MODE_CODES = {"off": 0, "step": 1, "call": 2}  # fault_gate.c's
# JAX's lowering rules of regions that may run zero or many times per execution (cond, switch,
# while, scan, fori_loop, map): a gate lowered beneath one of them is nested.
_CONTROL_FLOW_MODULES = ("/lax/control_flow/",)


@functools.cache
def _built() -> ctypes.CDLL | None:
    """fault_gate.c as a shared library (c_build); None where it cannot be built."""
    layout = (f"-DSTATUS_COPY={faults.STATUS_COPY}", f"-DSLOTS_AT={faults.SLOTS_AT}", f"-DSLOT={faults.SLOT}",
              f"-DSLOTS={faults.SLOTS}")
    return c_build.build("fault_gate", flags=layout, what="the fault gate's host step",
                         instead="a Python gate (iris_jax.calls.fault_gate._python_gate)")


@functools.cache
def _library() -> ctypes.CDLL | None:
    """The fault gate's C step, started; None where it cannot be built or no CUDA driver loads."""
    lib = _built()
    if lib is None:
        return None
    lib.iris_gate_start.argtypes = [_FORMATTER]
    lib.iris_gate_set_device.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64]
    if lib.iris_gate_start(_format_for_c):
        return None
    return lib


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
def _format_for_c(device: int, buffer: int, size: int) -> None:
    """Writes the error a device's rank recorded into fault_gate.c's `buffer` (on a fault only)."""
    error = _recorded(device)
    message = f"{type(error).__name__}: {error}" if error else "iris: a kernel gave up (its record was taken)"
    encoded = message.encode()[:size - 1]
    ctypes.memmove(buffer, encoded + b"\0", len(encoded) + 1)


_FORMATTER = type(_format_for_c)


def _recorded(device: int) -> Exception | None:
    rt = runtime_lib.current()
    rank = None if rt is None else next((r for r, d in getattr(rt.heap, "devices", {}).items() if d == device), None)
    return None if rank is None else rt.heap.recorded(rank)


def waits() -> dict[str, int]:
    """How many gates waited and how many left the wait to a later gate, in this process (benchmarks)."""
    lib = _library()
    if lib is None:
        return dict(_python_waits)
    return {"waited": ctypes.c_int64.in_dll(lib, "iris_gate_waited").value,
            "passed": ctypes.c_int64.in_dll(lib, "iris_gate_passed").value}


class _Attachment:
    """The runtime's fault pages and mode, handed to the C step (a runtime service: closed with
    the runtime, so that no gate reads a freed page)."""

    def __init__(self, rt):
        self._lib, self._devices = _library(), dict(getattr(rt.heap, "devices", {}))
        if self._lib is None:
            return
        self._lib.iris_gate_set_mode(_MODE_CODES[rt.fault_gate])
        for rank, device in self._devices.items():
            words = rt.heap.fault_words(rank)
            if words is not None:
                self._lib.iris_gate_set_device(device, words.ctypes.data, rt.heap.status_address(rank))

    def close(self) -> None:
        if self._lib is not None:
            for device in self._devices.values():
                self._lib.iris_gate_set_device(device, None, 0)


# -- the Python step (no C compiler) ----------------------------------------------------------------
class _Execution(threading.local):
    """This thread's execution as the gates see it: its run id and the anchors still to run."""

    run_id: int | None = None
    pending: int = 0


_execution = _Execution()
_python_waits = {"waited": 0, "passed": 0}


def _python_gate(anchor: bool, stage: int, run_id: int | None, stream: int | None) -> str | None:
    """fault_gate.c's step in Python (iris_jax.calls._ffi.register_staged_target)."""
    ex = _execution
    if run_id is not None and run_id != ex.run_id:  # a new execution: an aborted one leaves no count behind
        ex.run_id, ex.pending = run_id, 0
    if stage == _ffi.PREPARE:
        ex.pending += anchor
        return None
    if anchor:
        ex.pending = max(ex.pending - 1, 0)
    rt = runtime_lib.current()
    if rt is None or (ex.pending and rt.fault_gate == "step"):
        _python_waits["passed"] += 1
        return None
    _python_waits["waited"] += 1
    error = rt.heap.outcome(stream)
    if error is None:
        return None
    ex.pending = 0  # XLA executes nothing more of this execution
    return f"{type(error).__name__}: {error}"


# -- lowering --------------------------------------------------------------------------------------
_registered: dict = {"lock": threading.Lock()}


def _register() -> None:
    with _registered["lock"]:
        if "done" in _registered:
            return
        lib = _library()
        for target, anchor in ((TARGET, True), (NESTED_TARGET, False)):
            if lib is not None:
                capsule = _ffi.capsule_at(ctypes.cast(getattr(lib, target), ctypes.c_void_p).value)
                jax.ffi.register_ffi_target(target, {"prepare": capsule, "execute": capsule},
                                            platform=GPU.xla_platform)
            else:
                _ffi.register_staged_target(target, GPU.xla_platform, functools.partial(_python_gate, anchor))
        if lib is None:  # a Python step that does nothing (XLA cannot capture it: a graph cut, no wait)
            _ffi.register_staged_target(PASSED_TARGET, GPU.xla_platform, lambda stage, run_id, stream: None)
        else:
            capsule = _ffi.capsule_at(ctypes.cast(lib.iris_fault_gate_passed, ctypes.c_void_p).value)
            if _ffi.register_capturable(PASSED_TARGET, capsule, GPU.xla_platform) is not None:
                # a host step that does nothing: correct, one graph cut per passed gate
                jax.ffi.register_ffi_target(PASSED_TARGET, capsule, platform=GPU.xla_platform)
        _registered["done"] = True


def _runs_once() -> bool:
    """Whether what is being lowered runs exactly once per execution: no lowering rule of control
    flow encloses it. (JAX lowers control flow's regions as separate functions, whose IR holds no
    trace of where they are used; its lowering rules on the call stack do.)"""
    frame = sys._getframe(1)
    while frame is not None:
        if any(m in frame.f_code.co_filename.replace("\\", "/") for m in _CONTROL_FLOW_MODULES):
            return False
        frame = frame.f_back
    return True


def gated(ctx, results):
    """`results` (the ir values of an iris kernel's outputs, typed ctx.avals_out) passed through a
    gate, when the runtime's mode lowers one; else `results` unchanged."""
    rt = runtime_lib.runtime()
    if rt.fault_gate == "off":
        return results
    _register()
    rt.service("fault_gate", _Attachment)
    if not _runs_once():
        return _gate(ctx, NESTED_TARGET, results)
    if rt.fault_gate == "call":
        return _gate(ctx, TARGET, results)
    return _chained_anchor(ctx, results)


def _gate(ctx, target, results, token=None):
    """A gate `target` whose results alias `results` (after a token, when one is given)."""
    values, avals = list(results), list(ctx.avals_out)
    if token is not None:
        values, avals = [token, *values], [core.abstract_token, *avals]
    aliases = {i: i for i in range(token is not None, len(values))}
    return jax.ffi.ffi_lowering(target, operand_output_aliases=aliases, has_side_effect=True)(
        ctx.replace(avals_in=avals, avals_out=avals), *values)


# The last anchor lowered in each function (its first result is the chain's token), per module
# being lowered: kept in a dict that lives as long as the module's lowering, JAX's cache of
# lowered primitives, which every context of one module shares.
_CHAINS = object()


def _chained_anchor(ctx, results):
    """An anchor after `results` that takes over the anchor lowered before it in this function (the
    one before becomes a passed gate) and takes its token: one host step per function."""
    chains = ctx.module_context.cached_primitive_lowerings.setdefault(_CHAINS, {})
    block = ir.InsertionPoint.current.block
    previous = chains.get(block)
    if previous is None:
        token = hlo.create_token()
    else:
        previous.attributes["call_target_name"] = ir.StringAttr.get(PASSED_TARGET)
        token = previous.results[0]
    token, *outputs = _gate(ctx, TARGET, results, token)
    chains[block] = token.owner
    return outputs
