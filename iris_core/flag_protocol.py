"""The flag protocol between ranks, as host code sees it (no Triton here).

Every kernel that waits on a peer speaks one protocol, whose device side is
iris_core.device.flags.Flags: the collectives (a group's flags), the streamed path (per-tile
delivery counts), the fused GEMM ops (int32 epochs per program), the device barrier (one slot
per rank) and the tile-level collectives (ready flags and locks). This module holds what
workspace layouts, configuration, launchers and tests need to know of it.

* Lines: every flag and every epoch word sits on a line of its own (LINE_BYTES), so no two
  writers share a cache line.
* Stamps: a flag only grows. A writer raises it to a stamp with a releasing atomic max (or
  exchange, for a flag one writer owns) after its data; a reader spins on acquiring reads
  until the flag reaches the stamp it waits for. Nothing is reset between calls.
* Epochs: a program counts its calls in a word of its own heap. A group call's stamps are
  epoch * STEPS + round (device code: flags.stamp, flags.epoch_of), STEPS rounds per epoch
  (the last, DONE, ends a zero-copy call), so an algorithm has at most STEPS - 1 rounds per
  chunk: a ring's 2G - 1 bound its group size (RING_MAX_MEMBERS). A streamed tile's stamp is
  its delivery count instead; the fused ops' is the epoch itself.
* Poison: a program that gives up raises its flags on every member to POISON + the stamp it
  waited for. POISON lies above every stamp, so a later wait on such a flag passes at once,
  and the waiter fails (PeerFailedError) rather than trust a flag of a lost call. The
  streamed region's `failed` word (`failed_word`) says the same to the next streamed call.
* Timeouts: every wait ends `timeout_ns(timeout_s)` after it started; then the program gives
  up (iris_core.device.faults: a fault record naming the op and the rank) or, for the device
  barrier, reports the missing rank.
"""

LINE_BYTES = 128
POISON = 1 << 62
STEPS = 64  # flag rounds per epoch of a group call
DONE = STEPS - 1  # the last round of a call's last epoch: zero-copy readers are done
RING_MAX_MEMBERS = STEPS // 2  # a ring all-reduce takes 2G - 1 rounds per chunk
DEFAULT_TIMEOUT_S = 60.0  # how long a kernel waits for a peer unless told otherwise
assert STEPS >= 3, "two-shot and atomic take rounds 0 and 1 of an epoch, and DONE is its last"

# the streamed region's `failed` word: 1 + the member index of the rank that gave up, its
# fault code and the streamed call it gave up in, in fields of these widths
FAILED_MEMBER_BITS = 12
FAILED_CODE_BITS = 4
FAILED_CALL_SHIFT = FAILED_MEMBER_BITS + FAILED_CODE_BITS


def timeout_ns(timeout_s: float) -> int:
    """A kernel's TIMEOUT_NS for a wait of `timeout_s` seconds."""
    return int(timeout_s * 1e9)


def failed_word(member: int, code: int, call: int) -> int:
    """The streamed region's `failed` word after member `member` gave up in call `call`."""
    return (member + 1) | (code << FAILED_MEMBER_BITS) | (call << FAILED_CALL_SHIFT)


def parse_failed_word(word: int) -> tuple[int, int, int]:
    """(member, code, call) of a `failed` word that is not 0."""
    return ((word & ((1 << FAILED_MEMBER_BITS) - 1)) - 1, (word >> FAILED_MEMBER_BITS) & ((1 << FAILED_CODE_BITS) - 1),
            word >> FAILED_CALL_SHIFT)
