"""One rank of a processes=True test (pytest_iris.processes): runs pytest on that one test.

    python -m iris_core.sim -n N rank_main.py ROOTDIR NODEID
"""

import sys

import pytest


def main() -> int:
    root, nodeid = sys.argv[1], sys.argv[2]
    return int(pytest.main([nodeid, "--rootdir", root, "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            "-o", "addopts=", "--tb=short", "-x"]))


if __name__ == "__main__":
    sys.exit(main())
