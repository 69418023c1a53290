"""iris_jax.tracing on the CPU simulator (4 ranks): what a jitted step records, how
enable/disable/reset interact with jit caching, overflow, export, plot, the example."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import IrisError
from iris_jax.tracing import events
from tests.jax import tracing_kernels
from tests.jax.helpers import run_python, smap, use_runtime

W = 4
N = 13
BLOCK = 16


@pytest.fixture
def setup():
    """(jitted step, its input): barrier, then every rank reads its next rank's x."""
    rt = use_runtime(W)
    mesh = jax.make_mesh((W,), ("i",), devices=rt.devices)
    x = iris_jax.to_heap(jnp.arange(W * N, dtype=jnp.float32), sharding=NamedSharding(mesh, P("i")))

    def step(x):
        status, x = iris_jax.device_barrier(x)
        out = iris_jax.triton_call(x, N, kernel=tracing_kernels.read_next, grid=(1,),
                                   out_shape=jax.ShapeDtypeStruct((N,), x.dtype), W=W, BLOCK=BLOCK,
                                   TRACING=iris_jax.tracing.is_enabled(), symmetric=(0,))
        return out, status

    yield smap(mesh, step, P("i"), (P("i"), P("i"))), x
    iris_jax.tracing.disable()  # the runtime is shared: later tests run untraced


def run(f, x):
    out, status = f(x)
    iris_jax.check_barrier(status)
    np.testing.assert_array_equal(np.asarray(out).reshape(W, N), np.roll(np.arange(W * N).reshape(W, N), -1, axis=0))


def per_rank():
    return [len(t) for t in iris_jax.tracing.read()]


BARRIER_KERNEL = ["barrier"] + ["atomic_max"] * W  # the barrier span, one signal per peer inside
READ_KERNEL = ["transfer", "load"]  # the kernel's span, its load inside


def test_a_jitted_step_records_barrier_rma_and_phase_events(setup):
    f, x = setup
    iris_jax.tracing.enable(max_events=256)
    run(f, x)
    for t in iris_jax.tracing.read():
        r, e = t.rank, t.events
        names = [events.event_name(int(i)) for i in e["event_id"]]
        # each kernel's events are contiguous; XLA does not order the two kernels (no data dependency)
        assert names in (BARRIER_KERNEL + READ_KERNEL, READ_KERNEL + BARRIER_KERNEL), names
        assert t.attempted == W + 3 and t.dropped == 0
        np.testing.assert_array_equal(e["op_index"], np.arange(W + 3))
        assert np.all(e["cur_rank"] == r) and np.all(e["duration"] >= 0)
        barrier = e[np.isin(e["event_id"], [events.BARRIER, events.ATOMIC_MAX])]
        read = e[np.isin(e["event_id"], [events.TRANSFER, events.LOAD])]
        np.testing.assert_array_equal(barrier["target_rank"], [r, *range(W)])
        np.testing.assert_array_equal(barrier["payload_size"], [8] * (W + 1))
        np.testing.assert_array_equal(read["target_rank"], [(r + 1) % W] * 2)
        np.testing.assert_array_equal(read["payload_size"], [N * 4] * 2)
        assert (read["pid_m"][0], read["pid_n"][0]) == (5, 6) and read["address"][0] == read["address"][1] != 0
        for span in (barrier, read):  # nesting inside one kernel: the inner events within the span
            end = span["timestamp"] + span["duration"]
            assert np.all(span["timestamp"][1:] >= span["timestamp"][0]) and np.all(end[1:] <= end[0])


@pytest.mark.parametrize("variant", ["one_shot", "two_shot"])
def test_library_collectives_record_their_phases(variant):
    """A traced pulling psum (3 ranks, 37 values: one tile, so one program per rank in the
    simulator's grid; small calls do not stream here) records per rank: a `transfer` span over
    the exchange holding its `wait` spans, one `atomic_max` signal per member and round, and
    one `load` per member read."""
    pulling = iris_jax.CollectiveConfig(stream_until=0)
    rt = use_runtime(3)
    mesh = jax.make_mesh((3,), ("i",), devices=rt.devices)
    x = jax.device_put(jnp.arange(3 * 37, dtype=jnp.float32), NamedSharding(mesh, P("i")))
    iris_jax.tracing.enable(max_events=256)
    try:
        out = smap(mesh, lambda v: iris_jax.psum(v, "i", variant=variant, config=pulling), P("i"),
                   P())(x)
        np.testing.assert_allclose(np.asarray(out), np.arange(3 * 37, dtype=np.float32).reshape(3, 37).sum(0))
        rounds = 2 if variant == "two_shot" else 1
        for t in iris_jax.tracing.read():
            e = t.events
            names = [events.event_name(int(i)) for i in e["event_id"]]
            assert names.count("transfer") == 1 and names.count("wait") == rounds, names
            assert names.count("atomic_max") == 3 * rounds, names
            # one tile: one-shot reads every member; two-shot's owner (member 0) reads every member,
            # the others read the owner's result
            loads = 3 if variant == "one_shot" or t.rank == 0 else 1
            assert names.count("load") == loads, names
            transfer = e[e["event_id"] == events.TRANSFER][0]
            inner = e[e["event_id"] != events.TRANSFER]
            assert np.all(e["duration"] >= 0) and np.all(inner["timestamp"] >= transfer["timestamp"])
            assert np.all(inner["timestamp"] + inner["duration"] <= transfer["timestamp"] + transfer["duration"])
            targets = sorted(e[e["event_id"] == events.LOAD]["target_rank"].tolist())
            assert targets == ([0, 1, 2] if loads == 3 else [0])
    finally:
        iris_jax.tracing.disable()


def test_streamed_collective_records_each_programs_share():
    """A traced streamed psum (3 ranks, 37 values: one tile, one sending and one receiving
    program per rank) records per rank a `transfer` span per program; the sender's holds a
    `store` of the tile, a `store` of its call's signature and an `atomic_xchg` of its flag per
    peer, the receiver's a `wait`."""
    rt = use_runtime(3)
    mesh = jax.make_mesh((3,), ("i",), devices=rt.devices)
    x = jax.device_put(jnp.arange(3 * 37, dtype=jnp.float32), NamedSharding(mesh, P("i")))
    iris_jax.tracing.enable(max_events=256)
    try:
        out = smap(mesh, lambda v: iris_jax.psum(v, "i"), P("i"), P())(x)
        np.testing.assert_allclose(np.asarray(out), np.arange(3 * 37, dtype=np.float32).reshape(3, 37).sum(0))
        for t in iris_jax.tracing.read():
            e = t.events
            names = sorted(events.event_name(int(i)) for i in e["event_id"])
            assert names == ["atomic_xchg"] * 2 + ["store"] * 4 + ["transfer"] * 2 + ["wait"], names
            peers = sorted({0, 1, 2} - {t.rank})
            assert sorted(e[e["event_id"] == events.STORE]["target_rank"].tolist()) == sorted(peers * 2)
    finally:
        iris_jax.tracing.disable()


def test_enable_disable_reset_and_jit_caching(setup):
    f, x = setup
    iris_jax.tracing.disable()
    run(f, x)  # compiled with tracing off
    iris_jax.tracing.enable(max_events=256)
    assert iris_jax.tracing.is_enabled() and per_rank() == [0] * W  # enable clears the buffers
    run(f, x)  # the same jitted function: enable() dropped the compiled executables, so it records
    assert per_rank() == [W + 3] * W
    run(f, x)  # cached executable, still traced
    assert per_rank() == [2 * (W + 3)] * W
    iris_jax.tracing.reset()
    assert per_rank() == [0] * W
    run(f, x)
    iris_jax.tracing.disable()
    assert not iris_jax.tracing.is_enabled()
    run(f, x)  # recompiled without tracing: nothing more, the recorded events stay readable
    assert per_rank() == [W + 3] * W
    from iris_core.heap.context_layout import TRACE_WORDS, trace_offset

    words = iris_jax.runtime().context(0).view(np.uint64)
    assert np.all(words[trace_offset(W):trace_offset(W) + TRACE_WORDS] == 0)  # the context carries no tracing words


def test_overflow_export_and_plot(setup, tmp_path):
    f, x = setup
    iris_jax.tracing.enable(max_events=3)
    run(f, x)
    traces = iris_jax.tracing.read()
    assert [(len(t), t.attempted, t.dropped) for t in traces] == [(3, W + 3, W)] * W
    with pytest.warns(UserWarning, match="dropped"):
        (path,) = iris_jax.tracing.export(str(tmp_path / "trace.json"))
    doc = json.load(open(path))
    processes = {e["pid"]: e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert processes == {r: f"rank {r}" for r in range(W)}
    tracks = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert tracks == {(r, "SM 0") for r in range(W)}  # one program per kernel: SM (program) 0
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted((e["pid"], e["name"]) for e in spans) == sorted(
        (r, name) for r in range(W) for name in ("barrier", "atomic_max", "atomic_max"))
    assert min(e["ts"] for e in spans) == 0.0 and all(e["dur"] >= 0 for e in spans)
    assert all(doc["otherData"]["ranks"][str(r)]["dropped"] == W for r in range(W))
    with pytest.warns(UserWarning, match="dropped"):
        paths = iris_jax.tracing.export(str(tmp_path / "split.json"), merge=False)
    assert paths == [str(tmp_path / f"split.rank{r}.json") for r in range(W)]
    png = iris_jax.tracing.plot(path, str(tmp_path / "trace.png"))
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_errors_are_clear():
    use_runtime(W)
    with pytest.raises(ValueError, match="max_events"):
        iris_jax.tracing.enable(max_events=0)
    with pytest.raises(iris_jax.HeapExhaustedError, match="max_events"):
        iris_jax.tracing.enable(max_events=1 << 40)
    assert not iris_jax.tracing.is_enabled()
    with pytest.raises(IrisError, match="plot"):
        iris_jax.tracing.plot({"traceEvents": []}, "/nonexistent/x.png")


def test_example_writes_trace_and_timeline(tmp_path):
    result = run_python(["examples/04_trace_all_reduce.py", "--out", str(tmp_path)], timeout=300,
                        XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0, result.stdout
    assert "OK: 4 ranks (sim-workers)" in result.stdout, result.stdout
    doc = json.load(open(tmp_path / "trace_all_reduce.json"))
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert names == {"barrier", "atomic_max", "transfer", "load", "reduce"}
    assert open(tmp_path / "trace_all_reduce.png", "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_launched_ranks_read_every_rank(tmp_path):
    """One process per rank (python -m iris_core.sim): each records into its own heap, any reads all."""
    path = str(tmp_path / "launched.json")
    result = run_python(["-m", "iris_core.sim", "-n", "2", "--timeout", "240", "tests/jax/launched_tracing.py", path],
                        timeout=300)
    assert result.returncode == 0, result.stdout
    for rank in range(2):
        assert f"rank {rank}/2: tracing OK" in result.stdout, result.stdout
    doc = json.load(open(path))
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert sorted({(e["pid"], e["name"]) for e in spans}) == [
        (r, name) for r in range(2) for name in ("atomic_max", "barrier", "load", "transfer")]
