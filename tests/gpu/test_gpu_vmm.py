"""Both GPU heap allocators on one GPU: processes sharing GPU 0 with IRIS_HEAP_ALLOCATOR=vmm
(cuMemCreate, POSIX-fd handles passed over Unix sockets) and =malloc (cudaMalloc + CUDA IPC).

Each world runs a short scenario set of tests/gpu/scenarios.py (kernels, device barriers,
every collective) through tests/gpu/launcher.py, every rank checking its values against
numpy; each process's printed runtime must name the allocator asked for (so a silent
fallback fails), and every process must shut down cleanly (the mappings released). All
worlds run at once. Says nothing about fabric handles (no multi-node NVLink here) or speed.

Settings: IRIS_GPU_VMM_WORLDS (default "2,4"), IRIS_GPU_VMM_SCENARIOS (default
"kernels,device_barrier,collectives,heap_growth"), IRIS_GPU_VMM_LIMIT (seconds, default 220),
IRIS_GPU_LOG_DIR (keep the processes' logs there).
"""

import os
from pathlib import Path

import pytest

from tests.gpu import launcher
from tests.gpu.scenarios import applies

pytestmark = pytest.mark.gpu

ALLOCATORS = ["vmm", "malloc"]
WORLD_SIZES = [int(w) for w in os.environ.get("IRIS_GPU_VMM_WORLDS", "2,4").split(",")]
SCENARIOS = os.environ.get("IRIS_GPU_VMM_SCENARIOS", "kernels,device_barrier,collectives,heap_growth").split(",")
LIMIT_S = float(os.environ.get("IRIS_GPU_VMM_LIMIT", 220))


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    if launcher.gpu_count() < 1:
        pytest.fail("the gpu tests need a GPU (they never skip)")
    root = os.environ.get("IRIS_GPU_LOG_DIR")
    runs = {}
    for allocator in ALLOCATORS:
        log_dir = Path(root) / f"vmm_{allocator}" if root else tmp_path_factory.mktemp(f"heap_{allocator}")
        for w in WORLD_SIZES:
            # VMM heaps bounded at 4 GiB map 1 GiB at init: heap_growth then grows them
            runs[allocator, w] = launcher.start(w, SCENARIOS, shared=True, log_dir=log_dir, limit_s=LIMIT_S,
                                                env={"IRIS_HEAP_ALLOCATOR": allocator},
                                                heap_mib=4096 if allocator == "vmm" else 768)
    results = {key: run.wait() for key, run in runs.items()}
    launcher.SUMMARY.extend(results.values())
    return results


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_heap_uses_the_allocator_asked_for(worlds, allocator, world_size):
    result = worlds[allocator, world_size]
    missing = [p for p, log in enumerate(result.logs) if f"heap_allocator='{allocator}'" not in log]
    assert not missing, (f"{allocator}, {result.label}: process(es) {missing} printed no runtime with "
                         f"heap_allocator='{allocator}':\n{result.logs[missing[0]][-4000:]}")


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("world_size,scenario", [(w, s) for w in WORLD_SIZES for s in SCENARIOS if applies(s, w)])
def test_scenario(worlds, allocator, world_size, scenario):
    worlds[allocator, world_size].check(scenario)


@pytest.mark.parametrize("allocator", ALLOCATORS)
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_process_ended_cleanly(worlds, allocator, world_size):
    worlds[allocator, world_size].check_exit()
