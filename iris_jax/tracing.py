"""Device event tracing from JAX: enable, run, export a Perfetto trace, plot a timeline.

    iris_jax.tracing.enable(max_events=8192)
    out = step(x)                                   # jitted after enable()
    iris_jax.tracing.export("trace.json")           # every rank, one file
    iris_jax.tracing.plot("trace.json", "trace.png")

Kernels record when built with tracing on: `Context.initialize(ctx, W, tracing=TRACING)`
with `TRACING=iris_jax.tracing.is_enabled()` among the triton_call's constexprs (the
device barrier does this itself). Their Context RMA ops then record one event each, and
they may record their own phases with `ctx.tracing.record_event_start/_end`.

Tracing and jit caching: the context row a kernel receives is fixed when its computation
is lowered, and a kernel's TRACING constexpr when it is traced. enable() and disable()
therefore clear JAX's caches (jax.clear_caches()): every function recompiles on its next
call and picks up the new state. An executable compiled ahead of time (.lower().compile())
before the change keeps the state it was compiled with; it never writes outside the
trace area, which stays allocated until shutdown. reset() keeps the compiled functions.

The trace area lives on the symmetric heap at one offset on every rank and the context
carries heap offsets (see iris_core.tracing.buffers), so the simulator's worker processes
record into the same memory the host reads. Execution models: single-process GPU and
the simulator read every rank; in multi-process runs every process can read every rank
too (peers' heaps are mapped), once their kernels finished (iris_jax.barrier() first).
"""

from __future__ import annotations

from iris_core.tracing import DEFAULT_MAX_EVENTS, RankTrace, chrome_trace, events
from iris_core.tracing import plot as _plot
from iris_jax import _runtime as runtime_lib
from iris_jax._runtime.tracer import RuntimeTracer

__all__ = ["DEFAULT_MAX_EVENTS", "RankTrace", "RuntimeTracer", "chrome_trace", "disable", "enable", "events",
           "export", "is_enabled", "plot", "read", "reset"]


def _tracer() -> RuntimeTracer:
    return runtime_lib.runtime().tracing


def enable(max_events: int = DEFAULT_MAX_EVENTS) -> None:
    """Starts tracing: functions compiled from now on record (see the module docstring).

    It allocates on the symmetric heap: with several processes, every one calls it at the
    same point of its sequence of heap allocations (as for heap arrays).

    Args:
      max_events: room for this many events per rank (more are counted, not written).
    """
    _tracer().enable(max_events)


def disable() -> None:
    """Stops tracing for functions compiled from now on; recorded events stay exportable."""
    _tracer().disable()


def reset() -> None:
    """Clears the recorded events (the same buffers keep recording)."""
    _tracer().reset()


def is_enabled() -> bool:
    """Whether tracing is on: pass it as the TRACING constexpr of your kernels."""
    return runtime_lib.is_initialized() and _tracer().enabled


def read(ranks=None) -> list[RankTrace]:
    """Each rank's recorded events (structured arrays) and counters.

    Args:
      ranks: the ranks to read (default: every rank).

    Returns:
      One `RankTrace` per rank.
    """
    return _tracer().read(ranks)


def export(path: str, merge: bool = True, **options) -> list[str]:
    """Writes Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev).

    Args:
      path: the file to write.
      merge: one file with every rank (one process per rank); False: one file per rank,
        `path` with `.rank<r>` before its extension.
      **options: for `chrome_trace` (names, track, align: ranks are aligned on their first
        barrier by default).

    Returns:
      The paths written.
    """
    return _tracer().export(path, merge=merge, **options)


def plot(path_or_events, out_png: str, **options) -> str:
    """Draws a timeline PNG (ranks x SMs, colored event spans). Needs matplotlib.

    Args:
      path_or_events: a trace-event JSON file, a trace-event dict or the list `read()` returns.
      out_png: the file to write.
      **options: for `iris_core.tracing.plot`.

    Returns:
      `out_png`.
    """
    return _plot(path_or_events, out_png, **options)
