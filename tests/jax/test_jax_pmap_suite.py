"""JAX's own pmap tests that call a collective (its tests/pmap_test.py), run on the simulator
with lax's collectives swapped for iris's: `jax.lax.NAME = iris_jax.NAME` for each collective iris
provides under lax's name (`jax_suite.SWAPPED`). jax.pmap runs on shard_map since jax 0.8, so a
pmapped function's collectives are iris's over the pmap's devices (the runtime covers all 8).

JAX's test files are not copied here: set IRIS_JAX_TESTS to the tests/ folder of a JAX source
tree of the installed version (tests/jax/jax_suite.py, docs/testing.md); without it these skip.

Selected: the tests of JAX's file whose method, or its absl parameters, calls or names one of the
swapped collectives (`lax.psum(...)` in its body; `@parameterized.named_parameters(("Gather",
lax.all_gather), ...)`, where iris's function is put in place of lax's for the run). Not
selected: the rest, which run no collective iris provides (pmap alone, lax.axis_index, pargmax /
pargmin, which iris does not provide).

What passes (docs/testing.md): TODO.
"""

from __future__ import annotations

import pytest

from tests.jax import jax_suite

FILE = "pmap_test.py"
HEAP = 64 << 20  # 44.6 MiB in use after these tests at jax-v0.10.2 (partitions' workspaces)
# JAX's skips by device: pbroadcast has no lowering on XLA:CPU (iris runs it); testCollectivePermuteGrad
# is skipped on CPU with no reason given (it passes there with lax's ppermute and with iris's)
DEVICE_SKIPS_DROPPED = {"PythonPmapTest": ("testCollectiveBroadcast", "testCollectiveBroadcastVmap",
                                           "testCollectiveBroadcastGrad", "testCollectivePermuteGrad")}

MODULE = jax_suite.load(FILE, "jax_pmap_test")
CASES = ("PythonPmapTest", "VmapOfPmapTest", "VmapPmapCollectivesTest", "PmapWithDevicesTest", "ArrayTest",
         "ArrayPmapTest", "PmapShmapMergeTest")
TESTS = jax_suite.selected(MODULE, CASES, world=8, heap=HEAP, device_skips_dropped=DEVICE_SKIPS_DROPPED) if MODULE else {}


@pytest.mark.skipif(MODULE is None, reason=jax_suite.missing_reason(FILE))
@pytest.mark.parametrize("name", sorted(TESTS) or ["(JAX's tests not found)"])
def test_jax_pmap_test(name, monkeypatch):
    """One of JAX's pmap tests, with iris's collectives in lax's place."""
    jax_suite.run(TESTS[name], monkeypatch)
