"""`python jax_cluster.py script.py [args]`: runs the script as `__main__` in a launched rank, with
`jax.distributed.initialize()` (no arguments) able to join the launcher's run.

The launcher (launcher.py) exports JAX_COORDINATOR_ADDRESS, which JAX reads itself, and
JAX_NUM_PROCESSES / JAX_PROCESS_ID, which JAX (0.10) reads only through a cluster environment:
one is registered here as soon as the script imports JAX, first in JAX's list, so that a run inside
a Slurm or Kubernetes job does not take that job's world. Until then nothing is imported (a script
without JAX stays without it; JAX's settings are read from the environment when the script imports
it, as before). A rank whose script never calls `jax.distributed.initialize` is a single-process JAX.
Run by path: nothing of iris is imported before the script.
"""

import importlib.abc
import importlib.util
import os
import runpy
import signal
import sys

CLUSTERS = "jax._src.clusters"  # JAX's registry of cluster environments


def register(clusters) -> None:
    """Makes `jax.distributed.initialize()` read the launcher's variables (idempotent)."""
    types = clusters.ClusterEnv._cluster_types
    if any(t.name == "iris_sim" for t in types):
        return

    class IrisSimulatorCluster(clusters.ClusterEnv):
        name = "iris_sim"

        @classmethod
        def is_env_present(cls) -> bool:
            return all(k in os.environ for k in ("IRIS_SIM_RANK", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"))

        @classmethod
        def get_coordinator_address(cls, timeout_secs, override_coordinator_port) -> str:
            return os.environ["JAX_COORDINATOR_ADDRESS"]

        @classmethod
        def get_process_count(cls) -> int:
            return int(os.environ["JAX_NUM_PROCESSES"])

        @classmethod
        def get_process_id(cls) -> int:
            return int(os.environ["JAX_PROCESS_ID"])

    types.remove(IrisSimulatorCluster)  # defining it appended it; detection takes the first present
    types.insert(0, IrisSimulatorCluster)


class _RegisterWhenJaxImportsClusters(importlib.abc.MetaPathFinder):
    """Registers the cluster right after JAX's own cluster module ran (JAX imports it on `import jax`)."""

    def find_spec(self, name, path, target=None):
        if name != CLUSTERS:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)  # found as without us
        run = spec.loader.exec_module

        def run_then_register(module):
            run(module)
            register(module)

        spec.loader.exec_module = run_then_register  # this module's loader only
        return spec


def _say_position(signum, frame) -> None:
    """The launcher's timeout asks where this rank is (SIGUSR1): iris_core.sim.positions answers on
    stderr (imported here, late: the script has imported iris by the time its kernels wait)."""
    from iris_core.sim import positions  # lazy: nothing of iris before the script

    positions.answer(frame)


def main() -> None:
    signal.signal(signal.SIGUSR1, _say_position)
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` would have it
    sys.meta_path.insert(0, _RegisterWhenJaxImportsClusters())
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
