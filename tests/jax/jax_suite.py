"""Running JAX's own test files with iris's collectives in lax's place (the suites
tests/jax/test_jax_*_suite.py).

JAX's test files are in neither its wheel nor its sdist, and are not copied into this repository:
IRIS_JAX_TESTS names a folder holding them for the installed version: the tests/ folder of a JAX
source tree (e.g. `git clone --depth 1 --branch jax-v0.10.2 https://github.com/jax-ml/jax`, then
`IRIS_JAX_TESTS=jax/tests`), or one revision folder of the copies beside the repository that CI
uses (`../shared/jax-tests/jax-v0.10.2`; `.ci/run` and scripts/newest_stack.sh set it); without
it the suites skip.

`load` imports one of those files as a module of its own; `patch_case` changes a test case of it
(and only it) so that each test starts on the simulator's runtime and passes over the checks that
grep lax's own op names in a lowered module or jaxpr (with iris swapped in, iris's call is there
instead); `selected` picks a file's tests that call a swapped collective; `run` runs one test
with the swaps made (pytest's monkeypatch, undone after the test; absl's parameters that hold
lax's function get iris's) and turns its result into pytest's.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import os
import re
import sys
import textwrap
import unittest

import jax
import pytest

import iris_jax
from tests.jax.helpers import use_runtime

ROOT = os.environ.get("IRIS_JAX_TESTS") or "<IRIS_JAX_TESTS unset>"
# lax's collectives that iris_jax provides under the same name (not lax.broadcast, an array op)
SWAPPED = tuple(name for name in iris_jax.collectives.__all__ if name != "broadcast" and hasattr(jax.lax, name))


_runtime_of = [None]  # the module of JAX's tests that the runtime was last used by (patch_case)


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
    sys.modules[module_name] = module  # where inspect finds its classes' source
    spec.loader.exec_module(module)
    return module


def patch_case(case: type, *, world: int, heap: int, lax_op_names: tuple[str, ...] = (),
               lax_primitives: tuple[str, ...] = (), device_skips_dropped: tuple[str, ...] = ()) -> None:
    """Each test of `case` starts with JaxTestCase's setUp (JAX's strict settings; not the case's
    own, which may skip on CPU) on the runtime over the first `world` devices with `heap` bytes,
    one of the test file's own: the first test of a file shuts down the runtime that tests before
    it left (the workspaces their partitions of the ranks keep for the runtime's life are not this
    file's to fill: the ragged suite, run after the pmap suite on its runtime, ran out of heap).
    Checks that grep lax's own names pass: `assertIn(member, ...)` / `assertNotIn` with a string
    member, and `assertRegex(text, regex)` with a regex, holding one of `lax_op_names` (what lax's
    lowering or jaxpr holds and iris's does not),
    and `assertEqual("iris_collective", name)` with `name` one of `lax_primitives` (an equation's
    primitive compared with lax's: iris's primitive is there instead). The methods named in
    `device_skips_dropped` lose JAX's device filter (`@jtu.run_on_devices("gpu")`,
    `@jtu.skip_on_devices("cpu")`), so they run on the CPU."""
    from jax._src import test_util as jtu

    for name in device_skips_dropped:
        method = case.__dict__[name]
        assert method.__code__.co_name == "test_method_wrapper", f"{name}: not under JAX's device filter"
        setattr(case, name, method.__wrapped__)

    assert_in, assert_not_in, assert_equal = case.assertIn, case.assertNotIn, case.assertEqual
    assert_regex = case.assertRegex

    def set_up(self):
        jtu.JaxTestCase.setUp(self)
        if _runtime_of[0] != case.__module__ and iris_jax.is_initialized():
            iris_jax.shutdown()
        _runtime_of[0] = case.__module__
        use_runtime(world, heap_size=heap)

    def lax_name(member) -> bool:
        return isinstance(member, str) and any(name in member for name in lax_op_names)

    def patched_in(self, member, container, msg=None):
        if lax_name(member):
            return  # lax's op in the lowered module or jaxpr: iris's is there instead
        return assert_in(self, member, container, msg)

    def patched_not_in(self, member, container, msg=None):
        if lax_name(member):
            return
        return assert_not_in(self, member, container, msg)

    def patched_regex(self, text, regex, msg=None):
        if lax_name(getattr(regex, "pattern", regex)):
            return
        return assert_regex(self, text, regex, msg)

    def patched_equal(self, first, second, msg=None):
        if first == "iris_collective" and isinstance(second, str) and second in lax_primitives:
            return  # an equation's primitive: iris's in place of lax's
        return assert_equal(self, first, second, msg)

    case.setUp, case.assertIn, case.assertNotIn, case.assertRegex = set_up, patched_in, patched_not_in, patched_regex
    if lax_primitives:
        case.assertEqual = patched_equal


def tests_of(case: type) -> dict[str, unittest.TestCase]:
    """The tests of `case` by method name (absl's parametrized ones included)."""
    return {t._testMethodName: t for t in unittest.TestLoader().loadTestsFromTestCase(case)}


@functools.cache
def methods_of(case: type) -> dict[str, str]:
    """The source of each method defined in `case`'s class body, by name, its decorators included
    (absl's parameters may name the collective: `@parameterized.named_parameters(("Gather",
    lax.all_gather), ...)`)."""
    lines = textwrap.dedent(inspect.getsource(case)).splitlines()
    body = ast.parse("\n".join(lines)).body[0].body
    return {node.name: "\n".join(lines[min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1:
                                        node.end_lineno])
            for node in body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def source_of(test: unittest.TestCase) -> str:
    """The source of a test's method, decorators included. absl names a parametrized test
    after its method with a suffix (`test_pbroadcast_fully_replicated`, `test_rule0`,
    `testVmapOfGather`) and JAX's decorators do not always keep the method's name, so the method
    is the one of that name, else the one named by a function the test's wraps (absl's
    `bound_param_test` wraps the method itself), else the longest whose name and a `_` or digit
    start the test's."""
    methods = methods_of(type(test))
    name = test._testMethodName
    if name in methods:
        return methods[name]
    function = getattr(type(test), name, None)
    while function is not None:
        if getattr(function, "__name__", None) in methods:
            return methods[function.__name__]
        function = getattr(function, "__wrapped__", None)
    prefixes = [m for m in methods if re.match(re.escape(m) + r"[_0-9]", name)]
    return methods[max(prefixes, key=len)] if prefixes else ""


def uses(text: str, names=SWAPPED) -> list[str]:
    """The names of `names` that `text` calls as `lax.NAME` (or `jax.lax.NAME`)."""
    return sorted({m.group(1) for m in re.finditer(r"\blax\.(\w+)\b", text) if m.group(1) in names})


def bound_parameters(test: unittest.TestCase):
    """The closure cell in which absl keeps the parameters of a parametrized test (its
    `bound_param_test`, found through the decorators that wrap it), or None."""
    method = getattr(type(test), test._testMethodName)
    while method is not None:
        code = getattr(method, "__code__", None)
        if code is not None and "testcase_params" in code.co_freevars:
            return method.__closure__[code.co_freevars.index("testcase_params")]
        method = getattr(method, "__wrapped__", None)
    return None


def swapped(params, swaps: dict):
    """absl's parameters of one test (a mapping or a sequence) with each function of `swaps`'
    keys, by identity, replaced by its value."""
    if isinstance(params, dict):
        return {key: swaps.get(id(value), value) for key, value in params.items()}
    if isinstance(params, (tuple, list)):
        return type(params)(swaps.get(id(value), value) for value in params)
    return swaps.get(id(params), params)


def selected(module, cases: tuple[str, ...], *, world: int, heap: int, device_skips_dropped: dict | None = None,
             **checks) -> dict[str, unittest.TestCase]:
    """The tests of `module`'s test cases named `cases` (those it defines) that call a swapped
    collective, by `Case.test_name`; each case patched first (`patch_case(case, world=world,
    heap=heap, device_skips_dropped=device_skips_dropped[name], **checks)`)."""
    tests = {}
    for name in cases:
        case = getattr(module, name, None)
        if case is None:
            continue
        patch_case(case, world=world, heap=heap, device_skips_dropped=(device_skips_dropped or {}).get(name, ()),
                   **checks)
        for test_name, test in tests_of(case).items():
            if uses(source_of(test)):
                tests[f"{name}.{test_name}"] = test
    return tests


def run(test: unittest.TestCase, monkeypatch, names=SWAPPED) -> None:
    """Runs one of JAX's tests with `jax.lax.NAME = iris_jax.NAME` for each of `names` (the test
    file's `from jax import lax` is that module); a failure or error fails the pytest test, a
    skip skips it. A parametrized test whose parameters absl bound to lax's function when the
    file was imported (`@parameterized.named_parameters(("Gather", lax.all_gather), ...)`) gets
    iris's in its place for this run."""
    swaps = {id(getattr(jax.lax, name)): getattr(iris_jax, name) for name in names}
    for name in names:
        monkeypatch.setattr(jax.lax, name, getattr(iris_jax, name))
    cell = bound_parameters(test)
    if cell is not None:
        params = cell.cell_contents
        cell.cell_contents = swapped(params, swaps)
    result = unittest.TestResult()
    try:
        test.run(result)
    finally:
        if cell is not None:
            cell.cell_contents = params
    problems = [text for _, text in result.errors + result.failures]
    assert not problems, "\n".join(problems)
    if result.skipped:
        pytest.skip(result.skipped[0][1])
