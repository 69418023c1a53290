"""Triton compatibility: `@aggregate` that also works under the interpreter.

Triton's `_aggregate` copies only compiled-JIT members onto the value class, so under
TRITON_INTERPRET=1 (where `@triton.jit` yields InterpretedFunction) every method would
be lost. Under the interpreter an aggregate is just a Python object, so there we keep
the class and make each interpreted function bind `self` like a method.
"""

from __future__ import annotations

import functools
import os

import triton
from triton.language import core as tl_core


def interpreting() -> bool:
    """True when Triton runs kernels under its interpreter (the CPU simulator)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") == "1"  # pragma: no cover


class _Method:
    """Descriptor that binds an interpreted device function to its aggregate instance."""

    def __init__(self, fn):
        self.fn = fn

    def __get__(self, obj, objtype=None):
        return self.fn if obj is None else functools.partial(self.fn, obj)


def aggregate(cls):
    """Class decorator: a Triton aggregate (struct of tensors with @triton.jit methods)."""
    if not interpreting():
        return tl_core._aggregate(cls)
    from triton.runtime.interpreter import InterpretedFunction

    for name, member in list(vars(cls).items()):
        if isinstance(member, InterpretedFunction):
            setattr(cls, name, _Method(member))
    # the interpreter's constexprs are plain values (Python ints, not `constexpr`, meet in `t % G`)
    constexprs = [name for name, kind in cls.__annotations__.items() if kind in (tl_core.constexpr, "tl.constexpr")]
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        for name in constexprs:
            setattr(self, name, tl_core._unwrap_if_constexpr(getattr(self, name)))

    cls.__init__ = __init__
    return cls
