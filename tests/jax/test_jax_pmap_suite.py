"""JAX's own pmap tests that call a collective (its tests/pmap_test.py), run on the simulator
with lax's collectives swapped for iris's: `jax.lax.NAME = iris_jax.NAME` for each collective iris
provides under lax's name (`jax_suite.SWAPPED`). jax.pmap runs on shard_map since jax 0.8, so a
pmapped function's collectives are iris's over the pmap's devices (the runtime covers all 8).

JAX's test files are not copied here: set IRIS_JAX_TESTS to the tests/ folder of a JAX source
tree of the installed version (tests/jax/jax_suite.py, docs/testing.md); without it these skip.

Selected: the tests of JAX's file whose method, or its absl parameters, calls or names one of the
swapped collectives (`lax.psum(...)` in its body; `@parameterized.named_parameters(("Gather",
lax.all_gather), ...)` over it: testVmapOf*, testGradOf* of all_gather / psum_scatter,
testCollectivesWithVmap*, testWithVmap*, testVsVmap*, whose parameters absl bound to lax's
functions when the file was imported; iris's are put in their place for the run). Not selected:
the rest, which run no collective iris provides (pmap alone, lax.axis_index, pargmax / pargmin).

Changed in JAX's file, and only here: JAX's device skips of testCollectiveBroadcast,
testCollectiveBroadcastVmap and testCollectiveBroadcastGrad (`@jtu.run_on_devices("gpu")`:
lax.pbroadcast has no XLA:CPU lowering; iris runs it) and of testCollectivePermuteGrad
(`@jtu.skip_on_devices("cpu")`, no reason given; it passes on the CPU with lax's ppermute too)
are dropped (`DEVICE_SKIPS_DROPPED`). No check is passed over: pmap_test greps no lowered module
or jaxpr for lax's names in a selected test.

What passes (docs/testing.md), nothing fails: jax 0.10.2 (JAX's tests at jax-v0.10.2): 147
selected, 143 pass, 4 skip; the newest stack (jax 0.12.0.1; JAX's tests at main-cec06d1, which
adds testAllToAllNegativeAxes and testReduceScatterNegativeScatterDimension): 149 selected, 145
pass, 4 skip. The four skips are JAX's own, unconditional: testBadAxisSizeError ("jit(shmap)
does not raise error"), testBadAxisSizeErrorNested, testNestedPmaps and testNestedPmapsError
("Ignore nested pmap when `pmap_shmap_merge=True`").
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
