"""`Group`: the members of a collective call as one program sees them, and their flags.

The kernel's group row is [my index, member ranks..., workspace offset low, high]
(iris_core.collectives.group_layout). A program signals and waits on its own line of flags in each
member's workspace: the flag that member i raises for program `pid` sits at line
MAX_PROGRAMS + pid * WORLD + i (iris_core.collectives.workspace), so program k waits only
for program k of its peers. Stamps: STEPS flag rounds per call epoch, signalled, awaited and
poisoned through the group's Flags (the flag protocol: iris_core.device.flags).

Each flag line holds [stamp, published input offset, signature of even epochs, of odd epochs]:
a member writes its call's signature (iris_core.device.faults.signature) into the slot of the
epoch's parity once per epoch, before it raises the epoch's first round, and a waiter compares it
with its own after every wait.
A member cannot overwrite the slot before I read it (that takes its epoch + 2, which waits for
my epoch + 1), so two calls that differ fail on both ranks (RankMismatchError) instead of pairing.
"""

import triton
import triton.language as tl

from iris_core.collectives import group_layout
from iris_core.compat import aggregate
from iris_core.device import Context, flags, global_timer
from iris_core.device.faults import MISMATCH, PEER_FAILED, TIMEOUT, fail
from iris_core.device.flags import LINE, Flags
from iris_core.device.tracing import EVENT_WAIT

MEMBERS: tl.constexpr = tl.constexpr(group_layout.MEMBERS)  # the group row's word of member 0


@triton.jit
def member_rank(group_ptr, member):
    """Global rank of group member `member`."""
    return tl.load(group_ptr + MEMBERS + member)


@triton.jit
def workspace_offset(group_ptr, G: tl.constexpr):
    """Heap offset of this group's workspace (see iris_jax._runtime.workspace)."""
    low = tl.load(group_ptr + MEMBERS + G).to(tl.uint32).to(tl.uint64)
    high = tl.load(group_ptr + (MEMBERS + 1) + G).to(tl.uint32).to(tl.uint64)
    return low | (high << 32)


@aggregate
class Group:
    """My index `me` among the G members, my program `pid` of `programs`, the workspace base on
    my heap, my call's signature `sig`, and the flag protocol as this call speaks it (`flags`:
    how long to wait, what a fault names)."""
    ctx: Context
    flags: Flags
    row: tl.tensor
    me: tl.tensor
    pid: tl.tensor
    programs: tl.tensor
    ws_base: tl.tensor
    sig: tl.tensor
    G: tl.constexpr
    MAX_PROGRAMS: tl.constexpr

    @triton.constexpr_function
    def __init__(self, flags, row, me, pid, programs, ws_base, sig, G, MAX_PROGRAMS):
        self.ctx = flags.ctx
        self.flags = flags
        self.row = row
        self.me = me
        self.pid = pid
        self.programs = programs
        self.ws_base = ws_base
        self.sig = sig
        self.G = tl.constexpr(G)
        self.MAX_PROGRAMS = tl.constexpr(MAX_PROGRAMS)

    @staticmethod
    @triton.jit
    def initialize(ctx, group_ptr, sig, G: tl.constexpr, MAX_PROGRAMS: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                   WHAT: tl.constexpr):
        """Decodes the group row for this program, whose call has signature `sig`."""
        ws_base = tl.load(ctx.heap_bases + ctx.rank) + workspace_offset(group_ptr, G)
        return Group(Flags(ctx, TIMEOUT_NS, 0, WHAT), group_ptr, tl.load(group_ptr), tl.program_id(0),
                     tl.num_programs(0), ws_base, sig, G, MAX_PROGRAMS)

    @triton.jit
    def rank(self, member):
        """Global rank of member `member`."""
        return member_rank(self.row, member)

    @triton.jit
    def flag(self, member):
        """Pointer (in my heap) to the flag `member` raises for my program."""
        line = self.MAX_PROGRAMS + self.pid * self.ctx.world_size + member
        return tl.cast(self.ws_base + line * LINE, tl.pointer_type(tl.int64))

    @triton.jit
    def epoch_ptr(self):
        """My program's call count (iris_core.device.flags.read_epoch)."""
        return tl.cast(self.ws_base + self.pid * LINE, tl.pointer_type(tl.int64))

    @triton.jit
    def end_call(self, epoch):
        """Stores my program's call count `epoch`, and the same in the lines of the programs
        this launch does not have (pid + programs, pid + 2 programs, ...). Every program's
        count then stays the same whatever the grids of the calls, so that each call's buffers
        have the other parity than the last call's for every program: a program that skipped
        calls would otherwise stage into the buffer a peer may still be reading (another
        program's, of the previous call), with no wait between them."""
        tl.debug_barrier()  # every thread is done with the old count
        lines = self.pid + self.programs * tl.arange(0, self.MAX_PROGRAMS)
        ptrs = tl.cast(self.ws_base, tl.pointer_type(tl.int64)) + lines.to(tl.int64) * (LINE // 8)
        tl.store(ptrs, tl.full([self.MAX_PROGRAMS], 0, tl.int64) + epoch, mask=lines < self.MAX_PROGRAMS)

    @triton.jit
    def publish(self, input_offset):
        """Zero-copy: writes my input's heap offset (-1: staged) next to my flag on every member;
        the next signal releases it. Stable for the whole call (rewritten after the DONE round)."""
        word = self.flag(self.me) + 1
        for i in tl.static_range(self.G):
            self.ctx.store(word, input_offset, to_rank=self.rank(i))

    @triton.jit
    def signature_slot(self, member, stamp):
        """Where `member`'s signature for the epoch of `stamp` lies, next to its flag (in my heap)."""
        return self.flag(member) + 2 + flags.epoch_of(stamp) % 2

    @triton.jit
    def signal(self, stamp):
        """Raises my flag to `stamp` on every member (Flags.signal: my earlier writes first). The
        epoch's first round (round 0: every call opens each of its epochs with it) writes my
        call's signature beside the flag; later rounds leave it: a member may be reading it
        then, and a plain store, even of the same value, races with that read."""
        flag = self.flag(self.me)
        if flags.round_of(stamp) == 0:
            sig = self.signature_slot(self.me, stamp)
            for i in tl.static_range(self.G):
                self.ctx.store(sig, self.sig, to_rank=self.rank(i))
        tl.debug_barrier()  # every thread's stores precede the release
        for i in tl.static_range(self.G):
            self.flags.signal(flag, stamp, self.rank(i))

    @triton.jit
    def workspace(self):
        """The heap offset of this group's workspace (what a fault record names the group by)."""
        return (self.ws_base - tl.load(self.ctx.heap_bases + self.ctx.rank)).to(tl.int64)

    @triton.jit
    def fail(self, CODE, rank, stamp, theirs=0):
        """Gives up on this call because of `rank` (faults.fail). My flag on every member becomes
        POISON first: this call's epoch is lost on my side, so a member's later wait on me must
        fail, not pass on a stale flag. So do the flags of the programs this launch does not have
        (see poison_missing_programs). No CTA barrier here: threads may get here at different
        times."""
        flag = self.flag(self.me)
        for i in tl.static_range(self.G):
            self.flags.poison(flag, self.rank(i), stamp)
        self.poison_missing_programs(stamp)
        fail(self.ctx, CODE, self.flags.WHAT, rank, flags.epoch_of(stamp), self.workspace(), self.sig, theirs)

    @triton.jit
    def poison_missing_programs(self, stamp):
        """Poisons, on every member, my flags of the programs that this launch does not have (pid
        + programs, pid + 2 programs, ...), my signature beside each. Ranks whose calls differ can
        launch different grids (other sizes): a member's program that has no counterpart here
        waits on one of these flags, and must fail naming my call, not time out."""
        lines = self.pid + self.programs * (tl.arange(0, self.MAX_PROGRAMS) + 1)
        missing = lines < self.MAX_PROGRAMS
        flag_lines = self.MAX_PROGRAMS + lines.to(tl.int64) * self.ctx.world_size + self.me
        flag = tl.cast(self.ws_base, tl.pointer_type(tl.int64)) + flag_lines * (LINE // 8)
        sig = flag + 2 + flags.epoch_of(stamp) % 2
        poison = tl.full([self.MAX_PROGRAMS], flags.POISON, tl.int64) + stamp
        for i in tl.static_range(self.G):
            self.ctx.store(sig, tl.full([self.MAX_PROGRAMS], 0, tl.int64) + self.sig, to_rank=self.rank(i),
                           mask=missing)
        tl.debug_barrier()  # the signatures precede the poison that makes them readable
        for i in tl.static_range(self.G):
            self.ctx.atomic_max(flag, poison, to_rank=self.rank(i), mask=missing, sem="release", scope="sys")

    @triton.jit
    def give_up(self, rank, stamp):
        """Times out waiting on `rank` (at flag value `stamp`)."""
        self.fail(TIMEOUT, rank, stamp)

    @triton.jit
    def _wait_for(self, member, stamp, start, bad, bad_seen, bad_theirs):
        """Waits until `member`'s flag reached `stamp` (Flags.wait), unless an earlier member of
        this wait went wrong (`bad` >= 0). Returns (bad, bad_seen, bad_theirs), `member`'s own
        when its wait timed out, its flag is POISON (it gave up on an earlier call) or its
        signature differs from mine (it made another call)."""
        if bad < 0:
            seen = self.flags.wait(self.flag(member), stamp, start)
            theirs = tl.load(self.signature_slot(member, stamp), volatile=True)
            wrong = flags.timed_out(seen) | flags.poisoned(seen) | (theirs != self.sig)
            bad = tl.where(wrong, member, bad)
            bad_seen = tl.where(wrong, seen, bad_seen)
            bad_theirs = tl.where(wrong, theirs, bad_theirs)
        return bad, bad_seen, bad_theirs

    @triton.jit
    def wait_member(self, member, stamp, start):
        """Waits until `member`'s flag reached `stamp` (Flags.wait); gives up after the timeout,
        fails at once when the member gave up on an earlier call (its flag is POISON) or made
        another call (its signature differs)."""
        bad, seen, theirs = self._wait_for(member, stamp, start, tl.full((), -1, tl.int32), tl.full((), 0, tl.int64),
                                           tl.full((), 0, tl.int64))
        if bad >= 0:
            give_up_on(self, bad, stamp, seen, theirs)

    @triton.jit
    def differing(self, stamp):
        """(rank, signature) of a member whose call in the epoch of `stamp` differs from mine,
        else (-1, 0). A member's slot holds that epoch's signature once its flag reached the
        epoch, or was poisoned in it (a member signals in an epoch before it waits in it)."""
        epoch = flags.epoch_of(stamp)
        culprit = tl.full((), -1, tl.int32)
        theirs = tl.full((), 0, tl.int64)
        for i in tl.static_range(self.G):
            seen = tl.load(self.flag(i), volatile=True)
            sig = tl.load(self.signature_slot(i, stamp), volatile=True)
            this_epoch = tl.where(flags.poisoned(seen), flags.epoch_of(flags.poisoned_at(seen)) == epoch,
                                  flags.epoch_of(seen) >= epoch)
            hit = this_epoch & (sig != self.sig) & (culprit < 0)
            culprit = tl.where(hit, self.rank(i), culprit)
            theirs = tl.where(hit, sig, theirs)
        return culprit, theirs

    @triton.jit
    def wait(self, stamp):
        """Waits until every member's flag reached `stamp` (traced as a `wait` span)."""
        event = self.ctx.tracing.record_event_start(EVENT_WAIT, self.ctx.rank, None)
        start = global_timer()
        bad = tl.full((), -1, tl.int32)
        seen = tl.full((), 0, tl.int64)
        theirs = tl.full((), 0, tl.int64)
        for i in tl.static_range(self.G):
            bad, seen, theirs = self._wait_for(i, stamp, start, bad, seen, theirs)
        if bad >= 0:
            give_up_on(self, bad, stamp, seen, theirs)
        tl.debug_barrier()
        self.ctx.tracing.record_event_end(event)


# not inlined: one copy of the give-up path per kernel, called from every wait, instead of one per
# wait site and member (at G = 8 a ring's kernel was three times its size, and as slow to compile)
@triton.jit(noinline=True)
def give_up_on(g, member, stamp, seen, theirs):
    """Fails `g`'s call because of `member`, whose flag read `seen` and signature `theirs`: a
    timeout, a member that gave up earlier (PeerFailedError, or RankMismatchError when a member's
    call in this epoch differs from mine), or a member that made another call."""
    code = tl.where(flags.timed_out(seen), TIMEOUT, tl.where(flags.poisoned(seen), PEER_FAILED, MISMATCH))
    rank = g.rank(member)
    theirs = tl.where(code == TIMEOUT, 0, theirs)
    if code == PEER_FAILED:  # a member that saw calls differ in this epoch: my call may be one of them
        culprit, other = g.differing(stamp)
        code = tl.where(culprit >= 0, MISMATCH, code)
        rank = tl.where(culprit >= 0, culprit, rank)
        theirs = tl.where(culprit >= 0, other, theirs)
    g.fail(code, rank, stamp, theirs)
