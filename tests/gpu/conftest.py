"""Shared fixture of the GPU tests (pytest -m gpu)."""

import pytest


@pytest.fixture(scope="module")
def mesh():
    """A 1-D mesh ("i") over every GPU of this process, with the iris runtime on them."""
    import jax

    import iris_jax

    if jax.device_count() < 2 or jax.devices()[0].platform != "gpu":
        pytest.fail("the gpu tests need at least 2 GPUs (they never skip)")
    rt = iris_jax.init()
    return jax.make_mesh((len(rt.devices),), ("i",), devices=rt.devices)
