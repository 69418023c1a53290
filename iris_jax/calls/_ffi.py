"""A Python function as an XLA:CPU FFI custom-call target (ctypes, no compiled code).

XLA calls the handler with an `XLA_FFI_CallFrame` (xla/ffi/api/c_api.h); we read the
buffer pointers of the operands and results and hand them to a Python callable. Runs
on the device's own thread, so the devices of one program call concurrently.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
import traceback
from collections.abc import Callable

import jax


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
_EXECUTE = 3
_UNKNOWN_ERROR = 2
# Offset of XLA_FFI_Error_Create in XLA_FFI_Api: struct_size, extension_start,
# XLA_FFI_Api_Version (24 bytes), internal_api.
_ERROR_CREATE_OFFSET = 8 + 8 + ctypes.sizeof(_ApiVersion) + 8

_keepalive: list = []
_counter = itertools.count()
_lock = threading.Lock()


def _buffer_pointers(buffers: _Buffers) -> list[int]:
    return [ctypes.cast(buffers.values[i], ctypes.POINTER(_Buffer)).contents.data or 0
            for i in range(buffers.size)]


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
        if frame.extension_start and frame.extension_start.contents.type == _METADATA_EXTENSION:
            ext = ctypes.cast(frame.extension_start, ctypes.POINTER(_MetadataExtension)).contents
            ext.metadata.contents.api_version.major = 0
            ext.metadata.contents.api_version.minor = 1
            ext.metadata.contents.traits = 0
            return None
        if frame.stage != _EXECUTE:
            return None
        try:
            fn(_buffer_pointers(frame.args), _buffer_pointers(frame.rets))
            return None
        except BaseException as e:  # never let an exception cross into XLA
            detail = "".join(traceback.format_exception(e))
            return _error(frame.api, f"{type(e).__name__}: {e}\n{detail}")

    c_handler = _HANDLER(handler)
    capsule = ctypes.pythonapi.PyCapsule_New
    capsule.restype = ctypes.py_object
    capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    with _lock:
        name = f"{prefix}_{next(_counter)}"
        _keepalive.append(c_handler)
    jax.ffi.register_ffi_target(
        name, capsule(ctypes.cast(c_handler, ctypes.c_void_p).value, b"xla._CUSTOM_CALL_TARGET", None),
        platform="cpu")
    return name
