"""The GPU suite on any GPU count: world sizes 2, 4 and 8 as processes sharing GPU 0 (pytest -m gpu).

Each world runs every scenario of tests/gpu/scenarios.py that applies at its size (kernels,
every atomic, device barriers, every collective and all-reduce variant at odd sizes and in four
dtypes, pushed, streamed, chunked and zero-copy paths, fused ops, tile-level collectives,
iris_jax.pallas kernels at 2 and 4 ranks, tracing) in one set of processes
(tests/gpu/launcher.py), each rank checking its values against numpy; then a run
in which the last rank never calls (timeouts). The three worlds run at the same time: their
kernels time-slice on the GPU and their compilations share the CPUs.

Shows correctness and memory-model behaviour on real hardware with 2-8 ranks; says nothing
about speed (the ranks share one GPU's SMs and memory; no NVLink is involved).

Settings: IRIS_GPU_SHARED_WORLDS (default "2,4,8"), IRIS_GPU_SHARED_SCENARIOS (a comma list,
default all), IRIS_GPU_SHARED_PART ("1/2", "2/2": a part of those scenarios in their order, the
timeouts in the last; all of them at once outlast one device call), IRIS_GPU_SHARED_LIMIT
(seconds for the main runs, default 360; the timeout runs take at most 150 more),
IRIS_GPU_LOG_DIR (keep the processes' logs there).
"""

import os
from pathlib import Path

import pytest

from tests.gpu import launcher
from tests.gpu.scenarios import ENDS_IN_FAILED_KERNELS, MAIN, applies

pytestmark = pytest.mark.gpu

WORLD_SIZES = [int(w) for w in os.environ.get("IRIS_GPU_SHARED_WORLDS", "2,4,8").split(",")]
_chosen = os.environ.get("IRIS_GPU_SHARED_SCENARIOS", "").split(",")
SCENARIOS = [name for name in MAIN if name in _chosen] if _chosen != [""] else MAIN
TIMEOUTS = _chosen == [""] or any(name in _chosen for name in ENDS_IN_FAILED_KERNELS)
if os.environ.get("IRIS_GPU_SHARED_PART"):  # "K/P": the K-th of P equal parts, the timeouts in the last
    _k, _parts = (int(v) for v in os.environ["IRIS_GPU_SHARED_PART"].split("/"))
    SCENARIOS = SCENARIOS[(_k - 1) * len(SCENARIOS) // _parts:_k * len(SCENARIOS) // _parts]
    TIMEOUTS = TIMEOUTS and _k == _parts
LIMIT_S = float(os.environ.get("IRIS_GPU_SHARED_LIMIT", 360))
TIMEOUT_LIMIT_S = 150


def _log_dir(tmp_path_factory, what: str) -> Path:
    root = os.environ.get("IRIS_GPU_LOG_DIR")
    return Path(root) / what if root else tmp_path_factory.mktemp(what)


def _launch_all(tmp_path_factory, scenarios, what: str, limit_s: float, env: dict | None = None) -> dict:
    if launcher.gpu_count() < 1:
        pytest.fail("the gpu tests need a GPU (they never skip)")
    log_dir = _log_dir(tmp_path_factory, what)
    runs = {w: launcher.start(w, scenarios, shared=True, log_dir=log_dir, limit_s=limit_s, env=env)
            for w in WORLD_SIZES}
    results = {w: run.wait() for w, run in runs.items()}
    launcher.SUMMARY.extend(results.values())
    return results


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    return _launch_all(tmp_path_factory, SCENARIOS, "shared", LIMIT_S)


@pytest.fixture(scope="module")
def timeout_worlds(request, tmp_path_factory):
    if SCENARIOS:  # after the main runs: a trap in one of these processes stays apart from them
        request.getfixturevalue("worlds")
    return _launch_all(tmp_path_factory, ["timeouts"], "shared_timeouts", TIMEOUT_LIMIT_S)


if SCENARIOS:  # (IRIS_GPU_SHARED_SCENARIOS may name the timeouts alone)
    @pytest.mark.parametrize("world_size,scenario", [(w, name) for w in WORLD_SIZES for name in SCENARIOS
                                                     if applies(name, w)])
    def test_scenario(worlds, world_size, scenario):
        worlds[world_size].check(scenario)

    @pytest.mark.parametrize("world_size", WORLD_SIZES)
    def test_every_process_ended_cleanly(worlds, world_size):
        worlds[world_size].check_exit()


if TIMEOUTS:
    @pytest.mark.parametrize("world_size", WORLD_SIZES)
    def test_absent_rank_fails_the_others_promptly(timeout_worlds, world_size):
        """The last rank never calls a device barrier, then an all_reduce (timeout_s=3 each): the
        others get PeerTimeoutError naming it, then a failed all_reduce; no process hangs."""
        result = timeout_worlds[world_size]
        result.check("timeouts")
        result.check_exit()
