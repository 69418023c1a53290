"""What differs between the JAX, jaxlib and jax-triton releases iris supports, in one place.

Supported (pyproject.toml, README "Tested versions"): jax/jaxlib 0.10.2 to 0.12.x and jax-triton
0.3.1 and 0.4.x; Triton's own differences (3.6 to 3.9) are in iris_core.compat (Pallas's, in
iris_jax.pallas._compat). Whatever differs between those releases is handled here, and only
here: where a release moved something, this module says which release and keeps both
spellings. (JAX internals that are the same on every supported release, such as the sharding
contexts a lowering rule reads, are still imported where they are used.)

What moved:

* jax 0.12 merged `ClosedJaxpr` into `Jaxpr` (a Jaxpr carries its consts);
  `jax.extend.core.ClosedJaxpr` names the class on every version, and every Jaxpr passes its
  isinstance check there (`is_closed_jaxpr`).
* An abstract value's varying manual axes: `aval.manual_axis_type.varying` in jax 0.10,
  `aval.vma` later (`varying_axes`). shard_map's equation names its newly manual axes
  `newly_manual_axes`, `manual_axes` or `axis_names` by release (`shard_map_manual_axes`).
* jax 0.12 calls DCE rules with `(used_outputs, live_inputs, eqn)`; jax-triton 0.4.1's rule for
  its primitive takes two arguments, so every jitted `jax_triton.triton_call` fails there: we
  register a rule of the right arity (`fix_jax_triton`).
* jax-triton 0.4 bound its primitive with other parameters (`in_tree` of the kernel's arguments,
  `metaparams`, `backend_options`; no `scalar_args`): `jax_triton_call` reads either form.
* lax.ppermute over a tuple of axes numbered the members in the mesh's axis order up to jax
  0.11; jax 0.12 numbers them in the tuple's order (as lax.axis_index does) and by default
  refuses a tuple out of the mesh's order (`raise_on_ppermute_sort_diff`); iris's follows.
* iris calls lax's collective functions in `jax._src.lax.parallel` (`lax_parallel`), where they
  are defined, not through `jax.lax`: a program that swaps by assignment (`jax.lax.psum =
  iris_jax.psum`) would otherwise send iris's psum back into itself.
* A shard_map lowered inside a lowering rule (iris's per-shard region in a partially manual
  shard_map, iris_jax.collectives.primitive) takes its devices from the concrete-mesh context, which only
  `jax.set_mesh` sets from outside: `concrete_mesh(mesh)` sets it there (jax's private
  `_internal_use_concrete_mesh`, the same on 0.10.2 to 0.12).
* jaxlib's `TritonKernel` takes the kernel's global scratch size and alignment after 0.11.0.
* jax-triton 0.3.1 refuses to import unless JAX's CUDA plugin is installed ("jax-triton requires
  JAX to be installed with GPU support"), although iris needs it on CPU-only machines only for
  its primitive (the simulator runs kernels itself, iris_jax.calls.cpu_lowering). Without the plugin
  `jax._src.lib.gpu_triton` gets stand-ins that fail when a GPU launch is attempted, saying what
  to install (`pip install "iris-jax[gpu]"`). It also sets TRITON_CACHE_DIR="" on import, after
  which any ordinary Triton launch fails ("Could not create or locate cache dir"): we put the
  previous value back (or unset it, so Triton uses its default).

iris's own kernels do not go through jax-triton's lowering (iris_jax.calls.gpu_lowering compiles them
and builds jaxlib's kernel call itself), so its removed helpers (`get_cuda_backend`,
`get_or_create_triton_kernel`, `get_triton_type`) are not needed on any version.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
from typing import Any

import jax
import numpy as np
from jax._src import core
from jax._src import lib as jax_lib
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import parallel as lax_parallel  # lax's collectives, where they are defined
from jax.extend.core import ClosedJaxpr

from iris_core.platform import PLATFORMS

__all__ = ["ClosedJaxpr", "JAX_TRITON_VERSION", "JAXLIB_VERSION", "closed_jaxpr", "gpu_plugin_present",
           "concrete_mesh", "gpu_triton", "is_closed_jaxpr", "is_jaxpr", "jax_triton", "jax_triton_call",
           "lax_parallel", "shard_map_manual_axes", "triton_kernel", "triton_kernel_call_p", "triton_type",
           "varying_axes"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3] if part.isdigit())


JAXLIB_VERSION = tuple(jax_lib.version)


def _distribution_version(name: str) -> tuple[int, ...]:
    from importlib import metadata

    try:
        return _version(metadata.version(name))
    except metadata.PackageNotFoundError:
        return ()


JAX_TRITON_VERSION = _distribution_version("jax-triton")


# -- jaxprs -------------------------------------------------------------------------------
def closed_jaxpr(jaxpr, consts) -> ClosedJaxpr:
    """`jaxpr` with `consts` as its constants (jax 0.12: the same Jaxpr with consts attached)."""
    return ClosedJaxpr(jaxpr, consts)


def is_jaxpr(value) -> bool:
    """A jaxpr, open or closed (a parameter of a higher-order primitive that holds one)."""
    return isinstance(value, (core.Jaxpr, ClosedJaxpr))


def is_closed_jaxpr(value) -> bool:
    """A closed jaxpr: on jax 0.12 every Jaxpr is one (it carries its consts), so ask this
    before asking whether `value` is an open core.Jaxpr."""
    return isinstance(value, ClosedJaxpr)


def jit_primitive():
    """The primitive of a nested jax.jit (jax 0.10: `pjit_p`; later `jit_p`)."""
    from jax._src import pjit

    return getattr(pjit, "jit_p", None) or pjit.pjit_p


# -- manual axes ------------------------------------------------------------------------------
def varying_axes(aval) -> frozenset:
    """The manual mesh axes abstract value `aval` varies over (jax 0.10: its
    manual_axis_type's `varying`; later its `vma`)."""
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = getattr(getattr(aval, "manual_axis_type", None), "varying", frozenset())
    return frozenset(vma)


def shard_map_manual_axes(params: dict):
    """The axes a shard_map equation makes manual, under the parameter name of this release
    (`newly_manual_axes`, `manual_axes` or `axis_names`); None: all of its mesh's."""
    return params.get("newly_manual_axes", params.get("manual_axes", params.get("axis_names")))


# -- meshes -----------------------------------------------------------------------------------
def concrete_mesh(mesh):
    """A context in which `mesh` (a jax.sharding.Mesh) is the concrete mesh, as inside
    `jax.set_mesh(mesh)` but usable while tracing and lowering (set_mesh refuses there)."""
    from jax._src.sharding_impls import _internal_use_concrete_mesh

    return _internal_use_concrete_mesh(mesh)


def context_concrete_mesh():
    """The concrete mesh of the context (`jax.set_mesh`, or the legacy `with mesh:`), or None."""
    from jax._src import mesh as mesh_lib

    mesh = mesh_lib.get_concrete_mesh()
    if mesh is None or mesh.empty:
        mesh = mesh_lib.thread_resources.env.physical_mesh
    return None if mesh is None or mesh.empty else mesh


# -- lax's own checks -------------------------------------------------------------------------
PPERMUTE_ORDER_MESSAGE = (
    "Make sure that the axis_name passed to jax.lax.ppermute is in the same order as the axis_names declared on "
    "the mesh. If you want to allow different order, you can disable the check via `with "
    "jax.raise_on_ppermute_sort_diff(False):` context manager.")


def _ppermute_order_switch():
    """jax 0.12's `raise_on_ppermute_sort_diff` config state (None before 0.12). jax 0.12's
    message names `jax.raise_on_ppermute_sort_diff`, which that release does not export."""
    from jax._src import config

    return getattr(config, "raise_on_ppermute_sort_diff", None)


def ppermute_numbers_in_tuple_order() -> bool:
    """Whether lax.ppermute numbers a tuple of axes' members in the tuple's order (jax 0.12,
    which added the switch together with that change) rather than the mesh's."""
    return _ppermute_order_switch() is not None


def ppermute_axis_order_checked() -> bool:
    """Whether lax.ppermute refuses axes out of the mesh's order here (jax 0.12, by default)."""
    switch = _ppermute_order_switch()
    return switch is not None and bool(switch.value)


def ppermute_in_any_axis_order():
    """A context in which lax.ppermute takes axes in any order (a no-op where it always does)."""
    switch = _ppermute_order_switch()
    return switch(False) if switch is not None else contextlib.nullcontext()


# -- jaxlib's Triton launcher -----------------------------------------------------------------
def gpu_triton():
    """jaxlib's Triton kernel-call bindings (TritonKernel, TritonKernelCall, parameters)."""
    from jax._src.lib import gpu_triton as lib

    return lib


def triton_kernel(name: str, num_warps: int, num_ctas: int, shared_mem_bytes: int, ptx: str, ttir: str,
                  compute_capability: int, global_scratch: tuple[int, int] | None = None):
    """jaxlib's TritonKernel; `global_scratch` (size, alignment) needs jaxlib > 0.11.0."""
    args = [name, num_warps, num_ctas, shared_mem_bytes, ptx, ttir, compute_capability]
    if global_scratch is not None:
        if JAXLIB_VERSION <= (0, 11, 0):
            raise NotImplementedError(f"kernel {name} needs a global scratch buffer, which jaxlib "
                                      f"{'.'.join(map(str, JAXLIB_VERSION))} cannot give it (jaxlib > 0.11.0 can)")
        args += list(global_scratch)
    return gpu_triton().TritonKernel(*args)


_TRITON_TYPES = {jax.numpy.dtype(k): v for k, v in {
    "bfloat16": "bf16", "float64": "fp64", "float32": "fp32", "float16": "fp16", "float8_e4m3fn": "fp8e4nv",
    "float8_e5m2": "fp8e5", "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint64": "u64",
    "uint32": "u32", "uint16": "u16", "uint8": "u8", "bool": "i1"}.items()}


def triton_type(value) -> str:
    """Triton's name of a kernel argument's type: "*fp32" for an array (an aval or array), the
    narrowest of i32/u32/i64/u64 for an int, "B" for a bool, fp64 for a float and fp32 for an
    np.float32 (jax-triton 0.3.1's rule, kept on every version)."""
    dtype = getattr(value, "dtype", None)
    if dtype is not None and getattr(value, "shape", None) is not None and not np.isscalar(value):
        return "*" + _TRITON_TYPES[np.dtype(dtype)]
    if isinstance(value, (bool, np.bool_)):
        return "B"
    if isinstance(value, (int, np.integer)):
        value = int(value)
        for name, low, high in (("i32", -(2**31), 2**31), ("u32", 2**31, 2**32), ("i64", -(2**63), 2**63),
                                ("u64", 2**63, 2**64)):
            if low <= value < high:
                return name
        raise ValueError(f"integer {value} does not fit in 64 bits")
    if isinstance(value, np.float32):
        return "fp32"
    if isinstance(value, float):
        return "fp64"
    raise TypeError(f"a Triton kernel cannot take {value!r} ({type(value).__name__}) as an argument: pass arrays, "
                    "ints, floats or bools")


# -- jax-triton ---------------------------------------------------------------------------------
_GPU_NAMES = ("TritonKernelCall", "TritonAutotunedKernelCall", "TritonKernel", "create_array_parameter",
              "create_scalar_parameter", "get_compute_capability", "get_arch_details", "get_custom_call",
              "get_serialized_metadata")


def _no_gpu_plugin(*args, **kwargs):
    raise RuntimeError("launching a Triton kernel on a GPU needs JAX's CUDA plugin, which is not installed: "
                       'pip install "iris-jax[gpu]" (on CPU-only machines iris runs on its simulator without it)')


def gpu_plugin_present() -> bool:
    """Whether JAX's GPU plugin, with jaxlib's Triton launcher, is installed (iris_core.platform)."""
    lib = gpu_triton()
    return any(getattr(lib, platform.jaxlib_triton, None) is not None for platform in PLATFORMS)


def jax_triton():
    """jax_triton, imported so that it works on every machine and leaves Triton's cache working."""
    import sys

    if "jax_triton" in sys.modules:
        return sys.modules["jax_triton"]
    lib = gpu_triton()
    if not gpu_plugin_present():
        for name in _GPU_NAMES:
            if not hasattr(lib, name):
                setattr(lib, name, _no_gpu_plugin)
    before = os.environ.get("TRITON_CACHE_DIR")
    import jax_triton as module

    if before is None:
        if os.environ.get("TRITON_CACHE_DIR") == "":
            del os.environ["TRITON_CACHE_DIR"]
    else:
        os.environ["TRITON_CACHE_DIR"] = before
    fix_jax_triton(module.triton_lib.triton_kernel_call_p)
    return module


def triton_kernel_call_p():
    """jax-triton's kernel-call primitive (the one `jax_triton.triton_call` binds)."""
    return jax_triton().triton_lib.triton_kernel_call_p


@dataclasses.dataclass(frozen=True)
class KernelCall:
    """A bound `triton_kernel_call`, as iris's lowerings read it, on either jax-triton.

    The kernel's arguments are the call's operands in order, `scalars` inserted at their
    positions, then the results listed in `result_params` (jax-triton 0.4 passes no parameter
    for an output aliased to an input).
    """

    fn: Any
    scalars: tuple  # (position among the kernel's arguments, Triton type, value)
    result_params: tuple[int, ...]
    metaparams: dict
    grid: Any
    input_output_aliases: tuple  # (operand index, result index)
    zeroed_outputs: Any
    debug: bool  # device-side assertions raise


def jax_triton_call(params: dict, num_results: int) -> KernelCall:
    """Reads the parameters of a bound `triton_kernel_call` (jax-triton 0.3.1 or 0.4.x)."""
    if "in_tree" not in params:  # jax-triton 0.3.1: operands, scalars at their positions, every output
        known = {"fn", "scalar_args", "name", "custom_call_target_name", "out_shapes", "grid", "num_warps",
                 "num_stages", "num_ctas", "compute_capability", "enable_fp_fusion", "input_output_aliases",
                 "zeroed_outputs", "debug", "serialized_metadata"}
        return KernelCall(
            fn=params["fn"], scalars=tuple(params["scalar_args"]), result_params=tuple(range(num_results)),
            metaparams={k: v for k, v in params.items() if k not in known},
            grid=params["grid"], input_output_aliases=tuple(params["input_output_aliases"]),
            zeroed_outputs=params["zeroed_outputs"], debug=bool(params.get("debug")))
    return _jax_triton_04_call(params)


def _jax_triton_04_call(params: dict) -> KernelCall:
    """jax-triton 0.4: the kernel's arguments are `in_tree` over the operands, whose static leaves
    are scalars and whose placeholders stand for outputs."""
    triton_lib = jax_triton().triton_lib
    marker = object()
    leaves = params["in_tree"].unflatten([marker] * params["in_tree"].num_leaves)
    scalars, result_params = [], []
    for position, leaf in enumerate(leaves):
        if leaf is marker:
            continue
        if isinstance(leaf, triton_lib._StaticArg):
            scalars.append((position, triton_type(leaf.value), leaf.value))
        elif isinstance(leaf, triton_lib._OutputPlaceholder):
            result_params.append(leaf.ordinal)
        else:
            raise NotImplementedError(
                f"jax_triton.triton_call with a nested argument ({type(leaf).__name__}) is not supported by iris's "
                "lowering; pass arrays and scalars")
    outputs_at = [i for i, leaf in enumerate(leaves) if isinstance(leaf, triton_lib._OutputPlaceholder)]
    if outputs_at != list(range(len(leaves) - len(outputs_at), len(leaves))):
        raise NotImplementedError("iris's lowering of jax_triton.triton_call needs the kernel's outputs after its "
                                  "inputs (as jax-triton 0.3 requires)")
    # its aliases count the inputs, scalars included (0.3.1 counts the arrays only)
    inputs = [leaf is marker for leaf in leaves if not isinstance(leaf, triton_lib._OutputPlaceholder)]
    aliases = tuple((sum(inputs[:i]), o) for i, o in dict(params["input_output_aliases"]).items())
    return KernelCall(
        fn=params["fn"], scalars=tuple(scalars), result_params=tuple(result_params),
        metaparams=dict(params["metaparams"]), grid=params["grid"], input_output_aliases=aliases,
        zeroed_outputs=params["zeroed_outputs"], debug=bool(dict(params.get("backend_options") or {}).get("debug")))


def fix_jax_triton(primitive) -> None:
    """Gives jax-triton's primitive a DCE rule of the arity this JAX calls (jax-triton 0.4.1's
    takes two arguments; jax 0.12 passes three). The rule keeps the call: a kernel may write
    memory that no output shows."""
    rule = pe.dce_rules.get(primitive)
    if rule is None or _dce_arity() == len(inspect.signature(rule).parameters):
        return

    def keep_the_call(used_outputs, *rest):
        eqn = rest[-1]
        return [True] * len(eqn.invars), eqn

    pe.dce_rules[primitive] = keep_the_call


def _dce_arity() -> int:
    """How many arguments this JAX passes a DCE rule (read from one of its own rules)."""
    return len(inspect.signature(pe.dce_jaxpr_closed_call_rule).parameters)
