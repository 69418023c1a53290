"""Chrome / Perfetto trace-event JSON from recorded events.

Layout: one process per rank ("rank r"), one thread (track) per SM ("SM k", the
default) or per program ("program k"); an event with a duration is a complete event
("ph": "X"), one never ended an instant ("ph": "i"). Names come from the event ids
(`events.NAMES`, extended by `names`). `ts`/`dur` are microseconds as the format wants,
with nanosecond precision; ranks' clocks are aligned on their first barrier (see `align`). Per-rank
counts (recorded, attempted, dropped) are in `otherData.ranks` and, when events were
dropped, in the rank's process label. Open the file in https://ui.perfetto.dev or
chrome://tracing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from iris_core.tracing import events as ev
from iris_core.tracing.buffers import RankTrace

TRACKS = ("sm", "program")
ALIGNMENTS = ("global", "barrier", "none")


def chrome_trace(traces: Sequence[RankTrace], names: dict[int, str] | None = None, track: str = "sm",
                 align: str = "barrier") -> dict:
    """The trace-event document of `traces` (see the module docstring).

    Args:
      names: event id -> name, for kernels' own ids (or to rename built-in ones).
      track: "sm" (one track per SM id) or "program" (per program id).
      align: "barrier" (default): shifts each rank so that its first barrier event ends
        when the first rank's does, then subtracts the earliest timestamp of all; without
        barrier events it acts as "global". Needed on GPUs: the %globaltimer clocks of two
        GPUs of one node disagree by more than a typical span (measured on 2 x H200).
        "global": the earliest timestamp subtracted only (one clock for every rank, as the
        simulator's host clock); "none": raw timestamps.
    """
    if track not in TRACKS:
        raise ValueError(f"track must be one of {TRACKS}, got {track!r}")
    if align not in ALIGNMENTS:
        raise ValueError(f"align must be one of {ALIGNMENTS}, got {align!r}")
    shifts = _barrier_shifts(traces) if align == "barrier" else {t.rank: 0 for t in traces}
    starts = [int(t.events["timestamp"].min()) + shifts[t.rank] for t in traces if len(t)]
    origin = min(starts) if starts and align != "none" else 0
    out: list[dict] = []
    for trace in traces:
        out.extend(_rank_metadata(trace))
        tracks = {}
        for e in trace.events:
            tid = int(e["sm_id"] if track == "sm" else e["pid"])
            tracks.setdefault(tid, None)
            out.append(_event(e, trace.rank, tid, int(e["timestamp"]) + shifts[trace.rank] - origin, names))
        label = "SM" if track == "sm" else "program"
        for tid in sorted(tracks):
            out.append(_meta("thread_name", trace.rank, {"name": f"{label} {tid}"}, tid))
            out.append(_meta("thread_sort_index", trace.rank, {"sort_index": tid}, tid))
    return {
        "traceEvents": out,
        "displayTimeUnit": "ns",
        "otherData": {
            "source": "iris device tracing",
            "track": track,
            "align": align,
            "origin_ns": origin,
            "rank_shift_ns": {str(r): s for r, s in shifts.items()},
            "ranks": {str(t.rank): {"recorded": len(t), "attempted": t.attempted, "dropped": t.dropped,
                                    "max_events": t.max_events} for t in traces},
        },
    }


def write_chrome_trace(traces: Sequence[RankTrace], path: str, **options) -> None:
    with open(path, "w") as f:
        json.dump(chrome_trace(traces, **options), f)


def load_chrome_trace(path: str) -> dict:
    """Reads a trace-event file (object form, or the bare list form)."""
    with open(path) as f:
        doc = json.load(f)
    return {"traceEvents": doc} if isinstance(doc, list) else doc


def _event(e, rank: int, tid: int, ts_ns: int, names) -> dict:
    event_id = int(e["event_id"])
    duration = int(e["duration"])
    record = {
        "name": ev.event_name(event_id, names), "cat": ev.category(event_id), "pid": rank, "tid": tid,
        "ts": _us(ts_ns),
        "args": {"event_id": event_id, "target_rank": int(e["target_rank"]), "address": hex(int(e["address"])),
                 "payload_bytes": int(e["payload_size"]), "op_index": int(e["op_index"]),
                 "program": int(e["pid"]), "pid_m": int(e["pid_m"]), "pid_n": int(e["pid_n"]),
                 "sm_id": int(e["sm_id"])},
    }
    if duration >= 0:
        record.update(ph="X", dur=_us(duration))
    else:  # started, never ended
        record.update(ph="i", s="t")
    return record


def _us(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _meta(name: str, rank: int, args: dict, tid: int = 0) -> dict:
    return {"name": name, "ph": "M", "pid": rank, "tid": tid, "args": args}


def _rank_metadata(trace: RankTrace) -> list[dict]:
    meta = [_meta("process_name", trace.rank, {"name": f"rank {trace.rank}"}),
            _meta("process_sort_index", trace.rank, {"sort_index": trace.rank})]
    if trace.dropped:
        meta.append(_meta("process_labels", trace.rank,
                          {"labels": f"{trace.dropped} events dropped (max_events={trace.max_events})"}))
    return meta


def _barrier_shifts(traces: Sequence[RankTrace]) -> dict[int, int]:
    """Per rank: ns to add so that the first barrier ends at the same time on every rank."""
    ends = {}
    for t in traces:
        barriers = t.events[(t.events["event_id"] == ev.BARRIER) & (t.events["duration"] >= 0)]
        if len(barriers) == 0:
            return {t.rank: 0 for t in traces}  # nothing to align on: a shared clock is assumed
        first = barriers[np.argmin(barriers["timestamp"])]
        ends[t.rank] = int(first["timestamp"]) + int(first["duration"])
    reference = ends[traces[0].rank]
    return {r: reference - end for r, end in ends.items()}
