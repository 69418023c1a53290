"""Device tracing on simulated ranks: recorded fields per op kind, overflow, tracing off,
the host Tracer's state, trace-event JSON export, the timeline PNG, and the GPU build.

Every rank runs `every_op` (one event per RMA op kind, one user event, one event never
ended) toward its next rank; the parent reads every rank's buffers from the heaps.
"""

import json

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.device import Context, rma
from iris_core.device.context import OWN_BASE_WORD
from iris_core.device.tracing import EVENT_USER, EVENT_WAIT, NO_EVENT
from iris_core.errors import IrisError
from iris_core.heap.context_layout import decode_context
from iris_core.sim import get_world, launch
from iris_core.tracing import RankTrace, Tracer, chrome_trace, events, plot, write_chrome_trace
from iris_core.tracing.buffers import EVENT_DTYPE, HEADER_BYTES

BLOCK = 16
N = 11  # masked-in elements of the masked ops
GRID = 2  # programs: each records the same sequence
USER_ID = events.USER + 7
# (event id, payload bytes, which pointer is recorded, pid_m, pid_n, ended)
EXPECTED = [
    (events.LOAD, N * 4, "src", None, None, True),
    (events.STORE, N * 4, "dst", None, None, True),
    (events.GET, BLOCK * 4, "src", None, None, True),
    (events.PUT, N * 4, "dst", None, None, True),
    (events.COPY, N * 4, "dst", None, None, True),
    *[(e, 4, "flag", None, None, True) for e in (
        events.ATOMIC_ADD, events.ATOMIC_SUB, events.ATOMIC_XCHG, events.ATOMIC_XOR, events.ATOMIC_AND,
        events.ATOMIC_OR, events.ATOMIC_MIN, events.ATOMIC_MAX, events.ATOMIC_CAS)],
    (USER_ID, N * 4, "flag", 11, 12, True),
    (events.WAIT, 0, None, None, None, False),  # address=None: no memory, no payload
]
PER_PROGRAM = len(EXPECTED)


@triton.jit
def every_op(context_ptr, src_ptr, dst_ptr, flag_ptr, handles_ptr, n, W: tl.constexpr, BLOCK: tl.constexpr,
             TRACING: tl.constexpr):
    ctx = Context.initialize(context_ptr, W, tracing=TRACING)
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    peer = (ctx.rank + 1) % W
    value = ctx.load(src_ptr + offs, peer, mask=mask, other=0.0)
    ctx.store(dst_ptr + offs, value, peer, mask=mask)
    ctx.get(src_ptr + offs, dst_ptr + offs, peer)
    ctx.put(src_ptr + offs, dst_ptr + offs, peer, mask=mask)
    ctx.copy(src_ptr + offs, dst_ptr + offs, ctx.rank, peer, mask=mask)
    ctx.atomic_add(flag_ptr, 1, peer)
    ctx.atomic_sub(flag_ptr, 1, peer)
    ctx.atomic_xchg(flag_ptr, 0, peer)
    ctx.atomic_xor(flag_ptr, 0, peer)
    ctx.atomic_and(flag_ptr, -1, peer)
    ctx.atomic_or(flag_ptr, 0, peer)
    ctx.atomic_min(flag_ptr, 0, peer)
    ctx.atomic_max(flag_ptr, 0, peer)
    ctx.atomic_cas(flag_ptr, 5, 6, peer)
    user = ctx.tracing.record_event_start(EVENT_USER + 7, peer, flag_ptr + offs, 11, 12, mask=mask)
    ctx.tracing.record_event_end(user)
    never_ended = ctx.tracing.record_event_start(EVENT_WAIT, ctx.rank, None)
    pid = tl.program_id(0)
    tl.store(handles_ptr + 2 * pid, user)
    tl.store(handles_ptr + 2 * pid + 1, never_ended)


@triton.jit
def many_events(context_ptr, COUNT: tl.constexpr, W: tl.constexpr):
    ctx = Context.initialize(context_ptr, W, tracing=True)
    for i in range(COUNT):
        h = ctx.tracing.record_event_start(EVENT_USER, ctx.rank, context_ptr, i, i + 1)
        ctx.tracing.record_event_end(h)


# -- rank-side functions (run in the simulated ranks) -------------------------------------
def run_every_op(state, session, words, offsets, tracing):
    heap = state.heap(session)
    ctx = heap.context(state.rank, words)
    src, dst, flag, handles = (heap.host_view(state.rank, offsets[k], shape, dt) for k, shape, dt in (
        ("src", (BLOCK,), np.float32), ("dst", (BLOCK,), np.float32), ("flag", (BLOCK,), np.int32),
        ("handles", (2 * GRID,), np.int64)))
    launch(every_op, (GRID,), ctx, src, dst, flag, handles, N, W=state.world_size, BLOCK=BLOCK, TRACING=tracing)
    return heap.heap_bases[state.rank]


def run_many(state, session, words, count):
    heap = state.heap(session)
    launch(many_events, (GRID,), heap.context(state.rank, words), COUNT=count, W=state.world_size)


# -- helpers ------------------------------------------------------------------------------
def setup_every_op(sim_heap, world_size, max_events=64):
    heap = sim_heap(world_size)
    tracer = Tracer(heap)
    tracer.enable(max_events)
    offsets = {"src": heap.allocate(BLOCK * 4), "dst": heap.allocate(BLOCK * 4), "flag": heap.allocate(BLOCK * 4),
               "handles": heap.allocate(2 * GRID * 8)}
    return heap, tracer, offsets


def handles(heap, rank, offsets):
    return heap.host_view(rank, offsets["handles"], (GRID, 2), np.int64).copy()


# -- tests ----------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_op_kind_records_its_fields(sim_heap, world_size):
    heap, tracer, offsets = setup_every_op(sim_heap, world_size)
    worker_bases = get_world(world_size).run(run_every_op, heap.session, tracer.words(), offsets, True)
    traces = tracer.read()
    assert [t.rank for t in traces] == list(range(world_size))
    for trace in traces:
        rank, peer, e = trace.rank, (trace.rank + 1) % world_size, trace.events
        assert trace.attempted == GRID * PER_PROGRAM and trace.dropped == 0 and len(e) == GRID * PER_PROGRAM
        np.testing.assert_array_equal(e["op_index"], np.arange(GRID * PER_PROGRAM))
        assert np.all(np.diff(e["timestamp"]) >= 0), "the simulator runs programs in order"
        assert np.all(e["cur_rank"] == rank)
        for program in range(GRID):
            rows = e[program * PER_PROGRAM:(program + 1) * PER_PROGRAM]
            assert np.all(rows["pid"] == program) and np.all(rows["sm_id"] == program)  # sim: SM = program
            for row, (event_id, payload, pointer, pid_m, pid_n, ended) in zip(rows, EXPECTED, strict=True):
                what = f"rank {rank} program {program} {events.event_name(event_id)}"
                assert row["event_id"] == event_id, what
                assert row["target_rank"] == (rank if event_id == events.WAIT else peer), what
                assert row["payload_size"] == payload, what
                assert row["address"] == (worker_bases[rank] + offsets[pointer] if pointer else 0), what
                assert (row["pid_m"], row["pid_n"]) == (program if pid_m is None else pid_m,
                                                        0 if pid_n is None else pid_n), what
                assert (row["duration"] >= 0) if ended else (row["duration"] == -1), what
            # handles returned to the kernel: the slots of the user event and the open one
            first = program * PER_PROGRAM
            np.testing.assert_array_equal(handles(heap, rank, offsets)[program],
                                          [first + PER_PROGRAM - 2, first + PER_PROGRAM - 1])


def test_overflow_is_counted_and_nothing_is_written_past_the_buffers(sim_heap, tmp_path):
    world_size, max_events, count = 2, 5, 12
    heap = sim_heap(world_size)
    tracer = Tracer(heap)
    tracer.enable(max_events)
    area = tracer.buffers
    guard = heap.allocate(4096)
    assert guard == area.offset + 1024  # first fit: the guard follows the (1 KiB) area
    padding = (area.offset + area.nbytes, guard + 4096)
    for r in range(world_size):
        heap.host_view(r, padding[0], (padding[1] - padding[0],), np.uint8)[:] = 0x5A
    get_world(world_size).run(run_many, heap.session, tracer.words(), count)
    with pytest.warns(UserWarning, match="dropped"):
        paths = tracer.export(str(tmp_path / "overflow.json"))
    for trace in tracer.read():
        assert trace.attempted == GRID * count
        assert len(trace) == max_events and trace.dropped == GRID * count - max_events
        np.testing.assert_array_equal(trace.events["pid_m"], np.arange(max_events))  # program 0's first events
        assert np.all(trace.events["event_id"] == events.USER) and np.all(trace.events["pid"] == 0)
        after = heap.host_view(trace.rank, padding[0], (padding[1] - padding[0],), np.uint8)
        assert np.all(after == 0x5A), "a write landed past the trace buffers"
    doc = json.load(open(paths[0]))
    assert doc["otherData"]["ranks"]["0"] == {"recorded": max_events, "attempted": GRID * count,
                                              "dropped": GRID * count - max_events, "max_events": max_events}
    labels = [e for e in doc["traceEvents"] if e["name"] == "process_labels"]
    assert len(labels) == world_size and "19 events dropped" in labels[0]["args"]["labels"]


def test_nothing_is_recorded_with_tracing_off(sim_heap):
    world_size = 2
    heap, tracer, offsets = setup_every_op(sim_heap, world_size)
    world = get_world(world_size)
    area = [heap.host_view(r, tracer.buffers.offset, (tracer.buffers.nbytes,), np.uint8).copy() for r in range(2)]
    # built without tracing, traced context: compiles to the plain ops
    world.run(run_every_op, heap.session, tracer.words(), offsets, False)
    # built with tracing, context without the tracing words (tracing off at run time)
    tracer.disable()
    assert tracer.words() == () and decode_context(tracer.context(0))["trace"] == [0] * 17
    world.run(run_every_op, heap.session, tracer.words(), offsets, True)
    for r in range(world_size):
        np.testing.assert_array_equal(handles(heap, r, offsets), np.full((GRID, 2), NO_EVENT.value))
        after = heap.host_view(r, tracer.buffers.offset, (tracer.buffers.nbytes,), np.uint8)
        np.testing.assert_array_equal(after, area[r])
    assert [t.attempted for t in tracer.read()] == [0, 0]


def test_tracer_state_words_reset_and_close(sim_heap):
    heap = sim_heap(2)
    used = heap.used
    tracer = Tracer(heap)
    with pytest.raises(IrisError, match="never enabled"):
        tracer.read()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="max_events"):
            tracer.enable(bad)
    tracer.enable(100)
    words = tracer.words()
    area = tracer.buffers
    assert words[:4] == (1, 100, area.offset, area.offset + 128)
    assert words[4] == area.offset + HEADER_BYTES and words[5] == words[4] + 100 * 8  # 13 buffers of 100 int64
    assert len(words) == 17 and decode_context(tracer.context(1))["trace"] == list(words)
    heap.host_view(0, area.offset, (2,), np.int64)[:] = (7, 7)  # as if 7 events were recorded
    assert tracer.read([0])[0].attempted == 7
    tracer.reset()
    assert tracer.read([0])[0].attempted == 0 and len(tracer.read([0])[0]) == 0
    tracer.enable(100)
    assert tracer.buffers is area  # same capacity: same area
    tracer.enable(50)
    assert tracer.buffers is not area and tracer.max_events == 50  # the old area is kept until close
    tracer.close()
    assert heap.used == used and tracer.words() == () and not tracer.enabled


def synthetic(rank, rows, attempted=None, max_events=8):
    """A RankTrace from (event_id, sm, pid, timestamp, duration) rows."""
    events_ = np.zeros(len(rows), EVENT_DTYPE)
    for i, (event_id, sm, pid, ts, dur) in enumerate(rows):
        events_[i] = (event_id, pid, pid, 0, rank, (rank + 1) % 2, sm, ts, 0x1000 + i, dur, i, 64)
    return RankTrace(rank, events_, len(rows) if attempted is None else attempted, max_events)


def test_merged_export_is_valid_trace_event_json(tmp_path):
    traces = [synthetic(0, [(events.BARRIER, 3, 0, 1_000, 500), (events.LOAD, 3, 0, 1_100, 50),
                            (events.PUT, 7, 1, 1_200, 2_000)]),
              synthetic(1, [(events.BARRIER, 5, 0, 900, 400), (USER_ID, 5, 0, 1_000, -1)], attempted=9)]
    path = str(tmp_path / "trace.json")
    write_chrome_trace(traces, path, names={USER_ID: "my_phase"}, align="global")
    doc = json.load(open(path))
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"]["origin_ns"] == 900
    meta = [e for e in doc["traceEvents"] if e["ph"] == "M"]
    processes = {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"}
    assert processes == {(0, "rank 0"), (1, "rank 1")}
    assert {(e["pid"], e["tid"], e["args"]["name"]) for e in meta if e["name"] == "thread_name"} == {
        (0, 3, "SM 3"), (0, 7, "SM 7"), (1, 5, "SM 5")}
    spans = [e for e in doc["traceEvents"] if e["ph"] != "M"]
    assert [(e["pid"], e["tid"], e["name"], e["ph"], e["cat"]) for e in spans] == [
        (0, 3, "barrier", "X", "phase"), (0, 3, "load", "X", "rma"), (0, 7, "put", "X", "rma"),
        (1, 5, "barrier", "X", "phase"), (1, 5, "my_phase", "i", "user")]
    # microseconds with ns precision, one origin for every rank
    assert [e["ts"] for e in spans] == [0.1, 0.2, 0.3, 0.0, 0.1]
    assert [e.get("dur") for e in spans] == [0.5, 0.05, 2.0, 0.4, None]
    assert spans[2]["args"] == {"event_id": events.PUT, "target_rank": 1, "address": "0x1002", "payload_bytes": 64,
                                "op_index": 2, "program": 1, "pid_m": 1, "pid_n": 0, "sm_id": 7}
    assert doc["otherData"]["ranks"]["1"] == {"recorded": 2, "attempted": 9, "dropped": 1, "max_events": 8}
    # per program tracks; barrier alignment: rank 1's first barrier ends with rank 0's
    by_program = chrome_trace(traces, track="program")
    assert {e["args"]["name"] for e in by_program["traceEvents"] if e["name"] == "thread_name"} == {
        "program 0", "program 1"}
    aligned = chrome_trace(traces)  # the default: GPUs' clocks disagree
    assert aligned["otherData"]["align"] == "barrier"
    assert aligned["otherData"]["rank_shift_ns"] == {"0": 0, "1": 200}
    barriers = [e for e in aligned["traceEvents"] if e["name"] == "barrier"]
    assert barriers[0]["ts"] + barriers[0]["dur"] == barriers[1]["ts"] + barriers[1]["dur"]
    with pytest.raises(ValueError, match="track"):
        chrome_trace(traces, track="warp")
    with pytest.raises(ValueError, match="align"):
        chrome_trace(traces, align="magic")


def test_export_per_rank_files_and_png(sim_heap, tmp_path):
    heap, tracer, offsets = setup_every_op(sim_heap, 2)
    get_world(2).run(run_every_op, heap.session, tracer.words(), offsets, True)
    paths = tracer.export(str(tmp_path / "t.json"), merge=False)
    assert paths == [str(tmp_path / "t.rank0.json"), str(tmp_path / "t.rank1.json")]
    for rank, p in enumerate(paths):
        doc = json.load(open(p))
        assert {e["pid"] for e in doc["traceEvents"]} == {rank}
        assert len([e for e in doc["traceEvents"] if e["ph"] in ("X", "i")]) == GRID * PER_PROGRAM
    merged = tracer.export(str(tmp_path / "all.json"))[0]
    for source in (merged, tracer.read()):
        png = plot(source, str(tmp_path / "timeline.png"))
        data = open(png, "rb").read()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert width > 800 and height > 200
    empty = synthetic(0, [])
    with pytest.raises(IrisError, match="no events"):
        plot([empty], str(tmp_path / "empty.png"))


def _normalized_ptx(fn, signature, constexprs):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(fn=fn, signature={**signature, **{k: "constexpr" for k in constexprs}}, constexprs=constexprs)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
    lines, debug = [], False
    for line in ptx.splitlines():
        debug = debug or line.strip().startswith(".section") and ".debug" in line
        if not debug and not line.strip().startswith((".loc", ".file", "$L__tmp")):  # line info
            lines.append(" ".join(line.replace(fn.fn.__name__, "KERNEL").split()))
    return "\n".join(lines)


@triton.jit
def context_ops(context_ptr, x_ptr, flag_ptr, W: tl.constexpr, TRACING: tl.constexpr):
    ctx = Context.initialize(context_ptr, W, tracing=TRACING)
    offs = tl.arange(0, 64)
    peer = (ctx.rank + 1) % W
    ctx.store(x_ptr + offs, ctx.load(x_ptr + offs, peer, mask=offs < 40), peer)
    ctx.atomic_add(flag_ptr, 1, peer)
    h = ctx.tracing.record_event_start(EVENT_USER, peer, x_ptr)
    ctx.tracing.record_event_end(h)


@triton.jit
def free_function_ops(context_ptr, x_ptr, flag_ptr, W: tl.constexpr, TRACING: tl.constexpr):
    words = context_ptr.to(tl.pointer_type(tl.uint64), bitcast=True)
    rank = tl.load(words).to(tl.int32)
    bases = words + 3  # after [rank, world_size, heap_size]
    bound = rma.bound_of(tl.load(words + OWN_BASE_WORD + W))  # the guard's bound, read once, as Context.initialize does
    offs = tl.arange(0, 64)
    peer = (rank + 1) % W
    rma.store(x_ptr + offs, rma.load(x_ptr + offs, peer, rank, bases, mask=offs < 40, bound=bound), peer, rank,
              bases, bound=bound)
    rma.atomic_add(flag_ptr, 1, peer, rank, bases, bound=bound)


def test_gpu_build_without_tracing_is_the_plain_kernel():
    """For sm_90 (no GPU needed): tracing=False gives the PTX of the free functions; True adds
    %globaltimer and %smid reads."""
    pytest.importorskip("triton.backends.nvidia")
    signature = {"context_ptr": "*i32", "x_ptr": "*fp32", "flag_ptr": "*i32"}
    plain = _normalized_ptx(free_function_ops, signature, {"W": 4, "TRACING": False})
    assert _normalized_ptx(context_ops, signature, {"W": 4, "TRACING": False}) == plain
    traced = _normalized_ptx(context_ops, signature, {"W": 4, "TRACING": True})
    assert "%globaltimer" in traced and "%smid" in traced and "%globaltimer" not in plain
