"""The profile arithmetic of benchmarks/collectives.py (gpu_activity), on made-up profiles:
the GPU machine's numbers depend on it, and the GPU is not here to check it."""

from __future__ import annotations

import importlib.util
import os

import pytest

_spec = importlib.util.spec_from_file_location(  # a script, not a package: loaded by path
    "bench_collectives", os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "collectives.py"))
_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench)
gpu_activity = _bench.gpu_activity

US = 1000  # ns


def _gpu(index, *events, line="Stream #24(Compute)"):
    return (f"/device:GPU:{index}", [(line, [(s * US, e * US, name) for s, e, name in events])])


def test_span_starts_when_every_gpu_started_and_ends_when_all_are_done():
    planes = [
        ("/host:CPU", [("python3", [(0, 10_000 * US, "PjitFunction")])]),  # host planes are ignored
        _gpu(0, (0, 1, "Memset 0"), (100, 105, "collective_kernel"), (105, 106, "loop_multiply_fusion")),
        _gpu(1, (130, 134, "collective_kernel"), (134, 135, "loop_multiply_fusion")),
    ]
    t = gpu_activity(planes)
    assert t.span == pytest.approx(135 - 130)  # GPU 1 started last (launch skew left out)
    assert t.busy == pytest.approx(6)  # GPU 0: 5 + 1; its leading memset is not counted
    assert t.comm == pytest.approx(5)  # only the collective kernel


def test_overlapping_kernels_and_other_lines_count_once():
    planes = [_gpu(0, (0, 10, "ncclDevKernel_AllReduce"), (5, 12, "ncclDevKernel_AllReduce"), (20, 21, "fusion")),
              ("/device:GPU:0", [("XLA Ops", [(0, 50 * US, "all-reduce")])])]  # derived lines are ignored
    t = gpu_activity(planes)
    assert (t.span, t.busy, t.comm) == pytest.approx((21, 13, 12))


def test_no_gpu_events():
    assert tuple(gpu_activity([("/host:CPU", [])])) == (0.0, 0.0, 0.0)
    assert tuple(gpu_activity([_gpu(0, (0, 1, "Memset 0"))])) == (0.0, 0.0, 0.0)


def test_kernel_time_per_call_leaves_out_the_first_calls_wait_for_the_later_gpu():
    # 3 calls; GPU 1 was launched 50 us later, so GPU 0's first collective waited for it
    planes = [_gpu(0, (0, 55, "collective_kernel"), (55, 56, "fusion"), (56, 61, "collective_kernel"),
                   (61, 62, "fusion"), (62, 68, "collective_kernel")),
              _gpu(1, (50, 55, "collective_kernel"), (55, 56, "fusion"), (56, 61, "collective_kernel"),
                   (61, 62, "fusion"), (62, 67, "collective_kernel"))]
    t = gpu_activity(planes, calls=3)
    assert t.comm == pytest.approx((5 + 6) / 2)  # calls 2 and 3 of the busiest GPU
    assert t.span == pytest.approx(68 - 50)
    assert gpu_activity(planes).comm == pytest.approx(55 + 5 + 6)  # one call: every kernel counts
