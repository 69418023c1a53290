"""Triton device API: the `Context`, free RMA functions, tile views, hardware registers."""

from iris_core.compat import aggregate, interpreting
from iris_core.device import rma
from iris_core.device.context import Context, DeviceContext
from iris_core.device.intrinsics import global_timer, load_acquire, nanosleep, sm_id
from iris_core.device.rma import (
    atomic_add,
    atomic_and,
    atomic_cas,
    atomic_max,
    atomic_min,
    atomic_or,
    atomic_sub,
    atomic_xchg,
    atomic_xor,
    copy,
    get,
    load,
    put,
    store,
    translate,
)
from iris_core.device.tracing import DeviceTracing
from iris_core.device.views import TensorView, Tile, TileView

__all__ = [
    "Context", "DeviceContext", "DeviceTracing", "TensorView", "Tile", "TileView", "aggregate",
    "atomic_add", "atomic_and", "atomic_cas", "atomic_max", "atomic_min", "atomic_or", "atomic_sub",
    "atomic_xchg", "atomic_xor", "copy", "get", "global_timer", "interpreting", "load", "load_acquire", "nanosleep", "put",
    "rma", "sm_id", "store", "translate",
]
