"""iris_core.sim.call_table: the simulator's records of each group's calls, compared across ranks."""

import ctypes

import numpy as np

from iris_core.sim import call_table


class _Heaps:
    """Heap bases of a few ranks over host memory (what CallTable reads and writes)."""

    def __init__(self, ranks: int):
        self.memory = [np.zeros(call_table.NBYTES, np.uint8) for _ in range(ranks)]
        self.heap_bases = [int(m.ctypes.data) for m in self.memory]


def _tables(ranks=3):
    heaps = _Heaps(ranks)
    return heaps, call_table.CallTable(heaps, 0)


GROUP = call_table.digest([0, 1, 2])


def test_same_calls_agree():
    _, table = _tables()
    calls = [table.begin(r, GROUP, 7, "iris psum of (f32[4])", ("a.py:3", "a.py:9")) for r in range(3)]
    for call in calls:
        assert table.mismatch(call, [0, 1, 2]) is None
        assert table.divergence(call, [0, 1, 2]) is None
        assert table.behind(call, [0, 1, 2]) is None
    assert calls[0].text == "iris psum of (f32[4]) at a.py:3 < a.py:9"


def test_a_different_signature_is_a_mismatch_naming_both():
    _, table = _tables(2)
    mine = table.begin(0, GROUP, 7, "iris psum of (f32[4])")
    table.begin(1, GROUP, 8, "iris psum of (f32[5])")
    problem = table.mismatch(mine, [0, 1])
    assert "rank 0 ran iris psum of (f32[4]), rank 1 ran iris psum of (f32[5])" in problem


def test_same_signature_from_another_line_is_a_divergence_not_a_mismatch():
    _, table = _tables(2)
    mine = table.begin(0, GROUP, 7, "iris psum", ("a.py:3", "a.py:9"))
    table.begin(1, GROUP, 7, "iris psum", ("a.py:3", "a.py:12"))
    assert table.mismatch(mine, [0, 1]) is None
    note = table.divergence(mine, [0, 1])
    assert "rank 0 ran iris psum at a.py:3 < a.py:9, rank 1 ran iris psum at a.py:3 < a.py:12" in note
    unknown = table.begin(0, GROUP, 7, "iris psum")  # no site on one side: nothing to compare
    table.begin(1, GROUP, 7, "iris psum", ("a.py:3",))
    assert table.divergence(unknown, [0, 1]) is None


def test_behind_names_the_rank_that_made_fewer_calls_and_where_they_parted():
    _, table = _tables(2)
    table.begin(0, GROUP, 7, "iris psum", ("a.py:9",))  # rank 0: call 0 at line 9, call 1 at line 12
    table.begin(1, GROUP, 7, "iris psum", ("a.py:12",))  # rank 1 skipped line 9
    waiting = table.begin(0, GROUP, 7, "iris psum", ("a.py:12",))
    text = table.behind(waiting, [0, 1])
    assert text.startswith("rank 1 has made 1 call(s) of this group (its last: iris psum at a.py:12); "
                           "this rank's call 1 waits for its call 1"), text
    assert "parted at call 0: this rank ran iris psum at a.py:9, rank 1 ran iris psum at a.py:12" in text


def test_a_record_being_rewritten_or_of_another_group_is_not_compared():
    heaps, table = _tables(2)
    mine = table.begin(0, GROUP, 7, "iris psum")
    theirs = table.begin(1, GROUP, 8, "iris psum of another shape")
    slot = (GROUP % call_table.BUCKETS) * call_table.RING + theirs.number % call_table.RING
    ctypes.c_int64.from_address(heaps.heap_bases[1] + slot * call_table.RECORD_BYTES + 8).value = 0  # half-written
    assert table.mismatch(mine, [0, 1]) is None
    other = table.begin(0, call_table.digest([0, 1]), 9, "iris psum over another group")
    assert table.mismatch(other, [0, 1]) is None
