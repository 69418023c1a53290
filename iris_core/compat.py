"""What differs between the Triton releases iris supports (3.6 to 3.9), and between Triton's
compiler and its interpreter, in one place (JAX's differences: iris_jax.compat).

* `@aggregate`: Triton's `_aggregate` copies only compiled-JIT members onto the value class,
  so under TRITON_INTERPRET=1 (where `@triton.jit` yields InterpretedFunction) every method
  would be lost. Under the interpreter an aggregate is just a Python object, so there we keep
  the class and make each interpreted function bind `self` like a method.
* `compile_for_launcher`: a kernel compiled through the GPU platform's own stages (the same
  calls on 3.6 and 3.9) down to what jaxlib's launcher takes (NVIDIA: PTX, which jaxlib
  assembles itself).
* The interpreter's builder (3.9 merged `cache_modifier`/`eviction_policy` into `cache_policy`
  and refuses masks whose data is not bool) is patched in iris_core.sim.interpreter, whose
  wrappers pass the cache arguments through whatever their form.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import triton
from triton.language import core as tl_core

from iris_core.platform import GPU


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


# the type of an aggregate's field that holds a value of a class its module cannot import (a Context
# in Flags: the context's module imports the flags' users); a compiled aggregate checks each field
# with isinstance, and every Triton value, aggregates included, is one of these
DeviceValue = tl_core.base_value


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


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    """A kernel compiled for the GPU platform, as jaxlib's TritonKernel is built from it."""

    name: str
    shared_mem_bytes: int
    asm: str  # what jaxlib's launcher assembles and loads (iris_core.platform: launcher_stages; NVIDIA: PTX)
    ttir: str
    global_scratch: tuple[int, int] | None = None  # (bytes, alignment) the kernel needs, if any


def gpu_backend(compute_capability: int):
    """Triton's backend of the GPU platform (iris_core.platform) for `compute_capability` (e.g.
    90), made without a GPU."""
    from triton.compiler.compiler import make_backend

    return make_backend(GPU.triton_target(compute_capability))


def compile_for_launcher(fn, signature: dict, constexprs: dict, attrs: dict, compute_capability: int,
                         options: dict) -> CompiledKernel:
    """Compiles the @triton.jit `fn` for `compute_capability` down to the GPU platform's
    launcher stage (NVIDIA: PTX), no GPU needed.

    Args:
      signature: parameter name -> Triton type ("*fp32", "i32", "constexpr").
      constexprs: parameter name -> value, for the constexpr parameters.
      attrs: (parameter index,) -> backend attributes (e.g. 16-byte divisibility).
      options: backend options (num_warps, num_stages, num_ctas, debug, enable_fp_fusion).
    """
    from triton._C import libtriton
    from triton.compiler.compiler import ASTSource

    backend = gpu_backend(compute_capability)
    parsed = backend.parse_options(options)
    context = libtriton.ir.context()
    libtriton.ir.load_dialects(context)
    backend.load_dialects(context)
    source = ASTSource(fn, signature=signature, constexprs=constexprs, attrs=attrs)
    module = source.make_ir(backend.target, parsed, backend.get_codegen_implementation(parsed),
                            backend.get_module_map(), context)
    ttir = str(module)
    stages: dict = {}
    backend.add_stages(stages, parsed, source.language)
    metadata: dict = {}
    for stage in GPU.launcher_stages:
        module = stages[stage](module, metadata)
    scratch = metadata.get("global_scratch_size") or 0
    return CompiledKernel(metadata["name"], metadata["shared"], module, ttir,
                          (scratch, metadata.get("global_scratch_align", 1)) if scratch else None)
