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
  that runs whatever the data (lowered outside any `cond`, `while` or nested function: an
  *anchor*) counts itself at XLA's PREPARE stage, which comes before every EXECUTE of an
  execution; a gate leaves the wait to a later one only while an anchor is still to run, so
  the last anchor waits, and a gate inside control flow after it waits itself. One hole: JAX
  lowers a jitted function once per program, so a jitted function holding an iris call, used
  both outside and (with the same shapes) inside a `cond` or `while_loop` of one program,
  carries anchors into the control flow; a step whose branch skips it may then hand back a
  failed call's outputs. Use "call" for such programs;
* "call": every gate (a host wait after each iris kernel: the error as early as possible);
* "off": no gate is lowered; faults are named only by the watchdog and iris's entry points
  (`iris_jax.block_until_ready`, `check_faults`, the next iris call).

The simulator needs no gate: its kernels raise, which fails the execution in the same way.
"""

from __future__ import annotations

import functools
import sys
import threading

import jax

from iris_core.platform import GPU
from iris_jax import _runtime as runtime_lib
from iris_jax.calls import _ffi

TARGET = "iris_fault_gate"  # an anchor: lowered where it runs once per execution
NESTED_TARGET = "iris_fault_gate_nested"  # inside control flow or a nested function
# JAX's lowering rules of regions that may run zero or many times per execution (cond, switch,
# while, scan, fori_loop, map): a gate lowered beneath one of them is nested.
_CONTROL_FLOW_MODULES = ("/lax/control_flow/",)


class _Execution(threading.local):
    """This thread's execution as the gates see it: its run id and the gates not yet executed."""

    run_id: int | None = None
    pending: int = 0


_execution = _Execution()
waits = {"waited": 0, "passed": 0}  # gates that waited / that left the wait to a later gate (benchmarks read it)


def _gate(anchor: bool, stage: int, run_id: int | None, stream: int) -> str | None:
    """A gate's host step (iris_jax.calls._ffi.register_staged_target): an anchor counts itself
    at PREPARE; at EXECUTE a gate waits unless an anchor is still to run (or in "call" mode)."""
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
        waits["passed"] += 1
        return None
    waits["waited"] += 1
    error = rt.heap.outcome(stream)
    if error is None:
        return None
    ex.pending = 0  # XLA executes nothing more of this execution
    return f"{type(error).__name__}: {error}"


_registered: dict = {"lock": threading.Lock()}


def _register() -> None:
    with _registered["lock"]:
        if "done" not in _registered:
            _ffi.register_staged_target(TARGET, GPU.xla_platform, functools.partial(_gate, True))
            _ffi.register_staged_target(NESTED_TARGET, GPU.xla_platform, functools.partial(_gate, False))
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
    if runtime_lib.runtime().fault_gate == "off":
        return results
    _register()
    aliases = {i: i for i in range(len(results))}
    target = TARGET if _runs_once() else NESTED_TARGET
    return jax.ffi.ffi_lowering(target, operand_output_aliases=aliases, has_side_effect=True)(
        ctx.replace(avals_in=ctx.avals_out), *results)
