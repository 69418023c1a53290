"""What `pip install iris-jax` gives: a wheel (and an sdist) that carries every file the code opens
by path, C steps that build where a compiler is found and, where one cannot be built, one warning
naming its file and the Python step that takes its place.

scripts/wheel_check.sh (a CI step on both stacks) installs the wheel into a fresh venv outside the
checkout and runs the examples and a cross-section of this suite against the installed package;
`test_every_c_step_builds_without_a_warning` is part of that cross-section."""

import os
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("iris_core", "iris_jax", "pytest_iris")

# Builds each C step (the simulator's hand-off, the host meeting, the fault gate) and prints every
# file the code opens by path: the C sources and headers, the launcher's scripts, pytest-iris's rank script.
_BUILD_EVERY_STEP = textwrap.dedent("""
    import os, warnings, iris_core
    from iris_core import c_build
    from iris_core.errors import CStepWarning
    from iris_core.sim import launcher, world
    from iris_jax.calls import fault_gate, host_meeting
    from pytest_iris import processes
    warnings.simplefilter("error", CStepWarning)
    built = {"exchange": world._exchange(), "host_meeting": host_meeting._library(),
             "fault_gate": fault_gate._built()}  # (built, not started: it starts only beside a CUDA driver)
    assert all(lib is not None for lib in built.values()), built
    home = os.path.dirname(os.path.dirname(os.path.abspath(iris_core.__file__)))
    for path in sorted(c_build.requested | {launcher.RANK_PROCESS, launcher.JAX_CLUSTER, processes.RANK_MAIN}):
        print("opened", os.path.relpath(path, home))
""")


def _opened_by_path(tmp_path) -> list[str]:
    env = dict(os.environ, IRIS_KERNEL_CACHE_DIR=str(tmp_path), TMPDIR=str(tmp_path))  # (built afresh)
    done = subprocess.run([sys.executable, "-c", _BUILD_EVERY_STEP],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("opened ")]


def test_every_c_step_builds_without_a_warning(tmp_path):
    """Where the install is whole and a compiler works (CI, users' machines), each C step builds and
    none warns (warnings are errors in the subprocess)."""
    opened = _opened_by_path(tmp_path)
    assert {"iris_core/sim/exchange.c", "iris_jax/calls/host_meeting.c", "iris_jax/calls/fault_gate.c",
            "iris_jax/calls/xla_ffi.h"} <= set(opened), opened


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The checkout's sdist and the wheel built from that sdist (as `pip install iris-jax` gets them)."""
    if not (ROOT / "iris_core").is_dir():
        pytest.fail(f"{ROOT} is not a checkout of iris-jax: run this file from the repository")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "-o", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    wheel, = out.glob("*.whl")
    sdist, = out.glob("*.tar.gz")
    with zipfile.ZipFile(wheel) as z:
        wheel_files = set(z.namelist())
    with tarfile.open(sdist) as t:
        top = t.getnames()[0].split("/")[0]
        sdist_files = {name.removeprefix(top + "/") for name in t.getnames()}
    return wheel_files, sdist_files


def _package_files() -> list[str]:
    """Every file of the packages in the checkout (git's, else the folder's)."""
    try:
        done = subprocess.run(["git", "ls-files", *PACKAGES], cwd=ROOT, capture_output=True, text=True)
    except FileNotFoundError:  # no git (the newest stack's chroot)
        done = None
    if done is not None and done.returncode == 0 and done.stdout.strip():
        return done.stdout.split()
    return [str(p.relative_to(ROOT)) for package in PACKAGES for p in (ROOT / package).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts]


def test_the_wheel_and_the_sdist_carry_every_file_of_the_packages(built):
    wheel, sdist = built
    files = _package_files()
    assert any(f.endswith(".c") for f in files)
    assert not [f for f in files if f not in wheel], "pyproject.toml's package data misses these (wheel)"
    assert not [f for f in files if f not in sdist], "pyproject.toml's package data misses these (sdist)"


def test_the_wheel_carries_every_file_the_code_opens_by_path(built, tmp_path):
    wheel, _ = built
    opened = _opened_by_path(tmp_path)
    assert not [f for f in opened if f not in wheel], "the code opens these by path; the wheel lacks them"
