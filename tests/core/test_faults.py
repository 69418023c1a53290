"""Fault pages, records and call signatures (iris_core.faults): what a GPU kernel that gives up
leaves behind, read on the host."""

import numpy as np
import pytest

from iris_core import faults
from iris_core.collectives import kinds
from iris_core.errors import PeerFailedError, PeerTimeoutError, RankMismatchError


def test_what_id_is_stable_and_fits_a_positive_int32():
    # FNV-1a of the name: the same number in every process (no Python hash seed involved)
    assert faults.what_id("psum") == faults.what_id("psum")
    assert faults.what_id("psum") != faults.what_id("pmax")
    ids = [faults.what_id(n) for n in ("psum", "all_gather", "ragged_all_to_all", "")]
    assert all(0 <= i < 2**31 for i in ids)
    assert faults.what_id("") == 2166136261 & 0x7FFF_FFFF


@pytest.mark.parametrize("kind, op, variant, dtype, blocks, columns, text", [
    (kinds.ALL_REDUCE, 0, 0, "fp32", 1, 64, "all_reduce(sum, one_shot) of float32[1, 64]"),
    (kinds.ALL_REDUCE, 1, 4, "bf16", 3, 65, "all_reduce(max, ring) of bfloat16[3, 65]"),
    (kinds.REDUCE_SCATTER, 2, 1, "int32", 2, 7, "reduce_scatter(min) of int32[2, 7]"),
    (kinds.ALL_GATHER, 0, 0, "fp8e4nv", 1, 1 << 20, "all_gather of float8_e4m3fn[1, 1048576]"),
    (kinds.RAGGED_ALL_TO_ALL, 0, 0, "int1", 4, 9, "ragged_all_to_all of bool[4, 9]"),
])
def test_signature_describes_the_call(kind, op, variant, dtype, blocks, columns, text):
    sig = faults.signature(kind, op, variant, dtype, blocks, columns)
    assert sig & faults.SIGNED and 0 < sig < 2**63  # never 0 (an unwritten slot), fits an int64
    assert faults.describe_signature(sig) == text


def test_signatures_differ_in_every_field():
    base = (kinds.ALL_REDUCE, 0, 0, "fp32", 1, 64)
    sigs = {faults.signature(*base)}
    for i, other in enumerate((kinds.ALL_GATHER, 1, 1, "fp16", 2, 65)):
        changed = list(base)
        changed[i] = other
        sigs.add(faults.signature(*changed))
    assert len(sigs) == 7


def test_an_unsigned_word_is_described_as_such():
    assert faults.describe_signature(0x1234) == "an unsigned call (0x1234)"


def _page():
    return np.zeros(faults.PAGE_BYTES // 8, np.int64)


def _write(words, program, record):
    at = faults.SLOTS_AT + program * faults.SLOT
    words[at + 1:at + faults.SLOT] = record[1:]
    words[at] = record[0]  # the code last, as the kernel writes it


def test_records_are_read_oldest_first_and_cleared():
    words = _page()
    words[0] = faults.EXIT
    words[faults.STATUS_COPY] = 99
    assert faults.read_records(words) == []
    what = faults.what_id(faults.named("psum@test"))
    _write(words, 5, [faults.TIMEOUT, what, 1, 7, -1, 0, 0, 2000])
    _write(words, 2, [faults.PEER_FAILED, what, 3, 8, -1, 0, 0, 1000])
    records = faults.read_records(words)
    assert [r.code for r in records] == [faults.PEER_FAILED, faults.TIMEOUT]
    assert records[1] == faults.Record(faults.TIMEOUT, what, 1, 7, -1, 0, 0, 2000)
    faults.clear_records(words)
    assert faults.read_records(words) == []
    assert words[0] == faults.EXIT and words[faults.STATUS_COPY] == 99  # only the slots are cleared


def test_record_errors_name_op_rank_peer_group_and_epoch():
    what = faults.what_id(faults.named("psum over i", kernel="_collective_kernel"))
    faults.name_workspace(4096, ((0, 1), (2, 3)))
    timeout = faults.Record(faults.TIMEOUT, what, 3, 12, 4096, 0, 0, 1).error(rank=2, timeout_s=5)
    assert isinstance(timeout, PeerTimeoutError)
    assert str(timeout) == ("iris psum over i: timed out after 5 s waiting for rank 3 (it never arrived) "
                            "(on rank 2, kernel _collective_kernel, group of ranks [2, 3], flag epoch 12)")
    failed = faults.Record(faults.PEER_FAILED, what, 0, 3, 4096, 0, 0, 1).error(rank=1)
    assert isinstance(failed, PeerFailedError)
    assert "rank 0 gave up on an earlier collective" in str(failed) and "group of ranks [0, 1]" in str(failed)
    mine = faults.signature(kinds.ALL_REDUCE, 0, 0, "fp32", 1, 64)
    theirs = faults.signature(kinds.ALL_REDUCE, 0, 0, "fp32", 1, 65)
    mismatch = faults.Record(faults.MISMATCH, what, 1, 0, 8192, mine, theirs, 1).error(rank=0)
    assert isinstance(mismatch, RankMismatchError)
    assert ("rank 1 made a different call than rank 0: rank 0 called all_reduce(sum, one_shot) of "
            "float32[1, 64], rank 1 all_reduce(sum, one_shot) of float32[1, 65]") in str(mismatch)
    assert "group workspace at heap offset 8192" in str(mismatch)  # a workspace not registered


def test_an_unknown_op_is_named_by_its_number():
    error = faults.Record(faults.TIMEOUT, 12345, 1, 0, -1, 0, 0, 1).error(rank=0)
    assert str(error).startswith("iris op #12345: timed out waiting for rank 1")
