"""Seeded races for the simulator's race detector (test_races.py, docs/device-api.md "Finding races").

No kernel here waits or sleeps to make its bug visible: the detector must find each whatever the
schedule (test_races.py runs each first, after other kernels and allocations, and with the ranks'
launch starts staggered).

`pair_exchange` pairs ranks (2p, 2p + 1): the even rank writes a block into its peer's `data` in
two rounds and raises the peer's `data_flag` word of that round after each; the odd rank waits for
each round's flag and reads it, and says it is done with round 0 through the writer's `ack` flag
before the writer reuses the buffer. Both then add into the writer's `counter`. `BUG` seeds one
mistake (NONE: the correct protocol, which the detector must pass):

    READ_BEFORE_FLAG   the reader reads the buffer before it waits for the flag
    RELAXED_SIGNAL     the writer raises the flag with sem="relaxed" (release needed)
    NO_ACQUIRE         the reader polls the flag with sem="relaxed" (acquire needed)
    REUSE_OFF_BY_ONE   the writer waits for the acks of the rounds before round - 1 (none) instead of
                       before round, before reusing the buffer
    PLAIN_STORES       both ranks store into the counter with plain stores (no atomic)
    WRONG_SCOPE        the reader polls the flag with scope="gpu" (the writer is another GPU)
    SAME_VALUE_STORE   the writer stores round 0's block again after its flag (the same values: a
                       race all the same, as the collectives' signature rewritten every round was)

Each round has its own flag word, so that a round's acquire orders that round only: with one word
counting rounds, a reader that came late would acquire round 1's release, which orders the reuse
before its read of round 0 (a wrong value in that run, but no race in it to report).

`ring`: each rank stores its block into the next rank's `inbox`, raises that rank's flag and reads
its own inbox, in the forms of RING_FORMS (correct; the flag raised relaxed; the inbox read without
waiting; the flag polled relaxed).
"""

import triton
import triton.language as tl

from iris_core.device import Context
from iris_core.device.intrinsics import load_acquire, nanosleep

NONE, READ_BEFORE_FLAG, RELAXED_SIGNAL, NO_ACQUIRE, REUSE_OFF_BY_ONE, PLAIN_STORES, WRONG_SCOPE, SAME_VALUE_STORE = \
    range(8)
BUGS = {"read_before_flag": READ_BEFORE_FLAG, "relaxed_signal": RELAXED_SIGNAL, "no_acquire": NO_ACQUIRE,
        "reuse_off_by_one": REUSE_OFF_BY_ONE, "plain_stores": PLAIN_STORES, "wrong_scope": WRONG_SCOPE,
        "same_value_store": SAME_VALUE_STORE}


@triton.jit
def _wait(ctx, flag_ptr, target, sem: tl.constexpr, scope: tl.constexpr):
    """Polls my own flag (an atomic read) until it reaches `target`."""
    seen = ctx.atomic_add(flag_ptr, 0, to_rank=ctx.rank, sem=sem, scope=scope)
    while seen < target:
        nanosleep(1_000_000)
        seen = ctx.atomic_add(flag_ptr, 0, to_rank=ctx.rank, sem=sem, scope=scope)


@triton.jit
def pair_exchange(context_ptr, data_ptr, data_flag_ptr, ack_ptr, counter_ptr, x_ptr, out_ptr,
                  BUG: tl.constexpr, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    signal_sem: tl.constexpr = "relaxed" if BUG == RELAXED_SIGNAL else "release"
    wait_sem: tl.constexpr = "relaxed" if BUG == NO_ACQUIRE else "acquire"
    wait_scope: tl.constexpr = "gpu" if BUG == WRONG_SCOPE else "sys"
    if ctx.rank % 2 == 0:  # the writer
        peer = ctx.rank + 1
        ctx.store(data_ptr + offs, x, to_rank=peer)
        ctx.atomic_max(data_flag_ptr, 1, to_rank=peer, sem=signal_sem, scope="sys")
        if BUG == SAME_VALUE_STORE:
            ctx.store(data_ptr + offs, x, to_rank=peer)
        if BUG != REUSE_OFF_BY_ONE:  # (waiting for ack >= 0 would still read it: ordered, were it raised)
            _wait(ctx, ack_ptr, 1, "acquire", "sys")
        ctx.store(data_ptr + offs, x + 1, to_rank=peer)  # round 1 reuses the buffer
        ctx.atomic_max(data_flag_ptr + 1, 1, to_rank=peer, sem=signal_sem, scope="sys")
        tl.store(out_ptr + offs, x)
    else:  # the reader
        peer = ctx.rank - 1
        early = tl.zeros((BLOCK,), tl.float32)
        if BUG == READ_BEFORE_FLAG:
            early = tl.load(data_ptr + offs)
        _wait(ctx, data_flag_ptr, 1, wait_sem, wait_scope)
        first = tl.load(data_ptr + offs)
        ctx.atomic_xchg(ack_ptr, 1, to_rank=peer, sem="release", scope="sys")
        _wait(ctx, data_flag_ptr + 1, 1, wait_sem, wait_scope)
        second = tl.load(data_ptr + offs)
        tl.store(out_ptr + offs, first + second + early * 0)
    # both ranks count into the writer's counter
    if BUG == PLAIN_STORES:
        ctx.store(counter_ptr, ctx.rank + 1, to_rank=ctx.rank - ctx.rank % 2)
    else:
        ctx.atomic_add(counter_ptr, ctx.rank + 1, to_rank=ctx.rank - ctx.rank % 2, sem="relaxed", scope="sys")


RING_CORRECT, RING_RELAXED, RING_NO_WAIT, RING_NO_ACQUIRE = range(4)
RING_FORMS = {"correct": RING_CORRECT, "relaxed": RING_RELAXED, "no_wait": RING_NO_WAIT, "no_acquire": RING_NO_ACQUIRE}


@triton.jit
def ring(context_ptr, inbox_ptr, flag_ptr, x_ptr, out_ptr, FORM: tl.constexpr, W: tl.constexpr,
         BLOCK: tl.constexpr):
    """Stores x into the next rank's inbox, raises its flag, reads my own inbox (see RING_FORMS)."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    ctx.store(inbox_ptr + offs, x, to_rank=(ctx.rank + 1) % W)
    tl.debug_barrier()
    ctx.atomic_add(flag_ptr, 1, to_rank=(ctx.rank + 1) % W, sem="relaxed" if FORM == RING_RELAXED else "release",
                   scope="sys")
    if FORM != RING_NO_WAIT:
        _wait(ctx, flag_ptr, 1, "relaxed" if FORM == RING_NO_ACQUIRE else "acquire", "sys")
    tl.store(out_ptr + offs, tl.load(inbox_ptr + offs))


@triton.jit
def store_to_next(context_ptr, inbox_ptr, x_ptr, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
    """Stores my x into the next rank's inbox (ordered for its reader only by what follows)."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    ctx.store(inbox_ptr + offs, x, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr + offs, x)


@triton.jit
def read_own(context_ptr, inbox_ptr, out_ptr, BLOCK: tl.constexpr):
    """Reads my inbox with a plain load."""
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(inbox_ptr + offs))


@triton.jit
def poll_then_clear(context_ptr, flag_ptr, out_ptr, W: tl.constexpr, ACQUIRE: tl.constexpr):
    """Reads my own flag (a volatile load, or load_acquire), then stores a plain 0 over the next
    rank's flag: nothing orders that store after the next rank's read (a race)."""
    ctx = Context.initialize(context_ptr, W)
    if ACQUIRE:
        seen = load_acquire(flag_ptr)
    else:
        seen = tl.load(flag_ptr, volatile=True)
    ctx.store(flag_ptr, 0, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr, seen)


SAME, NEIGHBOURS, WORD = range(3)  # small_stores: where the ranks store


@triton.jit
def small_stores(context_ptr, cells_ptr, out_ptr, W: tl.constexpr, WHERE: tl.constexpr):
    """Every rank stores into rank 0's `cells` (elements of 1 or 2 bytes), nothing ordering the
    ranks: all into element 0 (SAME: a race), each into element `rank` (NEIGHBOURS: bytes of one
    word, no race), or rank 0 a whole 4-byte word over the others' elements (WORD: a race)."""
    ctx = Context.initialize(context_ptr, W)
    value = (ctx.rank + 1).to(cells_ptr.dtype.element_ty)
    if WHERE == SAME:
        ctx.store(cells_ptr, value, to_rank=0)
    elif WHERE == NEIGHBOURS or ctx.rank > 0:
        ctx.store(cells_ptr + ctx.rank, value, to_rank=0)
    else:
        ctx.store(tl.cast(cells_ptr, tl.pointer_type(tl.int32)), -1, to_rank=0)
    tl.store(out_ptr, ctx.rank)


# programs_of_one_rank: races between the programs of one launch on one rank (they run side by side on a
# GPU; the simulator runs them one after another, so the earlier program is the producer)
(OVERLAPPING_TILES, UNORDERED_READ, CTA_FLAG, FLAG, LAST_ARRIVES, DISJOINT_TILES, PEER_FLAG_ELSEWHERE, PEER_FLAG_PASSED,
 READ_BY_BOTH, PEER_SEES_ONE_NUMBER, READ_BETWEEN) = range(11)
PROGRAM_BUGS = {"overlapping_tiles": OVERLAPPING_TILES, "unordered_read": UNORDERED_READ, "cta_flag": CTA_FLAG,
                "peer_flag_elsewhere": PEER_FLAG_ELSEWHERE, "read_by_both": READ_BY_BOTH}
PROGRAM_CORRECT = {"flag": FLAG, "last_arrives": LAST_ARRIVES, "disjoint_tiles": DISJOINT_TILES,
                   "peer_flag_passed": PEER_FLAG_PASSED}


@triton.jit
def programs_of_one_rank(context_ptr, tiles_ptr, flag_ptr, out_ptr, CASE: tl.constexpr, W: tl.constexpr,
                         BLOCK: tl.constexpr):
    """Programs of one launch sharing this rank's `tiles` (a heap array of a tile per program):

    OVERLAPPING_TILES  each program stores its tile one element early (an off-by-one tile mapping: the
                       first element of each tile is the last of the tile before)
    DISJOINT_TILES     each its own tile (correct)
    UNORDERED_READ     program 0 stores tile 0, program 1 reads it with nothing between
    FLAG               ... program 0 then releases a flag (scope="gpu"), program 1 acquires it first (correct)
    CTA_FLAG           ... the same flag at scope="cta" (orders threads of one program, not programs)
    LAST_ARRIVES       each program stores its tile and counts itself in (acq_rel at gpu scope); the
                       last to arrive sums every tile (correct)
    READ_BY_BOTH       both programs read tile 0, then program 1 overwrites it (program 0's read is
                       unordered with that store, though program 1's own read came between)
    PEER_FLAG_ELSEWHERE  ranks in pairs: the even rank's program 0 stores tile 0 into its peer's `tiles`
                       and raises the peer's flag (release, sys); the odd rank's program 0 waits for it,
                       its program 1 reads the tile (the acquire orders program 0 only)
    PEER_FLAG_PASSED   ... and program 0 passes it on: a release at gpu scope that program 1 acquires
                       before it reads (correct)
    PEER_SEES_ONE_NUMBER  the even rank's program 0 stores tile 1 into its peer's `tiles` and raises no
                       flag; its program 1 stores tile 0 there and raises the peer's flag; the odd rank
                       waits for the flag and reads both tiles (program 0's store is a race: a known hole,
                       the peer's view of a rank is one number)
    READ_BETWEEN       programs 0, 1 and 2 read tile 0, programs 0 and 2 then release a flag each (gpu
                       scope); program 3 acquires both and overwrites tile 0: program 1's read races
                       with it (a known hole: two records per word between programs, first and last)
    """
    ctx = Context.initialize(context_ptr, W)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    value = (offs + pid * 1000).to(tl.float32)
    if CASE == OVERLAPPING_TILES or CASE == DISJOINT_TILES:
        start = pid * (BLOCK - 1) if CASE == OVERLAPPING_TILES else pid * BLOCK
        tl.store(tiles_ptr + start + offs, value)
        tl.store(out_ptr + pid * BLOCK + offs, value)
    elif CASE == LAST_ARRIVES:
        tl.store(tiles_ptr + pid * BLOCK + offs, value)
        if tl.atomic_add(flag_ptr, 1, sem="acq_rel", scope="gpu") == programs - 1:
            total = tl.zeros((BLOCK,), tl.float32)
            for p in range(programs):
                total += tl.load(tiles_ptr + p * BLOCK + offs)
            tl.store(out_ptr + offs, total)
    elif CASE == READ_BY_BOTH:
        seen = tl.load(tiles_ptr + offs)
        if pid == 1:
            tl.store(tiles_ptr + offs, seen + 1)
        tl.store(out_ptr + pid * BLOCK + offs, seen)
    elif CASE == READ_BETWEEN:
        if pid < 3:
            seen = tl.load(tiles_ptr + offs)
            tl.store(out_ptr + pid * BLOCK + offs, seen)
            if pid != 1:
                tl.atomic_xchg(flag_ptr + pid // 2, 1, sem="release", scope="gpu")
        else:
            while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu") == 0:
                pass
            while tl.atomic_add(flag_ptr + 1, 0, sem="acquire", scope="gpu") == 0:
                pass
            tl.store(tiles_ptr + offs, value)
    elif CASE == PEER_SEES_ONE_NUMBER:
        if ctx.rank % 2 == 0:
            if pid == 0:
                ctx.store(tiles_ptr + BLOCK + offs, value, to_rank=ctx.rank + 1)
            else:
                ctx.store(tiles_ptr + offs, value, to_rank=ctx.rank + 1)
                ctx.atomic_xchg(flag_ptr + 1, 1, to_rank=ctx.rank + 1, sem="release", scope="sys")
        elif pid == 0:
            while ctx.atomic_add(flag_ptr + 1, 0, to_rank=ctx.rank, sem="acquire", scope="sys") == 0:
                pass
            tl.store(out_ptr + offs, tl.load(tiles_ptr + offs) + tl.load(tiles_ptr + BLOCK + offs))
    elif CASE == PEER_FLAG_ELSEWHERE or CASE == PEER_FLAG_PASSED:
        if ctx.rank % 2 == 0:
            if pid == 0:
                ctx.store(tiles_ptr + offs, value, to_rank=ctx.rank + 1)
                ctx.atomic_xchg(flag_ptr + 1, 1, to_rank=ctx.rank + 1, sem="release", scope="sys")
        elif pid == 0:
            while ctx.atomic_add(flag_ptr + 1, 0, to_rank=ctx.rank, sem="acquire", scope="sys") == 0:
                pass
            if CASE == PEER_FLAG_PASSED:
                tl.atomic_xchg(flag_ptr, 1, sem="release", scope="gpu")
        else:
            if CASE == PEER_FLAG_PASSED:
                while tl.atomic_add(flag_ptr, 0, sem="acquire", scope="gpu") == 0:
                    pass
            tl.store(out_ptr + offs, tl.load(tiles_ptr + offs))
    else:
        scope: tl.constexpr = "cta" if CASE == CTA_FLAG else "gpu"
        if pid == 0:
            tl.store(tiles_ptr + offs, value)
            if CASE != UNORDERED_READ:
                tl.atomic_xchg(flag_ptr, 1, sem="release", scope=scope)
        else:
            if CASE != UNORDERED_READ:
                while tl.atomic_add(flag_ptr, 0, sem="acquire", scope=scope) == 0:
                    pass
            tl.store(out_ptr + offs, tl.load(tiles_ptr + offs))


# -- Pallas (iris_jax.pallas): the ring of tests/jax/pallas_kernels.py's ring_put, a mistake seeded --
PALLAS_BUGS = ("no_wait", "relaxed_flag")
# races the detector does not see (docs/device-api.md, "What it does not see"): two programs of one rank
# store into one element of the next rank's inbox; the inbox read through the kernel's ref, not waited for
PALLAS_HOLES = ("programs_overlap", "ref_read")


def pallas_ring(bug: str | None):
    """A Pallas kernel that puts x into the next rank's inbox, raises its flag and reads its own
    inbox after its flag: correct for `bug` None; "no_wait": it reads before waiting; "relaxed_flag":
    the flag is raised with sem="relaxed" (release needed)."""

    def kernel(ctx, inbox_ref, flags_ref, x_ref, o_ref):
        peer = (ctx.rank + 1) % ctx.world_size
        if bug == "programs_overlap":  # (a grid of 2: each program stores the whole block)
            ctx.store(inbox_ref, x_ref[...] * 2.0, to_rank=peer)
            return
        if bug == "ref_read":
            ctx.store(inbox_ref, x_ref[...] * 2.0, to_rank=peer)
            o_ref[...] = inbox_ref[...]  # a plain ref read: interpret mode's copy, not checked
            return
        ctx.store(inbox_ref, x_ref[...] * 2.0, to_rank=peer)
        ctx.sync_threads()
        ctx.atomic_add(flags_ref.at[0], 1, to_rank=peer, sem="relaxed" if bug == "relaxed_flag" else "release")
        if bug != "no_wait":
            ctx.wait(flags_ref.at[0], 1)
        o_ref[...] = ctx.load(inbox_ref, from_rank=ctx.rank)

    kernel.__name__ = f"pallas_ring_{bug or 'correct'}"
    return kernel
