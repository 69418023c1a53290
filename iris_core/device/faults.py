"""How a kernel gives up: it writes a fault record (iris_core.faults), then stops.

`fail` is the only way device code ends a kernel early. On GPUs it writes the record into
its program's slot of the rank's fault page (pinned host memory, whose address is the
context's last word), fences, and then exits or traps as the page's mode says (EXIT: the
launch completes, the CUDA context survives, and the host raises the named error from the
record; TRAP: the launch fails). A rank without a page (a kernel launched on a bare heap)
traps. On the simulator it raises the named error at once, with the same message.

`signature` packs a call's kind, op, algorithm, dtype, blocks and columns into the word the
members of a group compare (iris_core.collectives.group).
"""

import triton
import triton.language as tl

from iris_core import faults
from iris_core.compat import interpreting
from iris_core.heap.context_layout import TRACE_WORDS

TIMEOUT: tl.constexpr = tl.constexpr(faults.TIMEOUT)
PEER_FAILED: tl.constexpr = tl.constexpr(faults.PEER_FAILED)
MISMATCH: tl.constexpr = tl.constexpr(faults.MISMATCH)
_FAULT_WORD: tl.constexpr = tl.constexpr(TRACE_WORDS)  # the page's address: after the bases and the tracing words
_SLOTS_AT: tl.constexpr = tl.constexpr(faults.SLOTS_AT)
_SLOT: tl.constexpr = tl.constexpr(faults.SLOT)
_SLOTS: tl.constexpr = tl.constexpr(faults.SLOTS)
_EXIT: tl.constexpr = tl.constexpr(faults.EXIT)


def _plain(value):
    while isinstance(value, tl.constexpr):
        value = value.value
    return value


@triton.jit
def signature(KIND: tl.constexpr, OP: tl.constexpr, VARIANT: tl.constexpr, DTYPE: tl.constexpr, BLOCKS: tl.constexpr,
              columns):
    """The call's signature (iris_core.faults.signature): constants but for `columns`."""
    columns = tl.full((), 0, tl.int64) + columns  # (an int argument of 1 arrives as a constant)
    return tl.full((), faults.signature_head(KIND, OP, VARIANT, DTYPE, BLOCKS), tl.int64) | (columns & 0xFFFFFFFF)


if interpreting():

    def fail(ctx, CODE, WHAT, peer, epoch=0, group=-1, mine=0, theirs=0):
        from iris_core.sim import replay  # lazy: the simulator's modules load only when a kernel runs under it

        replay.host_only("a fault")
        code = int(_plain(CODE))
        raise faults.ERRORS[code](faults.message(code, str(_plain(WHAT)), int(ctx.rank), int(peer), int(epoch),
                                                 int(group), int(mine), int(theirs)))

else:
    from iris_core.device.intrinsics import fence_system, global_timer, load_from_host, stop, store_to_host

    @triton.jit
    def _program():
        return tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))

    @triton.jit
    def fail(ctx, CODE, WHAT: tl.constexpr, peer, epoch=0, group=-1, mine=0, theirs=0):
        """Records why this program gives up (CODE: a constant or a value; op, the peer, the flag
        epoch, the group's workspace offset, the signatures that differed), then stops (see the
        module docstring). Every thread that gets here writes the same record into its program's
        slot."""
        page = tl.load(ctx.heap_bases + ctx.world_size + _FAULT_WORD).to(tl.int64)
        leave = page < 0  # False, typed like the value read below
        if page != 0:
            slot = page + 8 * (_SLOTS_AT + (_program() % _SLOTS) * _SLOT)
            store_to_host(slot + 8, tl.full((), faults.what_id(WHAT), tl.int64))
            store_to_host(slot + 16, peer)
            store_to_host(slot + 24, epoch)
            store_to_host(slot + 32, group)
            store_to_host(slot + 40, mine)
            store_to_host(slot + 48, theirs)
            store_to_host(slot + 56, global_timer())
            fence_system()  # the fields before the code: the host reads a record once its code is set
            store_to_host(slot, tl.full((), 0, tl.int64) + CODE)
            fence_system()
            leave = load_from_host(page) == _EXIT
        stop(leave)
