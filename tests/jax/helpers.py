"""Helpers of the iris_jax tests (CPU simulator; tests/conftest.py sets 8 CPU devices).

The iris runtime is global to the process: `use_runtime(n)` re-initializes it only when
the current one does not cover exactly the first n devices with the test heap size, so
tests grouped by world size share one runtime (and the simulator's worker processes,
which are pooled per world size).
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TEST_HEAP = 16 << 20


def use_runtime(n: int, heap_size: int = TEST_HEAP, domain_size: int | None = None,
                sim_collectives: str | None = None):
    """The runtime over jax.devices()[:n] with `heap_size`, `domain_size` and `sim_collectives`
    (None: the environment's, else "host"), (re)initialized if needed."""
    import jax

    import iris_jax
    from iris_core.sim import host_collectives

    devices = jax.devices()[:n]
    assert len(devices) == n, f"need {n} CPU devices, have {jax.device_count()}"
    mode = host_collectives.mode_of(sim_collectives)
    if iris_jax.is_initialized():
        rt = iris_jax.runtime()
        if ([d.id for d in rt.devices] == [d.id for d in devices] and rt.heap_size == heap_size
                and rt.domain_size == domain_size and rt.sim_collectives == mode):
            return rt
        iris_jax.shutdown()
    return iris_jax.init(heap_size=heap_size, devices=devices, domain_size=domain_size, sim_collectives=mode)


def smap(mesh, f, in_specs, out_specs, **kwargs):
    """jax.jit(jax.shard_map(f, ...))."""
    import jax

    return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, **kwargs))


def child_env(**extra) -> dict:
    """Environment for a child Python process: this checkout importable, no forced device
    count (a launched rank has exactly one CPU device) but this process's other XLA flags, no
    launcher variables; `extra` sets variables (None removes one; XLA_FLAGS adds to the kept flags)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IRIS_SIM_")}
    kept = " ".join(f for f in env.pop("XLA_FLAGS", "").split() if "xla_force_host_platform_device_count" not in f)
    if kept:
        env["XLA_FLAGS"] = kept
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    for key, value in extra.items():  # value None: remove the variable
        if value is None:
            env.pop(key, None)
        else:
            env[key] = f"{kept} {value}".strip() if key == "XLA_FLAGS" else value
    return env


def run_python(args, timeout, **env) -> subprocess.CompletedProcess:
    """Runs `python args...` from the repository root; stdout and stderr together."""
    return subprocess.run([sys.executable, *args], cwd=REPO, env=child_env(**env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def read_heap(array, rank: int, shape, dtype):
    """Rank's copy of a heap array, read from the heap itself (np.asarray(array) may return
    a host copy that JAX cached before a kernel wrote into the heap)."""
    import iris_jax

    return iris_jax.runtime().heap.host_view(rank, iris_jax.heap_offset(array), shape, dtype).copy()
