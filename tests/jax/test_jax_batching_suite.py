"""JAX's own vmap tests that call a collective (its tests/batching_test.py: collectives over
vmap's named axes, `vmap(f, axis_name="i")`), run with lax's collectives swapped for iris's:
`jax.lax.NAME = iris_jax.NAME` for each collective iris provides under lax's name
(`jax_suite.SWAPPED`).

JAX's test files are not copied here: set IRIS_JAX_TESTS to the tests/ folder of a JAX source
tree of the installed version (tests/jax/jax_suite.py, docs/testing.md); without it these skip.

Selected: the tests of JAX's file whose method calls one of the swapped collectives (118 of
BatchingTest's tests at both revisions, of 227 at jax-v0.10.2): psum / pmax / pmin over one or
several named axes (testCommAssocCollective*), all_to_all, all_gather, ppermute and psum_scatter
under vmap. Not selected: the rest (VmappableTest's tests and BatchingTest's others), which call
none of them.

Nothing in JAX's file is changed or passed over. What passes (docs/testing.md): 118 of 118 on
jax 0.10.2 (JAX's tests at jax-v0.10.2) and on the newest stack (jax 0.12.0.1; JAX's tests at
main-cec06d1).
"""

from __future__ import annotations

import pytest

from tests.jax import jax_suite

FILE = "batching_test.py"
HEAP = 64 << 20

MODULE = jax_suite.load(FILE, "jax_batching_test")
CASES = ("BatchingTest", "VmappableTest")
TESTS = jax_suite.selected(MODULE, CASES, world=8, heap=HEAP) if MODULE else {}


@pytest.mark.skipif(MODULE is None, reason=jax_suite.missing_reason(FILE))
@pytest.mark.parametrize("name", sorted(TESTS) or ["(JAX's tests not found)"])
def test_jax_batching_test(name, monkeypatch):
    """One of JAX's batching tests, with iris's collectives in lax's place."""
    jax_suite.run(TESTS[name], monkeypatch)
