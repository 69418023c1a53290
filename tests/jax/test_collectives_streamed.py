"""Streamed push (iris_core.collectives.kernels._streamed) on the CPU simulator: the kinds in
which every member sends to every other, one chunk, half the programs sending and half
receiving tile by tile. IRIS_COLLECTIVE_STREAM_FROM=0 makes every such call stream,
IRIS_COLLECTIVE_STREAM_UNTIL=0 makes small calls pull."""

import pytest
from jax import lax

import iris_jax
from iris_jax import collectives
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
    every call that can stream streaming (IRIS_COLLECTIVE_STREAM_FROM=0)."""
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_FROM", "0")
    return _spy(monkeypatch)


def _spy(monkeypatch):
    streams = []
    real_call = collectives.triton_call

    def spy(*args, **kwargs):
        streams.append(kwargs["STREAM"])
        return real_call(*args, **kwargs)

    monkeypatch.setattr(collectives, "triton_call", spy)
    return streams


@pytest.mark.parametrize("W,dtype", [(2, F32), (3, BF16), (4, I32)], ids=["2-float32", "3-bfloat16", "4-int32"])
def test_streamed_collectives_match_lax(launched, W, dtype, rng):
    run_cases(mesh_of((W,), ("i",)), _cases(W, dtype), dtype, rng)
    assert launched == [True] * 6 + [False]  # every kind but ppermute streamed
    # twice in a row: the parity buffers and tile flags of the previous call are reused
    run_cases(mesh_of((W,), ("i",)), _cases(W, dtype), dtype, rng)


def test_small_calls_stream_by_default_but_all_gather(monkeypatch, rng):
    """By default small calls stream (up to STREAM_UNTIL_BYTES) except all_gather's; with
    IRIS_COLLECTIVE_STREAM_UNTIL=0 they all pull, as calls of 1-16 MiB do."""
    launched = _spy(monkeypatch)
    run_cases(mesh_of((2,), ("i",)), _cases(2, F32), F32, rng)
    assert launched == [True] * 3 + [False, True, True, False]
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_UNTIL", "0")
    launched.clear()
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
    buffers (as 64 MiB calls on 2 GPUs with IRIS_STREAM_BYTES = 128 MiB, RESULTS run 38)."""
    run_cases(mesh_of((3,), ("i",)), _cases(3, F32), F32, rng)
    assert launched == [True] * 6 + [False]
    from iris_jax.workspace import workspaces

    layout = workspaces().layout
    assert (layout.data_bytes, layout.stream_capacity) == (8192, 256 << 10)


def test_stream_setting(monkeypatch):
    K = collectives.K
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_FROM", str(1 << 20))
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_UNTIL", "4096")
    assert collectives._stream(K.ALL_REDUCE, K.ONE_SHOT, 1 << 20, 2)
    assert not collectives._stream(K.ALL_REDUCE, K.ONE_SHOT, (1 << 20) - 1, 2)
    assert collectives._stream(K.ALL_REDUCE, K.ONE_SHOT, 4096, 2)  # small calls stream too
    assert collectives._stream(K.ALL_TO_ALL, K.ONE_SHOT, 4096, 2)
    assert not collectives._stream(K.ALL_GATHER, K.ONE_SHOT, 4096, 2)  # but all_gather's
    assert not collectives._stream(K.ALL_REDUCE, K.TWO_SHOT, 1 << 20, 2)
    assert not collectives._stream(K.PPERMUTE, K.ONE_SHOT, 1 << 20, 2)  # not every member sends to every other
    assert not collectives._stream(K.ALL_GATHER, K.ONE_SHOT, 1 << 20, 1)  # a group of one has no peer
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_FROM", "1M")
    with pytest.raises(ValueError, match="IRIS_COLLECTIVE_STREAM_FROM='1M'"):
        collectives._stream(K.ALL_GATHER, K.ONE_SHOT, 1 << 20, 2)


def test_stream_programs_balance_rounds(monkeypatch):
    """Senders and receivers: the fewest programs that take as few rounds of tiles as the most
    would, so no round but the last is short and the last is as full as it can be."""
    monkeypatch.delenv("IRIS_COLLECTIVE_STREAM_SENDERS", raising=False)
    split = collectives._stream_programs
    assert split(2048, 132) == (64, 64)  # 32 rounds each, not 31 and 2 tiles over 66
    assert split(2049, 132) == (65, 65)  # 32 rounds: the last holds 34 tiles, not 3
    assert split(128, 132) == (64, 64)
    assert split(5, 132) == (5, 5)  # one round: a program per tile
    assert split(7, 2) == (1, 1)  # the simulator's two programs
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_SENDERS", "25")
    assert split(2048, 132) == (33, 98)  # at most 33 senders: 63 rounds; at most 99 receivers: 21


def test_streamed_launch_config(monkeypatch):
    """On GPUs streamed calls get two programs of 4 warps per SM (capped at MAX_PROGRAMS), the
    others one of 8; each has its own overrides, and bad values fail before anything runs."""
    from types import SimpleNamespace

    for knob in ("BLOCK", "PROGRAMS_PER_SM", "WARPS", "STREAM_PROGRAMS_PER_SM", "STREAM_WARPS"):
        monkeypatch.delenv(f"IRIS_COLLECTIVE_{knob}", raising=False)
    gpu = SimpleNamespace(mode="gpu", devices=[SimpleNamespace(core_count=132)])
    assert collectives.launch_config(gpu) == (8192, 132, 8)
    assert collectives.launch_config(gpu, streamed=True) == (8192, 256, 4)
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_PROGRAMS_PER_SM", "1")
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_WARPS", "8")
    assert collectives.launch_config(gpu, streamed=True) == (8192, 132, 8)
    monkeypatch.setenv("IRIS_COLLECTIVE_STREAM_WARPS", "3")
    with pytest.raises(ValueError, match="warps=3"):
        collectives.launch_config(gpu, streamed=True)
    assert collectives.launch_config(gpu) == (8192, 132, 8)  # the other calls' knobs are apart
