"""The heap guard on real GPUs, one process over every local GPU (one GPU is enough: a world
of one still has a heap to stay inside and a rank 1 outside it). The shared-GPU runs at
world 2, 4 and 8 run the same scenario (tests/gpu/heap_guard.py) where scenarios.py lists it."""

import pytest

pytestmark = pytest.mark.gpu


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
