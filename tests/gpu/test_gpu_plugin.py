"""pytest-iris on the GPUs (pytest -m gpu): the example project's marked tests under `--iris-gpu`.

The processes=True test runs its 2 ranks as 2 processes, on GPUs 0 and 1 or, on a machine with one
GPU, both on GPU 0; the in-process tests run where there are as many GPUs as they ask for.
"""

import os
import re
import subprocess
import sys

import pytest

from pytest_iris.rank_main import plugin_args
from tests.gpu import launcher

pytestmark = pytest.mark.gpu
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_example_project_under_iris_gpu():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("JAX_PLATFORMS", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.abspath(ROOT), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run([sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", "-o", "addopts=",
                             *plugin_args(), "--iris-gpu", "examples/testing"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=400)
    assert result.returncode == 0, result.stdout[-6000:]
    assert re.search(r"test_shift_with_one_process_per_rank PASSED", result.stdout), result.stdout[-6000:]
    gpus = launcher.gpu_count()
    for ranks in (2, 4, 8):  # the in-process tests: run where the GPUs are enough, skipped saying so elsewhere
        word = "PASSED" if ranks <= gpus else "SKIPPED"
        assert re.search(rf"test_shift_moves_each_block_to_the_next_rank\[ranks={ranks}\] {word}", result.stdout), \
            result.stdout[-6000:]
