"""The flag protocol: its host description (iris_core.flag_protocol) and its device side
(iris_core.device.flags.Flags) agree, and Flags keeps the protocol's rules between ranks
(stamps only grow, poison lies above every stamp and says where its writer gave up, a wait
that outlives its timeout says so)."""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core import faults, flag_protocol
from iris_core.device import Context, flags, global_timer
from iris_core.sim import get_world, launch

TIMEOUT_S = 120
WAIT_NS = 20_000_000  # the wait that is meant to time out: 20 ms
_WHAT = tl.constexpr(faults.named("flag protocol test"))
MEMBERS = [0, 1, 7, (1 << flag_protocol.FAILED_MEMBER_BITS) - 2]
CALLS = [1, 2, 1000, (1 << 31) - 1]


@triton.jit
def _failed_words_kernel(members_ptr, calls_ptr, words_ptr, parsed_ptr, CODE: tl.constexpr, N: tl.constexpr):
    for i in tl.static_range(N):
        word = flags.failed_word(tl.load(members_ptr + i), CODE, tl.load(calls_ptr + i))
        tl.store(words_ptr + i, word)
        member, code, call = flags.parse_failed_word(word)
        tl.store(parsed_ptr + 3 * i, member.to(tl.int64))
        tl.store(parsed_ptr + 3 * i + 1, code.to(tl.int64))
        tl.store(parsed_ptr + 3 * i + 2, call.to(tl.int64))


@triton.jit
def _protocol_kernel(context_ptr, flag_ptr, ack_ptr, never_ptr, out_ptr, W: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                     WAIT_NS: tl.constexpr, WHAT: tl.constexpr):
    """Rank 0 raises rank 1's flag to 5, then (too late) to 3, waits for rank 1's ack, poisons
    the flag at stamp 7. Rank 1 records what its waits saw: [5, poisoned?, poisoned at, timed
    out on a flag nobody raises?]."""
    ctx = Context.initialize(context_ptr, W)
    f = flags.Flags(ctx, TIMEOUT_NS, 0, WHAT)
    if ctx.rank == 0:
        f.signal(flag_ptr, 5, 1)
        f.signal(flag_ptr, 3, 1)  # an atomic max: the flag stays at 5
        f.wait_or_fail(ack_ptr, 1, 1)
        f.poison(flag_ptr, 1, 7)
    if ctx.rank == 1:
        tl.store(out_ptr, f.wait(flag_ptr, 5, global_timer()))
        f.set(ack_ptr, 1, 0)
        seen = f.wait(flag_ptr, 6, global_timer())
        tl.store(out_ptr + 1, flags.poisoned(seen).to(tl.int64))
        tl.store(out_ptr + 2, flags.poisoned_at(seen))
        short = flags.Flags(ctx, WAIT_NS, 1000, WHAT)
        tl.store(out_ptr + 3, flags.timed_out(short.wait(never_ptr, 1, global_timer())).to(tl.int64))


def _words_rank(state, session, offsets, code):
    heap = state.heap(session)
    view = lambda name, n, dtype: heap.host_view(state.rank, offsets[name], (n,), dtype)
    n = len(MEMBERS)
    launch(_failed_words_kernel, (1,), view("members", n, np.int32), view("calls", n, np.int32),
           view("words", n, np.int64), view("parsed", 3 * n, np.int64), CODE=code, N=n)


def _protocol_rank(state, session, offsets):
    heap = state.heap(session)
    view = lambda name, n: heap.host_view(state.rank, offsets[name], (n,), np.int64)
    launch(_protocol_kernel, (1,), heap.context(state.rank), view("flag", 1), view("ack", 1), view("never", 1),
           view("out", 4), W=state.world_size, TIMEOUT_NS=flag_protocol.timeout_ns(TIMEOUT_S), WAIT_NS=WAIT_NS,
           WHAT=_WHAT.value)


@pytest.mark.parametrize("code", [faults.TIMEOUT, faults.PEER_FAILED, faults.MISMATCH])
def test_streamed_failed_word_is_the_hosts(sim_heap, code):
    n = len(MEMBERS)
    heap = sim_heap(1)
    offsets = {name: heap.allocate(8 * size) for name, size in [("members", n), ("calls", n), ("words", n),
                                                                   ("parsed", 3 * n)]}
    heap.host_view(0, offsets["members"], (n,), np.int32)[:] = MEMBERS
    heap.host_view(0, offsets["calls"], (n,), np.int32)[:] = CALLS
    heap.host_view(0, offsets["words"], (n,), np.int64)[:] = -1
    heap.host_view(0, offsets["parsed"], (3 * n,), np.int64)[:] = -1
    get_world(1).run(_words_rank, heap.session, offsets, code, timeout_s=TIMEOUT_S)
    words = heap.host_view(0, offsets["words"], (n,), np.int64)
    parsed = heap.host_view(0, offsets["parsed"], (3 * n,), np.int64)
    for i, (member, call) in enumerate(zip(MEMBERS, CALLS)):
        assert int(words[i]) == flag_protocol.failed_word(member, code, call)
        assert flag_protocol.parse_failed_word(int(words[i])) == (member, code, call)
        assert parsed[3 * i:3 * i + 3].tolist() == [member, code, call]


def test_stamps_poison_and_timeouts_between_ranks(sim_heap):
    heap = sim_heap(2)
    offsets = {name: heap.allocate(flag_protocol.LINE_BYTES) for name in ("flag", "ack", "never", "out")}
    for r in range(2):
        for name in ("flag", "ack", "never"):
            heap.host_view(r, offsets[name], (1,), np.int64)[:] = 0
        heap.host_view(r, offsets["out"], (4,), np.int64)[:] = -1
    get_world(2).run(_protocol_rank, heap.session, offsets, timeout_s=TIMEOUT_S)
    out = heap.host_view(1, offsets["out"], (4,), np.int64).tolist()
    assert out == [5, 1, 7, 1], "[seen, poisoned, poisoned at, timed out]"
    assert int(heap.host_view(1, offsets["flag"], (1,), np.int64)[0]) == flag_protocol.POISON + 7
    assert heap.host_view(0, offsets["out"], (4,), np.int64).tolist() == [-1] * 4


def test_poison_lies_above_every_stamp():
    largest_epoch = (flag_protocol.POISON - 1) // flag_protocol.STEPS
    assert largest_epoch * flag_protocol.STEPS + flag_protocol.DONE < flag_protocol.POISON
    assert flag_protocol.POISON + largest_epoch * flag_protocol.STEPS < (1 << 63) - 1  # below a timed-out wait's value


def test_ring_limit_follows_from_the_rounds_per_epoch():
    assert 2 * flag_protocol.RING_MAX_MEMBERS - 1 < flag_protocol.STEPS  # rounds 0 .. 2G - 2, then DONE
    assert flag_protocol.DONE == flag_protocol.STEPS - 1


def test_timeout_in_nanoseconds():
    assert flag_protocol.timeout_ns(3) == 3_000_000_000
    assert flags.DEFAULT_TIMEOUT_NS.value == flag_protocol.timeout_ns(flag_protocol.DEFAULT_TIMEOUT_S)
