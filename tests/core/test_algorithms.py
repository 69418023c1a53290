"""The all-reduce algorithms' table (iris_core.collectives.algorithms): what each runs, and the
errors the explicit API raises for what it does not."""

import pytest

from iris_core.collectives import kinds
from iris_core.collectives.algorithms import ALGORITHMS, BY_VARIANT
from iris_core.flag_protocol import RING_MAX_MEMBERS


def test_every_algorithm_has_one_row_and_its_constexpr():
    assert tuple(ALGORITHMS) == kinds.VARIANT_NAMES
    assert {a.variant: a.name for a in ALGORITHMS.values()} == dict(enumerate(kinds.VARIANT_NAMES))
    assert BY_VARIANT[kinds.RING] is ALGORITHMS["ring"] and BY_VARIANT[kinds.ONE_SHOT] is ALGORITHMS["one_shot"]


@pytest.mark.parametrize("name, op, dtype, members, runs", [
    ("one_shot", "max", "bfloat16", 64, True),
    ("two_shot", "min", "int8", 2, True),
    ("atomic", "sum", "float32", 8, True),
    ("atomic", "sum", "bfloat16", 8, False),  # remote atomic adds: float32 / int32 only
    ("atomic", "max", "float32", 8, False),
    ("spinlock", "sum", "bfloat16", 8, True),
    ("spinlock", "min", "float32", 8, False),
    ("ring", "sum", "float16", RING_MAX_MEMBERS, True),
    ("ring", "sum", "float16", RING_MAX_MEMBERS + 1, False),  # 2G - 1 rounds must fit STEPS
    ("ring", "sum", "float16", 1, False),
])
def test_what_each_algorithm_runs(name, op, dtype, members, runs):
    assert ALGORITHMS[name].runs(op, dtype, members) is runs


def test_refusals_name_the_algorithm_and_the_way_out():
    error, why = ALGORITHMS["spinlock"].refusal("max")
    assert error is ValueError and why == ("all_reduce variant 'spinlock' only sums; use one_shot, two_shot, ring "
                                           "for op='max'")
    error, why = ALGORITHMS["atomic"].refusal("sum", "bfloat16")
    assert error is TypeError and "'atomic' needs float32 or int32 (got bfloat16); use one_shot" in why
    error, why = ALGORITHMS["ring"].refusal("sum", members=RING_MAX_MEMBERS + 1)
    assert error is ValueError and f"groups of up to {RING_MAX_MEMBERS} ranks (got {RING_MAX_MEMBERS + 1})" in why
    assert ALGORITHMS["one_shot"].refusal("min", "int32", 128) is None
    with pytest.raises(TypeError, match="needs float32 or int32"):
        ALGORITHMS["atomic"].check("sum", "float16")
