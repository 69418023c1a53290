"""The heap guard on real GPUs, one process over every local GPU (pytest -m gpu).

Marked multi_gpu like the suite's other in-process tests: on one GPU the shared-GPU runs
(test_gpu_shared.py, scenario "heap_guard" at world 2, 4 and 8) run the same scenario,
tests/gpu/heap_guard.py, and this process must leave the GPU's memory to them."""

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def test_refused_accesses_raise_after_the_call_and_touch_nothing(tmp_path):
    import jax

    if not any(d.platform == "gpu" for d in jax.devices()):
        pytest.fail("the gpu tests need a GPU (they never skip)")
    import iris_jax
    from tests.gpu.heap_guard import heap_guard
    from tests.gpu.scenarios import World

    assert iris_jax.init().mode == "gpu-single-process"
    world = World(str(tmp_path))
    heap_guard(world)
    assert not world.failures, "\n".join(world.failures)
    assert world.checks > 0
