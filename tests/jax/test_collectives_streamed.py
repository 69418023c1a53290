"""Streamed push (iris_core.collectives.streamed) on the CPU simulator: the kinds in
which every member sends to every other, one chunk, half the programs sending and half
receiving tile by tile. CollectiveConfig(stream_from=0) makes every such call stream,
stream_until=0 makes small calls pull."""

import pytest
from jax import lax

import iris_jax
from iris_core.collectives import kernels as K
from iris_jax._runtime import backends
from iris_jax.collectives import lowering
from iris_jax.config import CollectiveConfig
from tests.jax.test_collectives import BF16, F32, I32, Case, _reduce_tol, mesh_of, run_cases

N = 1001  # per device: several tiles of the simulator's 256 elements, the last one partial


def _cases(G, dtype):
    n = N // G * G
    return [
        Case("psum", (N,), lambda v: iris_jax.psum(v, "i"), lambda v: lax.psum(v, "i"), True,
             tol=_reduce_tol(dtype, G, "one_shot")),
        Case("pmax 2-D", (7, 143), lambda v: iris_jax.pmax(v, "i"), lambda v: lax.pmax(v, "i")),
        # fewer tiles: the later tiles' delivery counts now lag the first ones'
        Case("psum, 2 tiles", (301,), lambda v: iris_jax.psum(v, "i"), lambda v: lax.psum(v, "i"), True,
             tol=_reduce_tol(dtype, G, "one_shot")),
        Case("all_gather", (N,), lambda v: iris_jax.all_gather(v, "i"), lambda v: lax.all_gather(v, "i")),
        Case("psum_scatter", (n,), lambda v: iris_jax.psum_scatter(v, "i", tiled=True),
             lambda v: lax.psum_scatter(v, "i", tiled=True), True),
        Case("all_to_all", (n,), lambda v: iris_jax.all_to_all(v, "i", 0, 0, tiled=True),
             lambda v: lax.all_to_all(v, "i", 0, 0, tiled=True)),
        Case("ppermute (never streams)", (N,), lambda v: iris_jax.ppermute(v, "i", [(i, (i + 1) % G) for i in range(G)]),
             lambda v: lax.ppermute(v, "i", [(i, (i + 1) % G) for i in range(G)])),
    ]


@pytest.fixture
def launched(monkeypatch):
    """The STREAM argument of every collective kernel launched (traced) from now on, with
    every call that can stream streaming (stream_from=0)."""
    with iris_jax.use_config(CollectiveConfig(stream_from=0, block=256)):  # small tiles: several per call
        yield _spy(monkeypatch)


def _spy(monkeypatch):
    streams = []
    real_call = lowering.triton_call

    def spy(*args, **kwargs):
        streams.append(kwargs["STREAM"])
        return real_call(*args, **kwargs)

    monkeypatch.setattr(lowering, "triton_call", spy)
    return streams


@pytest.mark.parametrize("W,dtype", [(2, F32), (3, BF16), (4, I32)], ids=["2-float32", "3-bfloat16", "4-int32"])
def test_streamed_collectives_match_lax(launched, W, dtype, rng):
    run_cases(mesh_of((W,), ("i",)), _cases(W, dtype), dtype, rng)
    assert launched == [True] * 6 + [False]  # every kind but ppermute streamed
    # twice in a row: the parity buffers and tile flags of the previous call are reused
    run_cases(mesh_of((W,), ("i",)), _cases(W, dtype), dtype, rng)


def test_small_calls_stream_by_default_but_all_gather(monkeypatch, rng):
    """By default small calls stream (up to CollectiveConfig().stream_until) except
    all_gather's; with stream_until=0 they all pull, as calls of 1-16 MiB do."""
    launched = _spy(monkeypatch)
    with iris_jax.use_config(CollectiveConfig(block=256)):
        run_cases(mesh_of((2,), ("i",)), _cases(2, F32), F32, rng)
    assert launched == [True] * 3 + [False, True, True, False]
    launched.clear()
    with iris_jax.use_config(CollectiveConfig(stream_until=0, block=256)):
        run_cases(mesh_of((2,), ("i",)), _cases(2, F32), F32, rng)
    assert launched == [False] * 7


@pytest.fixture
def small_workspace_big_stream_buffers(monkeypatch):
    """A fresh runtime whose workspace buffers hold 8 KiB but whose streamed buffers hold
    256 KiB (IRIS_STREAM_BYTES), dropped afterwards."""
    iris_jax.shutdown()
    monkeypatch.setenv("IRIS_WORKSPACE_BYTES", "8192")
    monkeypatch.setenv("IRIS_STREAM_BYTES", str(256 << 10))
    yield
    iris_jax.shutdown()


def test_streamed_buffers_sized_apart(small_workspace_big_stream_buffers, launched, rng):
    """Calls larger than the workspace's chunk still stream when they fit the streamed
    buffers (as 64 MiB calls on 2 GPUs with IRIS_STREAM_BYTES = 128 MiB)."""
    run_cases(mesh_of((3,), ("i",)), _cases(3, F32), F32, rng)
    assert launched == [True] * 6 + [False]
    from iris_jax._runtime.workspace import workspaces

    layout = workspaces().layout
    assert (layout.data_bytes, layout.stream_capacity) == (8192, 256 << 10)


def test_stream_setting():
    config = CollectiveConfig(stream_from=1 << 20, stream_until=4096)
    streams = lowering.streams
    assert streams(K.ALL_REDUCE, K.ONE_SHOT, 1 << 20, 2, config)
    assert not streams(K.ALL_REDUCE, K.ONE_SHOT, (1 << 20) - 1, 2, config)
    assert streams(K.ALL_REDUCE, K.ONE_SHOT, 4096, 2, config)  # small calls stream too
    assert streams(K.ALL_TO_ALL, K.ONE_SHOT, 4096, 2, config)
    assert not streams(K.ALL_GATHER, K.ONE_SHOT, 4096, 2, config)  # but all_gather's
    assert not streams(K.ALL_REDUCE, K.TWO_SHOT, 1 << 20, 2, config)
    assert not streams(K.PPERMUTE, K.ONE_SHOT, 1 << 20, 2, config)  # not every member sends to every other
    assert not streams(K.ALL_GATHER, K.ONE_SHOT, 1 << 20, 1, config)  # a group of one has no peer
    assert not streams(K.ALL_REDUCE, K.ONE_SHOT, 4096, 2, config.replace(stream_until=0))  # 0: never small


def test_stream_settings_from_the_environment():
    """The IRIS_COLLECTIVE_STREAM_* variables are CollectiveConfig.from_env's, checked there."""
    config = CollectiveConfig.from_env({"IRIS_COLLECTIVE_STREAM_FROM": str(1 << 20),
                                        "IRIS_COLLECTIVE_STREAM_UNTIL": "4096",
                                        "IRIS_COLLECTIVE_STREAM_SENDERS": "25"})
    assert (config.stream_from, config.stream_until, config.stream_senders_percent) == (1 << 20, 4096, 25)
    assert CollectiveConfig.from_env({}) == CollectiveConfig()
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_STREAM_FROM='1M': expected a byte count"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_STREAM_FROM": "1M"})
    with pytest.raises(ValueError, match="stream_senders_percent must be in"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_STREAM_SENDERS": "100"})


def test_stream_programs_balance_rounds():
    """Senders and receivers: the fewest programs that take as few rounds of tiles as the most
    would, so no round but the last is short and the last is as full as it can be."""
    default = CollectiveConfig().stream_senders_percent

    def split(tiles, max_programs, percent=default):
        return lowering.stream_programs(tiles, max_programs, percent)

    assert split(2048, 132) == (64, 64)  # 32 rounds each, not 31 and 2 tiles over 66
    assert split(2049, 132) == (65, 65)  # 32 rounds: the last holds 34 tiles, not 3
    assert split(128, 132) == (64, 64)
    assert split(5, 132) == (5, 5)  # one round: a program per tile
    assert split(7, 2) == (1, 1)  # the simulator's two programs
    assert split(2048, 132, 25) == (33, 98)  # at most 33 senders: 63 rounds; at most 99 receivers: 21


def test_streamed_launch_config():
    """On GPUs streamed calls get two programs of 4 warps per SM (capped at MAX_PROGRAMS), the
    others one of 8; each has its own overrides, and bad values fail when the config is made."""
    from types import SimpleNamespace

    gpu = SimpleNamespace(backend=backends.GpuSingleProcess(), devices=[SimpleNamespace(core_count=132)])
    launch_config = lowering.launch_config
    assert launch_config(gpu, CollectiveConfig()) == (8192, 132, 8)
    assert launch_config(gpu, CollectiveConfig(), streamed=True) == (8192, 256, 4)
    config = CollectiveConfig(stream_programs_per_sm=1, stream_warps=8)
    assert launch_config(gpu, config, streamed=True) == (8192, 132, 8)
    assert launch_config(gpu, config) == (8192, 132, 8)  # the other calls' knobs are apart
    config = CollectiveConfig(block=1024, programs_per_sm=2, warps=4)
    assert launch_config(gpu, config) == (1024, 256, 4)
    assert launch_config(gpu, config, streamed=True) == (1024, 256, 4)  # the block is shared, the rest apart
    for bad, match in (({"stream_warps": 3}, "stream_warps must be one of"), ({"warps": 64}, "warps must be one of"),
                       ({"stream_programs_per_sm": 0}, "stream_programs_per_sm must be >= 1"),
                       ({"programs_per_sm": 0}, "programs_per_sm must be >= 1"),
                       ({"block": 300}, "block must be a power of two >= 256")):
        with pytest.raises(ValueError, match=match):
            CollectiveConfig(**bad)
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_STREAM_WARPS='x': expected an integer"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_STREAM_WARPS": "x"})
    with pytest.raises(ValueError, match="stream_warps must be one of"):
        CollectiveConfig.from_env({"IRIS_COLLECTIVE_STREAM_WARPS": "3"})
