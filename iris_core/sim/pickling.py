"""Pickling for work sent to simulated ranks: cloudpickle plus Triton kernels.

A JITFunction holds locks and compiled state and does not pickle. A kernel travels as
its module, name and Python function; the receiving process takes its own copy of the
module's kernel (built under the interpreter there) or re-decorates the function.

Most messages (a kernel call's pointers and names, its function by reference) need nothing
of cloudpickle's: they go through the standard C pickler, and only a message holding a
function or class that the receiver could not import by name (a script's, a closure) is
pickled again by cloudpickle (its Python pickler was a third of a kernel call's cost in the sender).
"""

from __future__ import annotations

import importlib
import io
import pickle
import types

import cloudpickle
import triton
from triton.runtime.jit import JITFunction

_KERNEL_TYPES: tuple = (JITFunction,)
try:
    from triton.runtime.interpreter import InterpretedFunction

    _KERNEL_TYPES += (InterpretedFunction,)
except ImportError:  # pragma: no cover
    pass

_REBUILT: dict = {}


def _rebuild_named_kernel(module: str, qualname: str, pickled_fn: bytes):
    """A kernel that its module names: the module's own here; its function, pickled once by the
    sender, is unpickled only where the module's kernel cannot be found here."""
    key = (module, qualname, pickled_fn)
    if key not in _REBUILT:
        kernel = _named(module, qualname)
        _REBUILT[key] = kernel if isinstance(kernel, _KERNEL_TYPES) else triton.jit(loads(pickled_fn))
    return _REBUILT[key]


def _rebuild_pickled_kernel(pickled_fn: bytes):
    """The kernel of a function pickled by value, built once per function here."""
    if pickled_fn not in _REBUILT:
        _REBUILT[pickled_fn] = triton.jit(loads(pickled_fn))
    return _REBUILT[pickled_fn]


def _named(module: str, qualname: str):
    try:
        found = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return found


# kernels found under their module and name -> their function pickled (by value: the module's
# attribute is the kernel, not the function); pickling it again at every call took most of a
# call's time in the sending process
_PICKLED_FNS: dict = {}


def _reduce_kernel(kernel):
    fn = kernel.fn
    if kernel not in _PICKLED_FNS:
        _PICKLED_FNS[kernel] = dumps(fn)
    if _found_as(fn, kernel):
        return _rebuild_named_kernel, (fn.__module__, fn.__qualname__, _PICKLED_FNS[kernel])
    # a kernel no module names (a script's, a closure): its function pickled once, so that the
    # receiver builds the kernel once (a function unpickled anew at every call was a new kernel,
    # analysed again by the interpreter at every launch)
    return _rebuild_pickled_kernel, (_PICKLED_FNS[kernel],)


def _found_as(obj, expected) -> bool:
    """Whether the receiver finds `expected` under `obj`'s module and name (a module it can import)."""
    return obj.__module__ != "__main__" and _named(obj.__module__, obj.__qualname__) is expected


class _Pickler(cloudpickle.CloudPickler):
    def reducer_override(self, obj):
        if isinstance(obj, _KERNEL_TYPES):
            return _reduce_kernel(obj)
        return super().reducer_override(obj)


class _ByValue(Exception):
    """Raised by _FastPickler for an object only cloudpickle pickles as the receiver needs."""


class _FastPickler(pickle.Pickler):
    # called for objects other than the builtin scalars and containers (C's pickler checks those first)
    def reducer_override(self, obj):
        if isinstance(obj, _KERNEL_TYPES):
            return _reduce_kernel(obj)
        if isinstance(obj, (types.FunctionType, type)) and not _found_as(obj, obj):
            raise _ByValue
        return NotImplemented


def dumps(obj) -> bytes:
    buffer = io.BytesIO()
    try:
        _FastPickler(buffer, protocol=5).dump(obj)
    except Exception:  # _ByValue, or what only cloudpickle pickles (code, lambdas, modules, ...)
        buffer = io.BytesIO()
        _Pickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


loads = cloudpickle.loads
