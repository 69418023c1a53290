"""The fault gate's C step (iris_jax/calls/fault_gate.c) driven as XLA drives it, without a GPU
(tests/jax/fault_gate_harness.py: a stand-in libcuda and FFI API, a fault page in host memory):
which gates wait in each mode, and the error a fault becomes. The GPU fault matrix
(tests/gpu/test_gpu_faults.py) checks the same on an H200, reading results as users do."""

import shutil

import pytest

from tests.jax.helpers import run_python

EXPECTED = {
    "three anchors": "waited 1, error None",  # step mode: the last anchor waits, once per execution
    "two passed, then their anchor": "waited 1, error None",  # a passed gate does nothing
    "anchor, nested, anchor": "waited 1, error None",  # a nested gate passes while an anchor is to come
    "anchor then nested": "waited 2, error None",  # ... and waits itself after the last one
    "nested only, twice": "waited 2, error None",
    "an anchor skipped by control flow": "waited 0, error None",  # the documented hole
    "the next execution after that": "waited 1, error None",  # a new run id: nothing carried over
    "a fault, two anchors": "waited 1, error RuntimeError: a fault on device 0",
    "a fault, a passed gate and its anchor": "waited 1, error RuntimeError: a fault on device 0",
    "a fault stays until check_faults takes it": "waited 1, error RuntimeError: a fault on device 0",
    "a refused access": "waited 1, error RuntimeError: a fault on device 0",
    "a refused access is reported once": "waited 1, error None",
    "call mode, three anchors": "waited 3, error None",
    "no runtime": "waited 0, error None",  # a device without a page (after shutdown): nothing read
}


@pytest.mark.skipif(shutil.which("cc") is None, reason="the C step needs a C compiler, as Triton does on GPUs")
def test_which_gates_wait_and_what_a_fault_becomes(tmp_path):
    result = run_python(["tests/jax/fault_gate_harness.py"], timeout=120, IRIS_KERNEL_CACHE_DIR=str(tmp_path))
    assert result.returncode == 0, result.stdout
    seen = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": waited" in line)
    assert seen == EXPECTED, result.stdout
    # a passed gate may be captured into XLA's CUDA graph (it runs nothing); the others run on the host
    assert "traits of iris_fault_gate_passed: 1" in result.stdout and "traits of iris_fault_gate: 0" in \
        result.stdout and "traits of iris_fault_gate_nested: 0" in result.stdout, result.stdout
