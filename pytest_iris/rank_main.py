"""One rank of a processes=True test (pytest_iris.processes): runs pytest on that one test.

    python -m iris_core.sim -n N rank_main.py ROOTDIR NODEID
"""

import importlib.metadata
import sys

import pytest


def plugin_args() -> list[str]:
    """pytest's arguments that load pytest-iris: none where iris-jax is installed (its entry point loads
    it), else the plugin by name (a checkout on the path, as the GPU machine runs)."""
    installed = any(e.name == "iris" for e in importlib.metadata.entry_points(group="pytest11"))
    return [] if installed else ["-p", "pytest_iris.plugin"]


def main() -> int:
    root, nodeid = sys.argv[1], sys.argv[2]
    return int(pytest.main([nodeid, "--rootdir", root, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            *plugin_args(), "-o", "addopts=", "--tb=short", "-x"]))


if __name__ == "__main__":
    sys.exit(main())
