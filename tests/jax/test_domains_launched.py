"""Domains under the multi-controller launcher: IRIS_DOMAIN_SIZE splits the launched ranks
(tests/jax/launched_domains.py, 4 processes)."""

from tests.jax.helpers import run_python


def test_launched_ranks_split_into_domains():
    result = run_python(["-m", "iris_core.sim", "-n", "4", "--timeout", "170", "tests/jax/launched_domains.py"],
                        timeout=200, IRIS_DOMAIN_SIZE="2")
    assert result.returncode == 0, result.stdout
    for p in range(4):
        assert f"process {p}: domains OK" in result.stdout, result.stdout
