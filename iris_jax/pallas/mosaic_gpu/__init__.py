"""iris_jax.pallas.mosaic_gpu (experimental): multi-device Mosaic GPU kernels on CPU devices.

    import iris_jax.pallas.mosaic_gpu as iris_mgpu

    iris_mgpu.simulate()          # from here on, plgpu.kernel / pallas_call run on the CPU devices
    out = jax.jit(jax.shard_map(all_gather_kernel, mesh=mesh, ...))(x)

A script written for Hopper GPUs (`plgpu.kernel(...)`, or `pl.pallas_call(...,
compiler_params=plgpu.CompilerParams(...))`, under `jax.shard_map` and `jax.jit`) runs unchanged:
JAX's GPU interpreter does the local work, iris's rules the remote refs, semaphores, multimem and
`pl.get_global` (interpreter.py). Needs jax 0.12 (`missing()` says what else lacks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from iris_jax.pallas.mosaic_gpu._compat import NEEDED_JAX, TESTED_JAX, missing, require, unsupported_reason

if not missing():
    from iris_jax.pallas.mosaic_gpu import interpreter as _interpreter


def simulate(*, timeout_s: float | None = None, core_count: int | None = None, **params: Any) -> None:
    """Runs every Mosaic GPU kernel traced from now on under GPU interpret mode, peers included.

    Args:
      timeout_s: how long a semaphore wait may wait before the launch fails, naming the wait (None: 30 s).
      core_count: what a CPU device reports as `core_count` (a GPU's SM count, which Mosaic GPU ops
        take as their default block count; None: 132, an H100 SXM's). The interpreter runs a device's
        blocks one after another, so a small count runs faster.
      params: fields of JAX's `plgpu.InterpretGPUParams` (`detect_races`, `uninitialized_memory`, ...).

    Raises:
      IrisError: this JAX has no Mosaic GPU interpreter (jax 0.12 is needed).
    """
    require()
    kernel_params = _interpreter.interpret_params(timeout_s, **params)
    _interpreter.install()
    _interpreter.set_core_count(core_count)
    _interpreter.set_interpret_mode(kernel_params)


@contextlib.contextmanager
def simulating(*, timeout_s: float | None = None, core_count: int | None = None, **params: Any) -> Iterator[None]:
    """simulate() for the kernels traced inside a `with` block only (and its core_count)."""
    require()
    kernel_params = _interpreter.interpret_params(timeout_s, **params)
    _interpreter.install()
    before = _interpreter.set_core_count(core_count)
    try:
        with _interpreter.interpret_mode(kernel_params):
            yield
    finally:
        _interpreter.set_core_count(before)


def reset() -> None:
    """Clears JAX's GPU interpreter state after a kernel failed (JAX requires it before the next kernel)."""
    require()
    _interpreter.reset_state()


__all__ = ["NEEDED_JAX", "TESTED_JAX", "missing", "require", "reset", "simulate", "simulating", "unsupported_reason"]
