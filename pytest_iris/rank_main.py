"""One rank of a processes=True test (pytest_iris.processes): runs pytest on that one test.

    python -m iris_core.sim -n N rank_main.py ROOTDIR NODEID
"""

import importlib.metadata
import sys

import pytest


def main() -> int:
    root, nodeid = sys.argv[1], sys.argv[2]
    # the plugin by its entry point where iris-jax is installed, else by name (a checkout on the path)
    installed = any(e.name == "iris" for e in importlib.metadata.entry_points(group="pytest11"))
    plugin = [] if installed else ["-p", "pytest_iris.plugin"]
    return int(pytest.main([nodeid, "--rootdir", root, "-q", "-p", "no:cacheprovider", "-p", "no:randomly", *plugin,
                            "-o", "addopts=", "--tb=short", "-x"]))


if __name__ == "__main__":
    sys.exit(main())
