"""JAX's own tests of lax.ragged_all_to_all (its tests/ragged_collective_test.py), run on the
simulator with `jax.lax.ragged_all_to_all` swapped for `iris_jax.ragged_all_to_all`.

JAX's test files are in neither its wheel nor its sdist, and are not copied here: set
IRIS_JAX_TESTS to the tests/ folder of a JAX source tree of the installed version, e.g.
`git clone --depth 1 --branch jax-v0.10.2 https://github.com/jax-ml/jax` and
`IRIS_JAX_TESTS=jax/tests`; without it these tests skip.

Changed in JAX's file, and only here: its skip on CPU (XLA:CPU has no ragged_all_to_all; iris
runs it), and its checks that the lowered module holds lax's own op (`@ragged_all_to_all`, its
`replica_groups`): with iris swapped in the module holds iris's kernel call instead, so those
assertions are passed over (`LAX_OP_NAMES`); the rest of each test, its values included, runs.
In JAX 0.10.2 three tests make such checks: test_ragged_all_to_all, _axis_index_groups and
_degenerate_groups.
"""

from __future__ import annotations

import importlib.util
import os
import unittest

import jax
import pytest

import iris_jax
from tests.jax.helpers import use_runtime

SOURCE = os.path.join(os.environ.get("IRIS_JAX_TESTS") or "<IRIS_JAX_TESTS unset>", "ragged_collective_test.py")
LAX_OP_NAMES = ("@ragged_all_to_all", "replica_groups")  # what lax's lowering emits
HEAP = 64 << 20  # the groups of test_vmap_basic each take a workspace


def _jax_module():
    """JAX's test module, its test case changed as the module docstring says (None: no sources)."""
    if not os.path.isfile(SOURCE):
        return None
    from jax._src import test_util as jtu

    spec = importlib.util.spec_from_file_location("jax_ragged_collective_test", SOURCE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    case = module.RaggedCollectiveTest

    def set_up(self):  # JaxTestCase's (JAX's strict settings), without the skip on CPU
        jtu.JaxTestCase.setUp(self)
        use_runtime(8, heap_size=HEAP)

    def assert_in(self, member, container, msg=None):
        if isinstance(member, str) and any(name in member for name in LAX_OP_NAMES):
            return  # lax's op in the lowered module: iris's is there instead
        return unittest.TestCase.assertIn(self, member, container, msg)

    case.setUp, case.assertIn = set_up, assert_in
    return module


MODULE = _jax_module()
TESTS = ({t._testMethodName: t for t in unittest.TestLoader().loadTestsFromTestCase(MODULE.RaggedCollectiveTest)}
         if MODULE else {})


@pytest.mark.skipif(MODULE is None, reason=f"JAX's tests/ragged_collective_test.py not found at {SOURCE!r}: set "
                    "IRIS_JAX_TESTS to the tests/ folder of a JAX source tree of the installed version")
@pytest.mark.parametrize("name", sorted(TESTS) or ["(JAX's tests not found)"])
def test_jax_ragged_collective_test(name, monkeypatch):
    """One of JAX's tests, with iris's ragged_all_to_all in lax's place."""
    monkeypatch.setattr(jax.lax, "ragged_all_to_all", iris_jax.ragged_all_to_all)
    result = unittest.TestResult()
    TESTS[name].run(result)
    problems = [text for _, text in result.errors + result.failures]
    assert not problems, "\n".join(problems)
    if result.skipped:
        pytest.skip(result.skipped[0][1])
