"""`Flags`: the flag protocol between ranks (iris_core.flag_protocol) as one program speaks it.

Every kernel that waits on a peer builds one `Flags` (its Context, how long a wait may last,
how often to read, what a fault record names) and signals, waits, poisons and locks through it:
the collectives' Group, the streamed path, the fused GEMM ops, the device barrier and the
tile-level collectives. A new rule for stamps, poison or timeouts is written here once.

A writer makes its data visible before its flag: a CTA barrier (every thread's stores are
issued), then the flag's release at system scope (a GPU-scoped one is not guaranteed visible
to a peer GPU). A reader spins on an acquiring load until the flag reaches the value it
waits for, then passes a CTA barrier: its threads' later plain loads of the writer's data
are ordered after the writer's stores. The barriers are the callers' (one covers many flags),
but for `wait_or_fail`'s.

Every wait is bounded: TIMEOUT_NS after its `start` (the global timer) it returns a value
that `timed_out` recognizes, and the caller gives up: it fails (iris_core.device.faults: a
fault record naming the op and the rank, then the kernel stops; the simulator raises
PeerTimeoutError), or reports the rank (the device barrier). Locks are taken the same way.

Epochs: a program counts its calls in one word of its own heap, read once per call into a
register (`read_epoch`) and written back at the end (`write_epoch`).
"""

import triton
import triton.language as tl

from iris_core import flag_protocol
from iris_core.compat import DeviceValue, aggregate
from iris_core.device.faults import TIMEOUT, fail
from iris_core.device.intrinsics import global_timer, load_acquire, nanosleep

DEFAULT_TIMEOUT_NS: tl.constexpr = tl.constexpr(flag_protocol.timeout_ns(flag_protocol.DEFAULT_TIMEOUT_S))
POISON: tl.constexpr = tl.constexpr(flag_protocol.POISON)
LINE: tl.constexpr = tl.constexpr(flag_protocol.LINE_BYTES)
STEPS: tl.constexpr = tl.constexpr(flag_protocol.STEPS)
DONE: tl.constexpr = tl.constexpr(flag_protocol.DONE)
_MEMBER_MASK: tl.constexpr = tl.constexpr((1 << flag_protocol.FAILED_MEMBER_BITS) - 1)  # the `failed` word's fields
_CODE_SHIFT: tl.constexpr = tl.constexpr(flag_protocol.FAILED_MEMBER_BITS)
_CODE_MASK: tl.constexpr = tl.constexpr((1 << flag_protocol.FAILED_CODE_BITS) - 1)
_CALL_SHIFT: tl.constexpr = tl.constexpr(flag_protocol.FAILED_CALL_SHIFT)


@triton.constexpr_function
def _largest(dtype):
    return (1 << (dtype.primitive_bitwidth - 1)) - 1


@triton.jit
def timed_out(seen):
    """Whether Flags.wait returned `seen` because it timed out."""
    return seen == _largest(seen.dtype)


@triton.jit
def poisoned(seen):
    """Whether `seen`, a flag's value, says that its writer gave up on an earlier call."""
    return seen >= POISON


@triton.jit
def poisoned_at(seen):
    """The stamp its writer waited for when it gave up, of a `poisoned` flag value."""
    return seen - POISON


@triton.jit
def stamp(epoch, round=0):
    """The flag value of round `round` (< STEPS; DONE the last) of a group call's epoch `epoch`."""
    return epoch * STEPS + round


@triton.jit
def epoch_of(stamp):
    """The epoch of a group flag's stamp (not poisoned; see poisoned_at)."""
    return stamp // STEPS


@triton.jit
def round_of(stamp):
    """The round of a group flag's stamp within its epoch (0: the epoch's first)."""
    return stamp % STEPS


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


@triton.jit
def failed_word(member, code, call):
    """The streamed region's `failed` word (flag_protocol.failed_word); `code` a constant or a value."""
    code = tl.full((), 0, tl.int64) + code
    return (member + 1).to(tl.int64) | (code << _CODE_SHIFT) | (call.to(tl.int64) << _CALL_SHIFT)


@triton.jit
def parse_failed_word(word):
    """(member, code, call) of a `failed` word that is not 0 (flag_protocol.parse_failed_word)."""
    member = (word & _MEMBER_MASK).to(tl.int32) - 1
    return member, (word >> _CODE_SHIFT) & _CODE_MASK, (word >> _CALL_SHIFT).to(tl.int32)


@aggregate
class Flags:
    """One program's side of the protocol: its Context, the longest wait (TIMEOUT_NS), the sleep
    between two reads of a flag (POLL_NS; 0: spin), and the op a fault record names (WHAT)."""
    ctx: DeviceValue  # an iris_core.device.Context (whose module imports the users of this one)
    TIMEOUT_NS: tl.constexpr
    POLL_NS: tl.constexpr
    WHAT: tl.constexpr

    @triton.constexpr_function
    def __init__(self, ctx, TIMEOUT_NS, POLL_NS, WHAT):
        self.ctx = ctx
        self.TIMEOUT_NS = tl.constexpr(TIMEOUT_NS)
        self.POLL_NS = tl.constexpr(POLL_NS)
        self.WHAT = tl.constexpr(WHAT)

    @triton.jit
    def signal(self, flag, stamp, rank):
        """Raises `flag` on `rank`'s heap to `stamp` (release, system scope). An atomic max: a
        stamp never goes back, and a POISON flag stays poisoned."""
        self.ctx.atomic_max(flag, stamp, to_rank=rank, sem="release", scope="sys")

    @triton.jit
    def set(self, flag, value, rank=None):
        """Sets `flag` on `rank`'s heap (mine when None) to `value` (release, system scope): an
        atomic exchange, for flags that one writer raises."""
        if rank is None:
            tl.atomic_xchg(flag, value, sem="release", scope="sys")
        else:
            self.ctx.atomic_xchg(flag, value, to_rank=rank, sem="release", scope="sys")

    @triton.jit
    def poison(self, flag, rank, stamp):
        """Raises my `flag` on `rank`'s heap to POISON + `stamp`: I gave up while waiting for
        `stamp`, so my side of this call is lost (`poisoned_at` tells the stamp)."""
        self.ctx.atomic_max(flag, tl.full((), POISON, tl.int64) + stamp, to_rank=rank, sem="relaxed", scope="sys")

    @triton.jit
    def _read(self, flag, rank):
        """An acquiring read of `flag`: my own (rank None) by an acquiring load, `rank`'s through
        the heap by an acquiring atomic add of 0 (translated and guarded like every RMA op)."""
        if rank is None:
            return load_acquire(flag)
        else:
            return self.ctx.atomic_add(flag, 0, to_rank=rank, sem="acquire", scope="sys")

    @triton.jit
    def wait(self, flag, target, start, rank=None):
        """Spins on acquiring reads of `flag` (mine, or `rank`'s) until it reaches `target` or
        TIMEOUT_NS passed since `start` (global_timer()), sleeping POLL_NS between two reads.

        Returns the value read last, or, when the wait timed out, the largest value of the
        flag's type (which no flag holds; see timed_out)."""
        seen = self._read(flag, rank)
        while seen < target:
            if self.POLL_NS > 0:
                nanosleep(self.POLL_NS)
            if global_timer() - start > self.TIMEOUT_NS:
                seen = tl.full((), _largest(seen.dtype), seen.dtype)
            else:
                seen = self._read(flag, rank)
        return seen

    @triton.jit
    def wait_or_fail(self, flag, target, who, rank=None):
        """wait() from now (on my flag, or `rank`'s), then a CTA barrier; a timeout fails the
        kernel naming rank `who` (faults.fail)."""
        if timed_out(self.wait(flag, target, global_timer(), rank)):
            fail(self.ctx, TIMEOUT, self.WHAT, who, target)
        tl.debug_barrier()

    @triton.jit
    def lock(self, lock_ptr, rank, start):
        """Takes the lock at `lock_ptr` on `rank`'s heap (0 -> 1, acquire, system scope), trying
        until TIMEOUT_NS passed since `start`. Returns 0 once taken, -1 when it timed out."""
        held = tl.full((), 1, lock_ptr.dtype.element_ty)
        while held > 0:
            if global_timer() - start > self.TIMEOUT_NS:
                held = tl.full((), -1, lock_ptr.dtype.element_ty)
            else:
                held = self.ctx.atomic_cas(lock_ptr, 0, 1, to_rank=rank, sem="acquire", scope="sys")
        return held

    @triton.jit
    def lock_or_fail(self, lock_ptr, rank):
        """lock() from now, then a CTA barrier; a timeout fails the kernel naming `rank`."""
        if self.lock(lock_ptr, rank, global_timer()) != 0:
            fail(self.ctx, TIMEOUT, self.WHAT, rank)
        tl.debug_barrier()

    @triton.jit
    def unlock(self, lock_ptr, rank):
        """Releases the lock at `lock_ptr` on `rank`'s heap (release: my writes under it first)."""
        self.ctx.atomic_xchg(lock_ptr, 0, to_rank=rank, sem="release", scope="sys")
