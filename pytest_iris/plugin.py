"""The pytest hooks and fixtures of pytest-iris (the `pytest11` entry point `iris`).

Inert for tests without the marker: the marker is registered and every other hook returns at
once; JAX and iris are imported only when a marked test is collected. For marked tests:

- collection checks the marker (a MarkerError there names the test) and parametrizes a tuple of
  ranks, one test per size (ids `ranks=N`); before any test runs, JAX's CPU backend is asked for
  as many devices as the largest in-process world (`jax_num_cpu_devices`);
- each test gets a runtime of its own (`_iris_runtime`, autouse): the previous one shut down, a
  new one over the first N CPU devices (or GPUs, `--iris-gpu`), race detection on unless the
  marker turns it off, iris's collectives and the simulated ranks bounded by the marker's
  `timeout_s`; shut down after the test, whatever it did;
- `processes=True` runs the test body as N processes instead (pytest_iris.processes), on the
  simulator or, with `--iris-gpu`, on the GPUs (several processes sharing one where there are fewer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re

import pytest

from pytest_iris import processes
from pytest_iris.faults import Faults
from pytest_iris.settings import MARKER, IrisWorld, MarkerError, Settings, from_marker

AXIS = "i"
SLACK_S = 5.0  # the simulated ranks' bound past the collectives' own: a collective names a late peer first


def pytest_addoption(parser):
    group = parser.getgroup("iris", "pytest-iris: multi-GPU JAX code on iris's simulator")
    group.addoption("--iris-gpu", action="store_true", default=False,
                    help="run @pytest.mark.iris tests on this machine's GPUs instead of the CPU simulator "
                         "(a test that asks for more ranks than there are GPUs is skipped, saying so)")
    group.addoption("--iris-no-races", action="store_true", default=False,
                    help="run @pytest.mark.iris tests without the race detector, whatever their markers say")


NO_RACES = "IRIS_PYTEST_NO_RACES"  # --iris-no-races, as the ranks' processes (processes=True) see it


def pytest_configure(config):
    config.addinivalue_line("markers", MARKER)
    if config.getoption("iris_no_races", False):
        os.environ[NO_RACES] = "1"
    if config.getoption("iris_gpu", False):  # before JAX starts: in-process tests and launched ranks share the GPUs
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")


def _worlds(definition) -> list[Settings] | None:
    marker = definition.get_closest_marker("iris")
    if marker is None:
        return None
    try:
        return from_marker(marker.args, marker.kwargs, definition.nodeid)
    except MarkerError as e:
        raise pytest.UsageError(str(e)) from None


def pytest_generate_tests(metafunc):
    worlds = _worlds(metafunc.definition)
    if worlds is None:
        return
    marker = metafunc.definition.get_closest_marker("iris")
    several = isinstance(marker.args[0] if marker.args else marker.kwargs.get("ranks"), (tuple, list))
    if several:  # one test per world size
        metafunc.parametrize("_iris_settings", worlds, ids=[f"ranks={s.ranks}" for s in worlds], indirect=True)


def pytest_collection_modifyitems(session, config, items):
    in_process = [s.ranks for item in items for s in [_settings_of(item)] if s is not None and not s.processes]
    if in_process and not config.getoption("iris_gpu") and not processes.in_rank():
        _ask_for_cpu_devices(max(in_process))


def _settings_of(item) -> Settings | None:
    """The world an already-collected item runs in (its parameter, or its marker's only size)."""
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "_iris_settings" in callspec.params:
        return callspec.params["_iris_settings"]
    definition = getattr(item, "definition", item)
    if not hasattr(definition, "get_closest_marker"):
        return None
    worlds = _worlds(definition)
    return worlds[0] if worlds else None


def _forced_cpu_devices() -> int:
    """The CPU device count XLA_FLAGS forces (1 where it does not)."""
    found = re.search(r"--xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    return int(found.group(1)) if found else 1


def _ask_for_cpu_devices(n: int) -> None:
    """At least n CPU devices in JAX, set before its backend starts (checked again per test)."""
    import jax
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return  # too late to change: each test checks that it has its devices
    have = jax.config.jax_num_cpu_devices
    if (have if have >= 0 else _forced_cpu_devices()) < n:
        jax.config.update("jax_num_cpu_devices", n)


def _devices(n: int, gpu: bool) -> list:
    """The first n devices of the world: CPU devices (the simulator), or GPUs with --iris-gpu."""
    import jax

    if gpu:
        found = [d for d in jax.devices() if d.platform == "gpu"]
        if len(found) < n:
            pytest.skip(f"needs {n} GPUs (--iris-gpu); this machine has {len(found)}")
        return found[:n]
    found = jax.devices("cpu")
    if len(found) < n:
        pytest.fail(
            f"this test asks for {n} simulated ranks but JAX's CPU backend has {len(found)} device(s): it was "
            "started before pytest-iris could ask for more (something called jax.devices() or ran a JAX "
            "computation at import or collection time). Move that into a test or fixture, or start pytest with "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={n} (or more)", pytrace=False)
    return found[:n]


@pytest.fixture
def _iris_settings(request) -> Settings | None:
    """The marked test's world (a parameter where the marker gave several sizes); None unmarked."""
    if hasattr(request, "param"):
        return request.param
    return _settings_of(request.node)


@pytest.fixture(autouse=True)
def _iris_runtime(request, _iris_settings):
    """A runtime of the marked test's own, shut down after it; nothing for unmarked tests."""
    settings = _iris_settings
    if settings is None or (settings.processes and not processes.in_rank()):
        yield None  # unmarked, or its body runs in the ranks' processes (pytest_pyfunc_call)
        return
    import numpy as np
    from jax.sharding import Mesh

    import iris_jax

    iris_jax.shutdown()  # nothing of an earlier test's runtime (heap, call table, races, faults) is kept
    if processes.in_rank():
        devices = processes.join_world()
    else:
        devices = _devices(settings.ranks, request.config.getoption("iris_gpu"))
    detect = settings.detect_races and os.environ.get(NO_RACES) != "1"
    runtime = iris_jax.init(devices=devices, heap_size=settings.heap_size, detect_races="raise" if detect else False)
    world = IrisWorld(runtime=runtime, mesh=Mesh(np.array(devices), (AXIS,)), size=len(devices), axis=AXIS,
                      settings=settings)
    try:
        with _bounded(runtime, settings.timeout_s):
            yield world
    finally:
        iris_jax.shutdown()


@contextlib.contextmanager
def _bounded(runtime, timeout_s: float):
    """iris's collectives (their config's timeout_s) and the simulated ranks (their world's limit,
    SLACK_S later) bounded while the test runs."""
    import iris_jax

    config = dataclasses.replace(iris_jax.default_config(), timeout_s=timeout_s)
    world = runtime.sim_world  # None on GPUs and in launched ranks
    saved = getattr(world, "timeout_s", None)
    if world is not None:
        world.timeout_s = timeout_s + SLACK_S
    try:
        with iris_jax.use_config(config):
            yield
    finally:
        if world is not None:
            world.timeout_s = saved


@pytest.fixture
def iris_world(_iris_runtime, request) -> IrisWorld:
    """The marked test's world: its runtime, a 1-D mesh over its ranks (axis "i") and its size."""
    if _iris_runtime is None:
        if request.node.get_closest_marker("iris") is None:
            pytest.fail(f"{request.node.nodeid}: the iris_world fixture needs @pytest.mark.iris(ranks=N)",
                        pytrace=False)
        return None  # processes=True: the body runs in the ranks' processes, each with its own iris_world
    return _iris_runtime


@pytest.fixture
def iris_faults(iris_world, request):
    """Faults injected on demand into the test's world (pytest_iris.faults.Faults); simulator only."""
    if iris_world is None:
        return None  # processes=True: the body runs in the ranks' processes, each with its own
    if not iris_world.runtime.backend.interprets_kernels:
        pytest.skip("iris_faults injects faults on the simulator only (not under --iris-gpu)")
    return Faults(iris_world.runtime)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """A processes=True test's body runs in N launched processes, here only their verdict."""
    settings = _settings_of(pyfuncitem)
    if settings is None or not settings.processes or processes.in_rank():
        return None
    processes.run(pyfuncitem, settings, gpu=pyfuncitem.config.getoption("iris_gpu"))
    return True
