"""pytest-iris: test multi-GPU JAX code on iris's CPU simulator (docs/testing-your-code.md).

Installed with iris-jax and registered through pytest's `pytest11` entry point (no `-p`, no
conftest). A test asks for a simulated world with a marker and gets it through a fixture:

    @pytest.mark.iris(ranks=(2, 4))
    def test_ring(iris_world):
        mesh = iris_world.mesh          # a 1-D mesh over the ranks, axis "i"
        ...

Each marked test runs with an iris runtime of its own (a fresh heap, call table and race
state), race detection on, and a bounded wait for every simulated rank. Unmarked tests, and
projects that never use the marker, are left as they are: nothing of JAX or iris is imported
until a marked test is collected (this package's modules import neither at their top).

Modules: `plugin` (the hooks, the marker and the fixtures), `settings` (the marker's
arguments, checked), `processes` (a test run as one process per rank).
"""

from pytest_iris.settings import DEFAULT_TIMEOUT_S, IrisWorld, Settings

__all__ = ["DEFAULT_TIMEOUT_S", "IrisWorld", "Settings"]
