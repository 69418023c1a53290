"""Running JAX's own test files with iris's collectives in lax's place (the suites
tests/jax/test_jax_*_suite.py).

JAX's test files are in neither its wheel nor its sdist, and are not copied into this repository:
IRIS_JAX_TESTS names the tests/ folder of a JAX source tree of the installed version (e.g.
`git clone --depth 1 --branch jax-v0.10.2 https://github.com/jax-ml/jax`, then
`IRIS_JAX_TESTS=jax/tests`); without it the suites skip.

`load` imports one of those files as a module of its own; `patch_case` changes a test case of it
(and only it) so that each test starts on the simulator's runtime and passes over the checks that
grep lax's own op names in a lowered module or jaxpr (with iris swapped in, iris's call is there
instead); `run` runs one test with the swaps made (pytest's monkeypatch, undone after the test) and
turns its result into pytest's.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import unittest

import jax
import pytest

import iris_jax
from tests.jax.helpers import use_runtime

ROOT = os.environ.get("IRIS_JAX_TESTS") or "<IRIS_JAX_TESTS unset>"
# lax's collectives that iris_jax provides under the same name (not lax.broadcast, an array op)
SWAPPED = tuple(name for name in iris_jax.collectives.__all__ if name != "broadcast" and hasattr(jax.lax, name))


def source(filename: str) -> str:
    return os.path.join(ROOT, filename)


def missing_reason(filename: str) -> str:
    return (f"JAX's tests/{filename} not found at {source(filename)!r}: set IRIS_JAX_TESTS to the tests/ folder "
            "of a JAX source tree of the installed version")


def load(filename: str, module_name: str):
    """JAX's test file `filename` as a module named `module_name` (None: no sources)."""
    path = source(filename)
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def patch_case(case: type, *, world: int, heap: int, lax_op_names: tuple[str, ...] = ()) -> None:
    """Each test of `case` starts with JaxTestCase's setUp (JAX's strict settings; not the case's
    own, which may skip on CPU) on the runtime over the first `world` devices with `heap` bytes;
    `assertIn(member, ...)` / `assertNotIn` with a string member holding one of `lax_op_names`
    (what lax's lowering or jaxpr holds and iris's does not) pass."""
    from jax._src import test_util as jtu

    def set_up(self):
        jtu.JaxTestCase.setUp(self)
        use_runtime(world, heap_size=heap)

    def lax_name(member) -> bool:
        return isinstance(member, str) and any(name in member for name in lax_op_names)

    def assert_in(self, member, container, msg=None):
        if lax_name(member):
            return  # lax's op in the lowered module or jaxpr: iris's is there instead
        return unittest.TestCase.assertIn(self, member, container, msg)

    def assert_not_in(self, member, container, msg=None):
        if lax_name(member):
            return
        return unittest.TestCase.assertNotIn(self, member, container, msg)

    case.setUp, case.assertIn, case.assertNotIn = set_up, assert_in, assert_not_in


def tests_of(case: type) -> dict[str, unittest.TestCase]:
    """The tests of `case` by method name (absl's parametrized ones included)."""
    return {t._testMethodName: t for t in unittest.TestLoader().loadTestsFromTestCase(case)}


def source_of(test: unittest.TestCase) -> str:
    """The source of a test's method (absl's parametrized and JAX's decorated ones unwrapped)."""
    try:
        return inspect.getsource(inspect.unwrap(getattr(type(test), test._testMethodName)))
    except (OSError, TypeError):
        return ""


def uses(text: str, names=SWAPPED) -> list[str]:
    """The names of `names` that `text` calls as `lax.NAME` (or `jax.lax.NAME`)."""
    return sorted({m.group(1) for m in re.finditer(r"\blax\.(\w+)\b", text) if m.group(1) in names})


def run(test: unittest.TestCase, monkeypatch, names=SWAPPED) -> None:
    """Runs one of JAX's tests with `jax.lax.NAME = iris_jax.NAME` for each of `names` (the test
    file's `from jax import lax` is that module); a failure or error fails the pytest test, a
    skip skips it."""
    for name in names:
        monkeypatch.setattr(jax.lax, name, getattr(iris_jax, name))
    result = unittest.TestResult()
    test.run(result)
    problems = [text for _, text in result.errors + result.failures]
    assert not problems, "\n".join(problems)
    if result.skipped:
        pytest.skip(result.skipped[0][1])
