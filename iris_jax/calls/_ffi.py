"""Python functions as XLA FFI custom-call targets (ctypes, no compiled code).

XLA calls a handler with an `XLA_FFI_CallFrame` (xla/ffi/api/c_api.h). `register_cpu_target`
reads the buffer pointers of the operands and results and hands them to a Python callable;
it runs on the device's own thread, so the devices of one program call concurrently.
`register_staged_target` (the GPU fault gate) is called at the prepare and execute stages
of every execution with the call's stream. `register_capturable` registers a handler that XLA
may capture into its CUDA graphs (command buffers).
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import traceback
from collections.abc import Callable

import jax
from jax._src.lib import xla_client


class _Extension(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("type", ctypes.c_int), ("next", ctypes.c_void_p)]


class _ApiVersion(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("major", ctypes.c_int), ("minor", ctypes.c_int)]


class _Metadata(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("api_version", _ApiVersion),
                ("traits", ctypes.c_uint32), ("state_type_id", ctypes.c_int64)]


class _MetadataExtension(ctypes.Structure):
    _fields_ = [("base", _Extension), ("metadata", ctypes.POINTER(_Metadata))]


class _Buffers(ctypes.Structure):  # XLA_FFI_Args and XLA_FFI_Rets share this layout
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("size", ctypes.c_int64), ("types", ctypes.c_void_p),
                ("values", ctypes.POINTER(ctypes.c_void_p))]


class _Buffer(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("dtype", ctypes.c_int), ("data", ctypes.c_void_p), ("rank", ctypes.c_int64),
                ("dims", ctypes.POINTER(ctypes.c_int64))]


class _CallFrame(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.POINTER(_Extension)),
                ("api", ctypes.c_void_p), ("ctx", ctypes.c_void_p), ("stage", ctypes.c_int),
                ("args", _Buffers), ("rets", _Buffers)]


class _ErrorCreateArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("message", ctypes.c_char_p), ("errc", ctypes.c_int)]


_HANDLER = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_CallFrame))
_ERROR_CREATE = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_ErrorCreateArgs))
_METADATA_EXTENSION = 1
PREPARE, EXECUTE = 1, 3  # XLA_FFI_ExecutionStage
_EXECUTE = EXECUTE
_UNKNOWN_ERROR = 2
# Offset of XLA_FFI_Error_Create in XLA_FFI_Api: struct_size, extension_start,
# XLA_FFI_Api_Version (24 bytes), internal_api.
_ERROR_CREATE_OFFSET = 8 + 8 + ctypes.sizeof(_ApiVersion) + 8
# XLA_FFI_Api's functions after Error_Create, by position: Stream_Get, RunId_Get
_STREAM_GET, _RUN_ID_GET = 4, 16


class _QueryArgs(ctypes.Structure):  # XLA_FFI_Stream_Get_Args and XLA_FFI_RunId_Get_Args
    _fields_ = [("struct_size", ctypes.c_size_t), ("extension_start", ctypes.c_void_p),
                ("ctx", ctypes.c_void_p), ("value", ctypes.c_void_p)]


_QUERY = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_QueryArgs))

_keepalive: list = []
_counter = itertools.count()
_lock = threading.Lock()


_DATA = _Buffer.data.offset


def _buffer_pointers(buffers: _Buffers) -> list[int]:
    # each value is an XLA_FFI_Buffer*: its data pointer read in place (no ctypes.cast per
    # buffer, which every call of every device pays)
    values = buffers.values
    return [ctypes.c_void_p.from_address(values[i] + _DATA).value or 0 for i in range(buffers.size)]


def _error(api: int, message: str) -> int:
    create = _ERROR_CREATE(ctypes.c_void_p.from_address(api + _ERROR_CREATE_OFFSET).value)
    args = _ErrorCreateArgs(ctypes.sizeof(_ErrorCreateArgs), None, message.encode(), _UNKNOWN_ERROR)
    return create(ctypes.byref(args))


def register_cpu_target(prefix: str, fn: Callable[[list[int], list[int]], None]) -> str:
    """Registers `fn(operand_pointers, result_pointers)` as a CPU FFI target; returns its name.

    An exception raised by `fn` becomes the XLA error of the call (its message and the
    Python traceback), so it surfaces as a JaxRuntimeError from the jitted function.
    """

    def handler(frame_ptr):
        frame = frame_ptr.contents
        if _answered_metadata(frame):
            return None
        if frame.stage != _EXECUTE:
            return None
        keep_thread_state()
        try:
            fn(_buffer_pointers(frame.args), _buffer_pointers(frame.rets))
            return None
        except BaseException as e:  # never let an exception cross into XLA
            detail = "".join(traceback.format_exception(e))
            return _error(frame.api, f"{type(e).__name__}: {e}\n{detail}")

    return register_cpu_capsule(prefix, _capsule(handler))


class _Thread(threading.local):
    kept = False


_THREAD = _Thread()


def keep_thread_state() -> None:
    """Keeps the Python state of this thread (one of XLA's, which Python did not start) for the
    thread's life; called at a ctypes callback's entry. A ctypes callback makes one at its entry and
    frees it at its exit when the thread has none: every call of every device paid for both (an
    eighth of the host's time for a small kernel at 8 ranks, a third of a float pmax's in the host
    meeting). One more PyGILState_Ensure, never released, keeps it."""
    if _THREAD.kept:
        return
    ensure = ctypes.pythonapi.PyGILState_Ensure
    ensure.restype = ctypes.c_int
    ensure()
    _THREAD.kept = True


def register_cpu_capsule(prefix: str, capsule) -> str:
    """Registers a handler (a capsule) as a new CPU FFI target named `prefix`_N; returns the name."""
    with _lock:
        name = f"{prefix}_{next(_counter)}"
    jax.ffi.register_ffi_target(name, capsule, platform="cpu")
    return name


def register_staged_target(name: str, platform: str, fn: Callable[[int, int | None, int], str | None]) -> None:
    """Registers `fn(stage, run_id, stream)` as the FFI target `name` of `platform` (an XLA platform
    name), called at the PREPARE and EXECUTE stages of every execution with the execution's run id
    (None where XLA cannot say) and, at EXECUTE, the call's stream; at EXECUTE a message it returns
    fails the execution. Not capturable into command buffers: it
    runs on the host every time. Its results must alias its operands (no copy is made)."""

    def handler(frame_ptr):
        frame = frame_ptr.contents
        if _answered_metadata(frame):
            return None
        try:
            stream = _query(frame, _STREAM_GET) if frame.stage == EXECUTE else None
            message = fn(frame.stage, _query(frame, _RUN_ID_GET), stream)
        except BaseException as e:  # never let an exception cross into XLA
            message = f"{type(e).__name__}: {e}\n" + "".join(traceback.format_exception(e))
        return _error(frame.api, message) if message else None

    capsule = _capsule(handler)
    jax.ffi.register_ffi_target(name, {"prepare": capsule, "execute": capsule}, platform=platform)


def register_capturable(name: str, handler, platform: str) -> Exception | None:
    """Registers `handler` (a capsule, or a dict of them by stage) as the FFI target `name`,
    command-buffer compatible; returns why not where jaxlib refuses handler traits (jaxlib 0.10
    says "does not support custom call traits"), having registered nothing."""
    try:
        jax.ffi.register_ffi_target(name, handler, platform=platform,
                                    traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE)
    except Exception as e:  # any refusal: the caller keeps a host step
        return e
    return None


def _answered_metadata(frame) -> bool:
    """Answers XLA's metadata query (API version, no traits) when that is what `frame` is."""
    if not (frame.extension_start and frame.extension_start.contents.type == _METADATA_EXTENSION):
        return False
    ext = ctypes.cast(frame.extension_start, ctypes.POINTER(_MetadataExtension)).contents
    ext.metadata.contents.api_version.major = 0
    ext.metadata.contents.api_version.minor = 1
    ext.metadata.contents.traits = 0
    return True


def _query(frame, function: int) -> int | None:
    """What XLA_FFI_Api's query `function` (_STREAM_GET: the platform stream, a CUstream on CUDA;
    _RUN_ID_GET: the execution's run id) says of the call; None where this XLA lacks it."""
    offset = _ERROR_CREATE_OFFSET + 8 * function
    if ctypes.c_size_t.from_address(frame.api).value < offset + 8:
        return None
    query = _QUERY(ctypes.c_void_p.from_address(frame.api + offset).value)
    args = _QueryArgs(ctypes.sizeof(_QueryArgs), None, frame.ctx, None)
    if query(ctypes.byref(args)):
        return None
    return args.value or 0


def _capsule(handler):
    """A PyCapsule holding a C pointer to `handler` (kept alive for the process)."""
    c_handler = _HANDLER(handler)
    with _lock:
        _keepalive.append(c_handler)
    return capsule_at(ctypes.cast(c_handler, ctypes.c_void_p).value)


def capsule_at(address: int):
    """A PyCapsule holding the C function pointer `address`, as register_ffi_target takes it."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(address, b"xla._CUSTOM_CALL_TARGET", None)
