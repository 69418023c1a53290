"""Shared fixture and collection rules of the GPU tests (pytest -m gpu).

Tests marked `multi_gpu` (today's single-process and one-process-per-GPU tests) need two or
more GPUs. On a machine with one GPU they are deselected, with a line saying so, and the
shared-GPU runs (test_gpu_shared.py: world sizes 2, 4 and 8 on GPU 0) are the GPU suite;
with no GPU at all every gpu test fails (they never skip).
"""

import pytest

from tests.gpu import launcher


@pytest.hookimpl(trylast=True)  # after `-m` selection: nothing to count on CPU-only runs
def pytest_collection_modifyitems(config, items):
    multi = [item for item in items if item.get_closest_marker("multi_gpu")]
    if not multi:
        return
    count = launcher.gpu_count()
    if count == 1:
        config.hook.pytest_deselected(items=multi)
        items[:] = [item for item in items if not item.get_closest_marker("multi_gpu")]
        config.stash[_DESELECTED] = len(multi)


_DESELECTED = pytest.StashKey[int]()


def pytest_terminal_summary(terminalreporter, config):
    deselected = config.stash.get(_DESELECTED, 0)
    if deselected:
        terminalreporter.write_line(f"iris: one GPU here: {deselected} tests that need two or more GPUs were "
                                    "deselected; the shared-GPU runs (test_gpu_shared.py) stand in for them")
    for result in launcher.SUMMARY:
        terminalreporter.write_line(f"iris: {result.summary()}")


@pytest.fixture(scope="module")
def mesh():
    """A 1-D mesh ("i") over every GPU of this process, with the iris runtime on them."""
    import jax

    import iris_jax

    if jax.device_count() < 2 or jax.devices()[0].platform != "gpu":
        pytest.fail("the gpu tests need at least 2 GPUs (they never skip)")
    rt = iris_jax.init()
    return jax.make_mesh((len(rt.devices),), ("i",), devices=rt.devices)
