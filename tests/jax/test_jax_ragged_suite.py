"""JAX's own tests of lax.ragged_all_to_all (its tests/ragged_collective_test.py), run on the
simulator with `jax.lax.ragged_all_to_all` swapped for `iris_jax.ragged_all_to_all`.

JAX's test files are in neither its wheel nor its sdist, and are not copied here: set
IRIS_JAX_TESTS to the tests/ folder of a JAX source tree of the installed version, e.g.
`git clone --depth 1 --branch jax-v0.10.2 https://github.com/jax-ml/jax` and
`IRIS_JAX_TESTS=jax/tests`; without it these tests skip (the loader: tests/jax/jax_suite.py).

Changed in JAX's file, and only here: its skip on CPU (XLA:CPU has no ragged_all_to_all; iris
runs it), and its checks that the lowered module holds lax's own op (`@ragged_all_to_all`, its
`replica_groups`): with iris swapped in the module holds iris's kernel call instead, so those
assertions are passed over (`LAX_OP_NAMES`); the rest of each test, its values included, runs.
In JAX 0.10.2 three tests make such checks: test_ragged_all_to_all, _axis_index_groups and
_degenerate_groups.
"""

from __future__ import annotations

import pytest

from tests.jax import jax_suite

FILE = "ragged_collective_test.py"
LAX_OP_NAMES = ("@ragged_all_to_all", "replica_groups")  # what lax's lowering emits
HEAP = 64 << 20  # the groups of test_vmap_basic each take a workspace

MODULE = jax_suite.load(FILE, "jax_ragged_collective_test")
if MODULE:
    jax_suite.patch_case(MODULE.RaggedCollectiveTest, world=8, heap=HEAP, lax_op_names=LAX_OP_NAMES)
TESTS = jax_suite.tests_of(MODULE.RaggedCollectiveTest) if MODULE else {}


@pytest.mark.skipif(MODULE is None, reason=jax_suite.missing_reason(FILE))
@pytest.mark.parametrize("name", sorted(TESTS) or ["(JAX's tests not found)"])
def test_jax_ragged_collective_test(name, monkeypatch):
    """One of JAX's tests, with iris's ragged_all_to_all in lax's place."""
    jax_suite.run(TESTS[name], monkeypatch, names=("ragged_all_to_all",))
