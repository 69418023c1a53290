"""A partially manual shard_map on GPUs: examples/08's transformer block (tp by hand, dp left to
XLA) as dp=2 x tp=2 from 4 processes sharing GPU 0 (pytest -m gpu).

The `tp_fsdp` scenario of tests/gpu/scenarios.py: the block's output and its input's gradient
with every tp collective an iris kernel, lowered in the nested per-shard regions of
iris_jax.collectives.primitive, each rank checking its shards against the block on its own device. The
weights are replicated over dp there (NCCL refuses ranks that share a GPU, so the program
must need no XLA collective; the scenario checks that it has none).

Settings: IRIS_GPU_PARTIAL_WORLDS (default "4"), IRIS_GPU_PARTIAL_LIMIT (seconds, default
240), IRIS_GPU_LOG_DIR (keep the processes' logs there).
"""

import os
from pathlib import Path

import pytest

from tests.gpu import launcher

pytestmark = pytest.mark.gpu

WORLD_SIZES = [int(w) for w in os.environ.get("IRIS_GPU_PARTIAL_WORLDS", "4").split(",")]
LIMIT_S = float(os.environ.get("IRIS_GPU_PARTIAL_LIMIT", 240))


@pytest.fixture(scope="module")
def worlds(tmp_path_factory):
    if launcher.gpu_count() < 1:
        pytest.fail("the gpu tests need a GPU (they never skip)")
    root = os.environ.get("IRIS_GPU_LOG_DIR")
    log_dir = Path(root) / "partially_manual" if root else tmp_path_factory.mktemp("partially_manual")
    runs = {w: launcher.start(w, ["tp_fsdp"], shared=True, log_dir=log_dir, limit_s=LIMIT_S) for w in WORLD_SIZES}
    results = {w: run.wait() for w, run in runs.items()}
    launcher.SUMMARY.extend(results.values())
    return results


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_tp_fsdp_block(worlds, world_size):
    worlds[world_size].check("tp_fsdp")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_every_process_ended_cleanly(worlds, world_size):
    worlds[world_size].check_exit()
