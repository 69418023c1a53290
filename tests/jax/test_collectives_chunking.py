"""iris_jax collectives on arrays larger than the workspace: processed in chunks (CPU
simulator, IRIS_WORKSPACE_BYTES=8192, i.e. 2048 float32 per staged block).

The workspace size is read when a runtime's workspace is created (its first collective),
so the module fixture starts a fresh runtime with the small setting and afterwards drops
it, restoring the environment, so that later tests get the default workspace.
"""

import os

import pytest

import iris_jax
from iris_core.collectives import kernels as K
from iris_jax._runtime.workspace import workspaces
from iris_jax.collectives import lowering
from iris_jax.config import CollectiveConfig
from tests.jax.test_collectives import BF16, F32, I32, Case, _pbroadcast_ref, _reduce_tol, mesh_of, run_cases, variants

WORKSPACE_BYTES = 8192
N = 5000  # per device: several chunks of every kind, not a multiple of the block or the chunk


@pytest.fixture(scope="module")
def small_workspace():
    """A fresh runtime with IRIS_WORKSPACE_BYTES = WORKSPACE_BYTES, in which small calls do not
    stream (the config it yields and makes the default: stream_until=0, since they would fit
    the streamed buffers, 4 x as large)."""
    settings = {"IRIS_WORKSPACE_BYTES": str(WORKSPACE_BYTES)}
    saved = {name: os.environ.get(name) for name in settings}
    iris_jax.shutdown()
    os.environ.update(settings)
    try:
        with iris_jax.use_config(CollectiveConfig(stream_until=0)) as config:
            yield config
    finally:
        iris_jax.shutdown()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _cases(ax, G, dtype):
    from jax import lax

    n = N // G * G
    cases = [Case(f"psum {variant}", (N,), lambda v, variant=variant: iris_jax.psum(v, ax, variant=variant),
                  lambda v: lax.psum(v, ax), True, tol=_reduce_tol(dtype, G, variant)) for variant in variants(dtype)]
    cases += [
        Case("all_reduce min ring", (N,), lambda v: iris_jax.all_reduce(v, ax, "min", "ring"),
             lambda v: lax.pmin(v, ax)),
        Case("pmax", (N,), lambda v: iris_jax.pmax(v, ax), lambda v: lax.pmax(v, ax)),
        Case("all_gather", (N,), lambda v: iris_jax.all_gather(v, ax), lambda v: lax.all_gather(v, ax)),
        Case("psum_scatter", (n,), lambda v: iris_jax.psum_scatter(v, ax, tiled=True),
             lambda v: lax.psum_scatter(v, ax, tiled=True), True),
        Case("psum_scatter 2-D", (G, 1250), lambda v: iris_jax.psum_scatter(v, ax),
             lambda v: lax.psum_scatter(v, ax), True),
        Case("all_to_all", (n,), lambda v: iris_jax.all_to_all(v, ax, 0, 0, tiled=True),
             lambda v: lax.all_to_all(v, ax, 0, 0, tiled=True)),
        Case("ppermute", (N,), lambda v: iris_jax.ppermute(v, ax, [(i, (i + 1) % G) for i in range(G)]),
             lambda v: lax.ppermute(v, ax, [(i, (i + 1) % G) for i in range(G)])),
        Case("broadcast", (N,), lambda v: iris_jax.broadcast(v, ax, G - 1),
             lambda v: _pbroadcast_ref(v, ax, G - 1)),
    ]
    for c in cases:
        c.name = f"{c.name} over {ax}"
    return cases


@pytest.mark.parametrize("dtype", [F32, BF16, I32], ids=["float32", "bfloat16", "int32"])
def test_chunked_collectives_match_lax(small_workspace, dtype, rng):
    mesh = mesh_of((3,), ("i",))
    run_cases(mesh, _cases("i", 3, dtype), dtype, rng)
    assert workspaces().layout.data_bytes == WORKSPACE_BYTES  # the cases really were chunked


def test_chunked_collectives_2d(small_workspace, rng):
    mesh = mesh_of((2, 2), ("x", "y"))
    run_cases(mesh, _cases(("y", "x"), 4, F32)[:8] + _cases("x", 2, F32)[7:], F32, rng)
    assert workspaces().layout.data_bytes == WORKSPACE_BYTES


@pytest.mark.parametrize("W,dtype", [(3, F32), (4, BF16), (2, I32)], ids=["3-float32", "4-bfloat16", "2-int32"])
def test_chunked_collectives_push(small_workspace, W, dtype, rng):
    """Push mode (push_from=0: every size pushes): the same cases, chunked (a buffer then
    holds one slot per sender, so the chunks are smaller still)."""
    with iris_jax.use_config(small_workspace.replace(push_from=0)):
        run_cases(mesh_of((W,), ("i",)), _cases("i", W, dtype), dtype, rng)


def test_push_setting():
    config = CollectiveConfig(push_from=1 << 20)
    assert lowering.pushes(K.ALL_GATHER, K.ONE_SHOT, 1 << 20, config)
    assert not lowering.pushes(K.ALL_REDUCE, K.TWO_SHOT, 1 << 20, config)  # not pipelined
    assert not lowering.pushes(K.ALL_GATHER, K.ONE_SHOT, (1 << 20) - 1, config)
    assert lowering.pushes(K.ALL_GATHER, K.ONE_SHOT, 0, config.replace(push_from=0))  # 0: always


def test_push_setting_must_be_a_byte_count():
    assert CollectiveConfig.from_env({"IRIS_COLLECTIVE_PUSH_FROM": str(1 << 20)}).push_from == 1 << 20
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_PUSH_FROM='16M': expected a byte count"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_PUSH_FROM": "16M"})
    with pytest.raises(ValueError, match="push_from must be a byte count >= 0"):
        CollectiveConfig(push_from=-1)


@pytest.mark.parametrize("push_from", [0, 1 << 40], ids=["push", "pull"])
def test_chunk_cap_splits_a_large_workspace(push_from, rng):
    """chunk_bytes caps the chunk below what the workspace holds: the same cases, in chunks
    of 2048 bytes per block, pushing and pulling."""
    with iris_jax.use_config(CollectiveConfig(chunk_bytes=2048, push_from=push_from, stream_until=0)):
        run_cases(mesh_of((3,), ("i",)), _cases("i", 3, F32), F32, rng)


def test_chunk_cap_setting():
    assert CollectiveConfig().chunk_bytes is None  # no cap: what the workspace holds
    assert CollectiveConfig.from_env({"IRIS_COLLECTIVE_CHUNK_BYTES": "2048"}).chunk_bytes == 2048
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_CHUNK_BYTES='2K': expected a byte count"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_CHUNK_BYTES": "2K"})
    with pytest.raises(ValueError, match="chunk_bytes must be > 0"):
        CollectiveConfig(chunk_bytes=0)
