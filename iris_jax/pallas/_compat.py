"""Which JAX versions iris_jax.pallas supports, and a clear error elsewhere.

It builds on private parts of JAX's Pallas (the Triton backend's lowering-rule table and
helpers, the state-discharge rule registry), read from jax 0.10.2, 0.11.2 and 0.12.0.1, and
tested with jax 0.10.2 and 0.12.0.1 (simulator; 0.12 also lowered for GPUs on the CPU) and 0.11.2
(GPUs, Triton backend).
"""

from __future__ import annotations

import functools
import importlib

import jax

from iris_core.errors import IrisError

TESTED = {"simulator": "0.10.2 and 0.12.0.1", "GPUs": "0.11.2"}

_NEEDED = {
    "jax._src.pallas.triton.lowering": (
        "triton_lowering_rules", "register_lowering", "_compute_pointers_from_indices", "_load", "_store",
        "_atomic_rmw", "_ensure_ir_value", "_bcast_to", "_ir_cast", "_full", "_i32_constant", "_dtype_to_ir_type"),
    "jax._src.state.discharge": ("register_discharge_rule", "transform_array"),
    "jax._src.state.primitives": ("get_ref_and_transforms",),
    "jax.experimental.pallas.triton": ("CompilerParams",),
    "jax._src.lib.triton": tuple(f"dialect.{n}" for n in ("atomic_rmw", "atomic_cas", "ptr_to_int", "int_to_ptr",
                                                          "bitcast", "elementwise_inline_asm")),
}


@functools.cache
def missing() -> tuple[str, ...]:
    """The JAX internals iris_jax.pallas needs that this JAX lacks."""
    return absent_internals(_NEEDED)


def absent_internals(needed: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Which of `needed` (module -> dotted names in it) this JAX lacks, each named."""
    absent = []
    for module_name, names in needed.items():
        try:
            module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001  (an old JAX may fail on import in other ways than ImportError)
            absent.append(f"{module_name} ({type(e).__name__}: {e})")
            continue
        absent += [f"{module_name}.{n}" for n in names if not _has(module, n)]
    return tuple(absent)


def _has(obj, dotted: str) -> bool:
    for part in dotted.split("."):
        if not hasattr(obj, part):
            return False
        obj = getattr(obj, part)
    return True


def require() -> None:
    """Raises IrisError naming what is missing when this JAX cannot run iris Pallas kernels."""
    absent = missing()
    if absent:
        raise IrisError(
            f"iris_jax.pallas (experimental) cannot work with jax {jax.__version__}: it lacks "
            f"{', '.join(absent)}. Tested: jax {TESTED['simulator']} (simulator) and {TESTED['GPUs']} "
            "(GPUs, Pallas's Triton backend).")


def pointers_from_indices(ref_ptr, block_info, indexer):
    """(the ref's pointers at `indexer`, the mask of its in-bounds lanes or None): jax 0.12's
    helper returns both; before, only the pointers (every lane in bounds)."""
    from jax._src.pallas.triton import lowering

    pointers = lowering._compute_pointers_from_indices(ref_ptr, block_info, indexer)
    return pointers if isinstance(pointers, tuple) else (pointers, None)


def discharge_rule(rule):
    """A state-discharge rule for either signature, calling `rule(in_avals, out_avals, *args,
    **params)`: jax 0.10 passes (in_avals, out_avals, *args), jax 0.11 on (DischargeContext, *args)."""

    @functools.wraps(rule)
    def either(*args, **params):
        if args and type(args[0]).__name__ == "DischargeContext":
            ctx, *values = args
            return rule(ctx.in_avals, ctx.out_avals, *values, **params)
        return rule(*args, **params)

    return either
