"""The flag protocol between ranks: signal (release), wait (acquire, bounded), give up (poison), epochs.

A writer makes its data visible before its flag: a CTA barrier (every thread's stores are
issued), then the flag's release at system scope (a GPU-scoped one is not guaranteed visible
to a peer GPU). A reader spins on an acquiring load until the flag reaches the value it
waits for, then passes a CTA barrier: its threads' later plain loads of the writer's data
are ordered after the writer's stores. The barriers are the callers' (one covers many flags).

Flags hold stamps that only grow (a call's epoch, or a count of deliveries), so they need
no reset between calls and a waiter compares with >=. A program that gives up (a timeout)
raises its flags on its peers to POISON, above every stamp: a peer that later waits on it
passes at once and fails (`poisoned`, peer_failed) rather than trust a flag of a lost call.

Every wait is bounded: TIMEOUT_NS after its `start` (the global timer) it returns a value
that `timed_out` recognizes, and the caller gives up: it fails (iris_core.device.faults: a
fault record naming the op and the rank, then the kernel stops; the simulator raises
PeerTimeoutError), or reports the rank (the device barrier). Locks are taken the same way
(`lock`).

Epochs: a program counts its calls in one word of its own heap, read once per call into a
register and written back at the end.
"""

import triton
import triton.language as tl

from iris_core.device.faults import TIMEOUT, fail
from iris_core.device.intrinsics import global_timer, load_acquire, nanosleep

DEFAULT_TIMEOUT_S = 60.0  # how long a kernel waits for a peer unless told otherwise
DEFAULT_TIMEOUT_NS: tl.constexpr = tl.constexpr(int(DEFAULT_TIMEOUT_S * 10**9))
POISON: tl.constexpr = tl.constexpr(1 << 62)  # the flag of a program that gave up
LINE_BYTES = 128  # every flag and epoch on a line of its own: no false sharing between writers
LINE: tl.constexpr = tl.constexpr(LINE_BYTES)


@triton.jit
def signal(ctx, flag, stamp, rank):
    """Raises `flag` on `rank`'s heap to `stamp` (release, system scope). An atomic max: a
    stamp never goes back, and a POISON flag stays poisoned."""
    ctx.atomic_max(flag, stamp, to_rank=rank, sem="release", scope="sys")


@triton.jit
def set_flag(ctx, flag, value, rank=None):
    """Sets `flag` on `rank`'s heap (mine when None) to `value` (release, system scope): an
    atomic exchange, for flags that one writer raises."""
    if rank is None:
        tl.atomic_xchg(flag, value, sem="release", scope="sys")
    else:
        ctx.atomic_xchg(flag, value, to_rank=rank, sem="release", scope="sys")


@triton.jit
def poison(ctx, flag, rank, stamp):
    """Raises my `flag` on `rank`'s heap to POISON + `stamp`: I gave up while waiting for
    `stamp`, so my side of this call is lost (`poisoned_at` tells the stamp)."""
    ctx.atomic_max(flag, tl.full((), POISON, tl.int64) + stamp, to_rank=rank, sem="relaxed", scope="sys")


@triton.jit
def poisoned(seen):
    """Whether `seen`, a flag's value, says that its writer gave up on an earlier call."""
    return seen >= POISON


@triton.jit
def poisoned_at(seen):
    """The stamp its writer waited for when it gave up, of a `poisoned` flag value."""
    return seen - POISON


@triton.jit
def _read(flag, ctx, rank):
    """An acquiring read of `flag`: my own (rank None) by an acquiring load, `rank`'s through
    the heap by an acquiring atomic add of 0 (translated and guarded like every RMA op)."""
    if rank is None:
        return load_acquire(flag)
    else:
        return ctx.atomic_add(flag, 0, to_rank=rank, sem="acquire", scope="sys")


@triton.constexpr_function
def _largest(dtype):
    return (1 << (dtype.primitive_bitwidth - 1)) - 1


@triton.jit
def wait(flag, target, start, TIMEOUT_NS: tl.constexpr, POLL_NS: tl.constexpr = 0, ctx=None, rank=None):
    """Spins on acquiring reads of `flag` (mine, or `rank`'s through `ctx`) until it reaches
    `target` or TIMEOUT_NS passed since `start` (global_timer()); sleeps POLL_NS between two
    reads when > 0 (a waiter beside busy programs need not spin flat out).

    Returns the value read last, or, when the wait timed out, the largest value of the
    flag's type (which no flag holds; see timed_out)."""
    seen = _read(flag, ctx, rank)
    while seen < target:
        if POLL_NS > 0:
            nanosleep(POLL_NS)
        if global_timer() - start > TIMEOUT_NS:
            seen = tl.full((), _largest(seen.dtype), seen.dtype)
        else:
            seen = _read(flag, ctx, rank)
    return seen


@triton.jit
def timed_out(seen):
    """Whether wait() returned `seen` because it timed out."""
    return seen == _largest(seen.dtype)


@triton.jit
def wait_or_fail(ctx, flag, target, who, WHAT: tl.constexpr, TIMEOUT_NS: tl.constexpr, POLL_NS: tl.constexpr = 0,
                 rank=None, group=-1):
    """wait() from now (on my flag, or `rank`'s), then a CTA barrier; a timeout fails the kernel
    naming rank `who` (faults.fail; `group`: the heap offset of the waiters' workspace)."""
    if timed_out(wait(flag, target, global_timer(), TIMEOUT_NS, POLL_NS, ctx, rank)):
        fail(ctx, TIMEOUT, WHAT, who, target, group)
    tl.debug_barrier()


@triton.jit
def lock(ctx, lock_ptr, rank, start, TIMEOUT_NS: tl.constexpr):
    """Takes the lock at `lock_ptr` on `rank`'s heap (0 -> 1, acquire, system scope), trying
    until TIMEOUT_NS passed since `start`. Returns 0 once taken, -1 when it timed out."""
    held = tl.full((), 1, lock_ptr.dtype.element_ty)
    while held > 0:
        if global_timer() - start > TIMEOUT_NS:
            held = tl.full((), -1, lock_ptr.dtype.element_ty)
        else:
            held = ctx.atomic_cas(lock_ptr, 0, 1, to_rank=rank, sem="acquire", scope="sys")
    return held


@triton.jit
def unlock(ctx, lock_ptr, rank):
    """Releases the lock at `lock_ptr` on `rank`'s heap (release: my writes under it first)."""
    ctx.atomic_xchg(lock_ptr, 0, to_rank=rank, sem="release", scope="sys")


@triton.jit
def read_epoch(epoch_ptr):
    """This program's call count, read once per call and kept in a register: a re-read
    through the (incoherent) L1 could give threads of one program different epochs."""
    return tl.load(epoch_ptr, volatile=True)


@triton.jit
def write_epoch(epoch_ptr, epoch):
    """Stores this program's call count once every thread is done with the old one."""
    tl.debug_barrier()
    tl.store(epoch_ptr, epoch)
