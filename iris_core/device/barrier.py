"""The device barrier's kernel: every rank waits, on its device, until every rank reached it.

It uses a small area of every heap (`area_bytes`: W + 1 int64 slots, one cache line each):
slot p on my heap holds the last epoch rank p announced to me; slot W my own epoch. A call
bumps my epoch, signals it to every peer (release), then waits until every peer's slot on my
heap reached it (acquire): the flag protocol (iris_core.device.flags.Flags). Epochs only grow, so
back-to-back barriers need no reset and no host sync. The wait is bounded: past the timeout
(or at once, when a peer's slot is POISON: it gave up on an earlier barrier) the kernel stores
the missing rank (else -1) into its status output, poisons its own slot on every peer (their
later barriers then fail at once, naming this rank) and gives up as every iris kernel does
(iris_core.device.faults.fail: a fault record naming device_barrier and the rank, which fails
the program; the simulator raises). All barriers are the same call, so there is no signature to
compare. With TRACING, it records an EVENT_BARRIER span and its signalling atomics.

Launched by iris_jax.device_barrier (iris_jax/sync.py).
"""

import triton
import triton.language as tl

from iris_core import faults, flag_protocol
from iris_core.device import flags
from iris_core.device.context import Context
from iris_core.device.faults import PEER_FAILED, TIMEOUT, fail
from iris_core.device.intrinsics import global_timer
from iris_core.device.tracing import EVENT_BARRIER
from iris_core.launch import kernel_constants

SLOT_WORDS = flag_protocol.LINE_BYTES // 8  # int64 words per slot: one line each
SLOT = tl.constexpr(SLOT_WORDS)
_WHAT = tl.constexpr(faults.named("device_barrier"))  # what its fault records name


def area_bytes(world_size: int) -> int:
    """Bytes of the barrier's area on every heap."""
    return (world_size + 1) * SLOT_WORDS * 8


@triton.jit
def barrier_kernel(context_ptr, after_ptr, status_ptr, AREA_OFFSET: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                   W: tl.constexpr, TRACING: tl.constexpr = False):
    ctx = Context.initialize(context_ptr, W, tracing=TRACING)
    f = flags.Flags(ctx, TIMEOUT_NS, 0, _WHAT)
    base = tl.load(ctx.heap_bases + ctx.rank)
    slots = tl.cast(base + AREA_OFFSET, tl.pointer_type(tl.int64))
    event = ctx.tracing.record_event_start(EVENT_BARRIER, ctx.rank, slots + W * SLOT)
    epoch = flags.read_epoch(slots + W * SLOT) + 1
    flags.write_epoch(slots + W * SLOT, epoch)
    for peer in range(W):
        f.signal(slots + ctx.rank * SLOT, epoch, peer)
    start = global_timer()
    missing = tl.full((), -1, tl.int32)
    failed_before = False  # whether `missing` gave up on an earlier barrier (its slot is POISON)
    for peer in range(W):  # past the timeout, every later wait returns at once
        seen = f.wait(slots + peer * SLOT, epoch, start)
        wrong = (flags.timed_out(seen) | flags.poisoned(seen)) & (missing < 0)
        failed_before = tl.where(wrong, flags.poisoned(seen) & ~flags.timed_out(seen), failed_before)
        missing = tl.where(wrong, peer, missing)
    tl.store(status_ptr, missing)
    ctx.tracing.record_event_end(event)
    if missing >= 0:
        _give_up(f, slots, epoch, missing, failed_before, W)


@triton.jit(noinline=True)
def _give_up(f, slots, epoch, missing, failed_before, W: tl.constexpr):
    """Poisons my slot on every peer, then fails naming `missing` (faults.fail)."""
    for peer in range(W):
        f.poison(slots + f.ctx.rank * SLOT, peer, epoch)
    fail(f.ctx, tl.where(failed_before, PEER_FAILED, TIMEOUT), f.WHAT, missing, epoch)


def launch_constants(*, area_offset: int, timeout_ns: int, world: int, tracing: bool = False) -> dict:
    """barrier_kernel's constexprs: what iris_jax.device_barrier launches and
    benchmarks/kernel_ptx.py and the tests compile. `area_offset`: the heap offset of the
    barrier's slots (a line per rank and the epoch's)."""
    return kernel_constants(barrier_kernel, AREA_OFFSET=area_offset, TIMEOUT_NS=timeout_ns, W=world, TRACING=tracing)
