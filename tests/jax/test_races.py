"""The simulator's race detector (iris_core.sim.races): every seeded bug of race_kernels.py is found
at 2 and 4 ranks, with a report naming both accesses; correct code (the same kernel without the
bug, collectives and their variants, a tile-level collective, ragged_all_to_all) is never reported."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import RaceWarning
from iris_core.sim import races
from tests.jax import race_kernels
from tests.jax.helpers import TEST_HEAP

N = 64


def detecting(world: int, mode: str = "warn"):
    """A runtime over the first `world` devices with the race detector on."""
    iris_jax.shutdown()
    return iris_jax.init(heap_size=TEST_HEAP, devices=jax.devices()[:world], detect_races=mode)


@pytest.fixture(autouse=True)
def _fresh_runtime():
    yield
    iris_jax.shutdown()


def run_pairs(world: int, bug: int):
    """pair_exchange over `world` ranks; returns (each rank's output, RaceWarning messages)."""
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    data = iris_jax.zeros((world, N), jnp.float32, sharding=rows)
    flags = [iris_jax.zeros((world, 8), jnp.int64 if jax.config.jax_enable_x64 else jnp.int32, sharding=rows)
             for _ in range(4)]
    x = jax.device_put(np.arange(world * N, dtype=np.float32).reshape(world, N), rows)

    def body(d, f, a, r, c, v):
        return iris_jax.triton_call(d[0], f[0], a[0], r[0], c[0], v[0], kernel=race_kernels.pair_exchange,
                                    out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), grid=(1,), BUG=bug,
                                    W=world, BLOCK=N)[None]

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = np.asarray(program(data, *flags, x))
    return out, [str(w.message) for w in caught if issubclass(w.category, RaceWarning)]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("bug", sorted(race_kernels.BUGS))
def test_seeded_race_is_found(world, bug):
    detecting(world)
    _, found = run_pairs(world, race_kernels.BUGS[bug])
    assert found, f"{bug} at {world} ranks: no race reported"
    report = found[0]
    assert "data race on rank" in report and "by rank" in report and "pair_exchange" in report, report
    assert "race_kernels.py:" in report, report
    assert "to order them" in report, report
    racing_pairs = {tuple(sorted((int(a), int(b)))) for a, b in _ranks_of(found)}
    assert racing_pairs <= {(p, p + 1) for p in range(0, world, 2)}, found  # only partners race


def _ranks_of(reports):
    import re

    for report in reports:
        for text in report.split("data race on rank")[1:]:
            ranks = re.findall(r"by rank (\d+)", text)
            yield ranks[0], ranks[1]


@pytest.mark.parametrize("world", [2, 4])
def test_correct_protocol_is_not_reported(world):
    detecting(world)
    out, found = run_pairs(world, race_kernels.NONE)
    assert not found, found[0]
    x = np.arange(world * N, dtype=np.float32).reshape(world, N)
    for r in range(1, world, 2):  # each reader got both rounds of its writer
        np.testing.assert_array_equal(out[r], x[r - 1] + x[r - 1] + 1)


def test_raise_mode_names_the_race():
    detecting(2, "raise")
    with pytest.raises(Exception, match="RaceError") as error:
        run_pairs(2, race_kernels.READ_BEFORE_FLAG)
    assert "data race on rank" in str(error.value)


def test_mode_setting():
    assert races.mode_of(True) == "raise" and races.mode_of("warn") == "warn"
    assert races.mode_of(False) is None and races.mode_of("0") is None
    with pytest.raises(ValueError, match="detect_races"):
        races.mode_of("loud")
