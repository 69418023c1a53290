"""The simulator's launch geometry (iris_jax.collectives.lowering.launch_config): large tiles by default,
small ones by configuration (tests of the tiling pass `CollectiveConfig(block=256)`)."""

from types import SimpleNamespace

import jax
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax._runtime import backends
from iris_jax._runtime.workspace import workspaces
from iris_jax.collectives import lowering
from iris_jax.config import CollectiveConfig
from tests.jax.test_collectives import mesh_of

SIM = SimpleNamespace(backend=backends.SimulatorWorkers(), devices=[])


def test_simulator_defaults_and_overrides():
    assert lowering.launch_config(SIM, CollectiveConfig()) == (backends.SIM_BLOCK, 2, 4)
    assert lowering.launch_config(SIM, CollectiveConfig(block=256)) == (256, 2, 4)  # the old tiling
    assert lowering.launch_config(SIM, CollectiveConfig(block=1024, programs_per_sm=3)) == (1024, 6, 4)
    gpu = SimpleNamespace(backend=backends.GpuSingleProcess(), devices=[SimpleNamespace(core_count=132)])
    assert lowering.launch_config(gpu, CollectiveConfig()) == (8192, 132, 8)  # GPUs unchanged


def test_simulator_workspace_scales_with_the_heap(monkeypatch):
    """Heaps of 64 MiB and more get 1 MiB collective buffers, smaller ones (the tests' 16 MiB)
    256 KiB; the streamed buffers stay 1 MiB; IRIS_WORKSPACE_BYTES still decides when set."""
    from iris_jax._runtime.workspace import GroupWorkspaces

    for name in ("IRIS_WORKSPACE_BYTES", "IRIS_STREAM_BYTES"):
        monkeypatch.delenv(name, raising=False)

    def layout(heap_size):
        rt = SimpleNamespace(backend=backends.SimulatorWorkers(), world_size=4, heap_size=heap_size)
        return GroupWorkspaces(rt).layout

    assert (layout(16 << 20).data_bytes, layout(16 << 20).stream_capacity) == (256 << 10, 1 << 20)
    assert (layout(64 << 20).data_bytes, layout(64 << 20).stream_capacity) == (1 << 20, 1 << 20)
    monkeypatch.setenv("IRIS_WORKSPACE_BYTES", str(8192))
    assert (layout(64 << 20).data_bytes, layout(64 << 20).stream_capacity) == (8192, 4 * 8192)


def test_fitting_block_never_overruns_a_slot():
    assert lowering.fitting_block(1 << 16, 256 << 10, 1, 4) == 1 << 16
    assert lowering.fitting_block(1 << 16, 256 << 10, 4, 4) == 1 << 14  # 4 slots of 64 KiB
    assert lowering.fitting_block(1 << 16, 256 << 10, 3, 2) == 1 << 15  # 85 KiB slots of bfloat16
    assert lowering.fitting_block(1 << 16, 8192, 8, 4) == lowering.MIN_BLOCK  # never below


def _blocks(monkeypatch):
    blocks = []
    real_call = lowering.triton_call

    def spy(*args, **kwargs):
        blocks.append((kwargs["BLOCK"], kwargs["CHUNK"], kwargs["grid"]))
        return real_call(*args, **kwargs)

    monkeypatch.setattr(lowering, "triton_call", spy)
    return blocks


@pytest.mark.parametrize("config,block,m", [
    (CollectiveConfig(stream_until=0), None, None), (CollectiveConfig(block=256), 256, 1000)],
                         ids=["default", "block=256"])
def test_psum_scatter_tiles_match_lax(monkeypatch, config, block, m, rng):
    """psum_scatter over 4 ranks of 4 blocks of m floats per rank, against lax. Pulled, the
    default tile shrinks to the workspace's slots, a quarter of its buffer (3 chunks of one
    tile); block=256: 4 tiles (streamed)."""
    mesh = mesh_of((4,), ("i",))
    if block is None:  # the slot of the runtime's workspace (its size scales with the heap)
        block = workspaces().layout.data_bytes // 4 // 4
        m = 2 * block + 100
    blocks = _blocks(monkeypatch)
    x = jax.device_put(rng.standard_normal(4 * 4 * m).astype(np.float32),
                       jax.sharding.NamedSharding(mesh, P("i")))

    def run(op):
        return jax.jit(jax.shard_map(op, mesh=mesh, in_specs=P("i"), out_specs=P("i")))(x)

    got = np.asarray(run(lambda v: iris_jax.psum_scatter(v, "i", tiled=True, config=config)))
    np.testing.assert_allclose(got, np.asarray(run(lambda v: lax.psum_scatter(v, "i", tiled=True))),
                               rtol=1e-5, atol=1e-5)
    assert blocks and all(b == block for b, _, _ in blocks)
