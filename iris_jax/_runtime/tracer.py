"""The runtime's device event tracer: iris_core's Tracer over this runtime's heap (iris_jax.tracing
is its public face)."""

from __future__ import annotations

import jax

from iris_core.tracing import DEFAULT_MAX_EVENTS, RankTrace, Tracer


class RuntimeTracer(Tracer):
    """The runtime's Tracer (`runtime().tracing`): waits for this process's device work
    before touching the buffers, and recompiles everything when the state changes."""

    def __init__(self, rt):
        super().__init__(rt.heap)
        self._rt = rt

    def enable(self, max_events: int = DEFAULT_MAX_EVENTS) -> None:
        """Starts tracing (see iris_jax.tracing.enable) and clears JAX's caches.

        Args:
          max_events: room for this many events per rank (more are counted, not written).
        """
        self._sync()
        super().enable(max_events)
        jax.clear_caches()

    def disable(self) -> None:
        """Stops tracing for functions compiled from now on (clears JAX's caches)."""
        self._sync()
        if self.enabled:
            super().disable()
            jax.clear_caches()

    def reset(self) -> None:
        """Clears the recorded events once this process's device work is done."""
        self._sync()
        super().reset()

    def read(self, ranks=None) -> list[RankTrace]:
        """Each rank's recorded events, once this process's device work is done.

        Args:
          ranks: the ranks to read (default: every rank).

        Returns:
          One `RankTrace` per rank.
        """
        self._sync()
        return super().read(ranks)

    def _sync(self) -> None:
        """Waits for the device work of this process (not for other processes')."""
        jax.effects_barrier()
        self._rt.backend.wait_for_devices(self._rt.devices)
