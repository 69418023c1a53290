"""Device side of event tracing: `ctx.tracing.record_event_start / record_event_end`.

    ctx = Context.initialize(context_ptr, W, tracing=TRACING)
    h = ctx.tracing.record_event_start(EVENT_TRANSFER, peer, ptrs, pid_m, pid_n, mask=mask)
    ...                                          # the traced work
    ctx.tracing.record_event_end(h)

With `tracing=True`, every Context RMA op (load, store, get, put, copy, atomics) records
its own event as well. With `tracing=False` (the default) every record call compiles to
nothing: the kernel is the same as without tracing.

Event ids (constexprs below; names and host side in `iris_core.tracing.events`):
RMA ops EVENT_LOAD .. EVENT_ATOMIC_CAS (recorded automatically); collective phases
EVENT_WAIT (waiting on peers' flags), EVENT_TRANSFER (moving data between ranks),
EVENT_REDUCE (combining), EVENT_BARRIER (a device barrier), recorded by the kernels that
run them; kernels' own events from EVENT_USER up.

Where events go: the context's tracing words (see `iris_core.heap.context_layout`):
[trace_enabled, max_events, counter, op_index counter, 13 per-event buffers]. The last
15 are byte offsets into the recording rank's own heap (every rank has its trace area at
the same offset), so the words are the same in every process and for every rank; the
device adds its heap base. The words are zero when tracing is off at run time: a kernel
compiled with tracing=True then checks `trace_enabled` and records nothing.

An event: slot = atomic_add(counter, 1); when slot < max_events the fields are stored in
each buffer at index slot (int64 each): event id, program id, pid_m, pid_n, my rank,
target rank, SM id, start timestamp (ns), address (lowest of the block), duration (-1
until record_event_end), op index (atomic_add(op_index counter, 1)), payload bytes.
Beyond max_events nothing is written; the counter keeps counting, so the host reports
how many events were dropped. Timestamps: %globaltimer and %smid on NVIDIA; the host
clock and the program id under the simulator (see `nvidia`).
"""

import triton
import triton.language as tl

from iris_core.compat import aggregate
from iris_core.device.intrinsics import global_timer, sm_id
from iris_core.heap.context_layout import TRACE_FIELDS
from iris_core.tracing import events

EVENT_LOAD = tl.constexpr(events.LOAD)
EVENT_STORE = tl.constexpr(events.STORE)
EVENT_GET = tl.constexpr(events.GET)
EVENT_PUT = tl.constexpr(events.PUT)
EVENT_COPY = tl.constexpr(events.COPY)
EVENT_ATOMIC_ADD = tl.constexpr(events.ATOMIC_ADD)
EVENT_ATOMIC_SUB = tl.constexpr(events.ATOMIC_SUB)
EVENT_ATOMIC_XCHG = tl.constexpr(events.ATOMIC_XCHG)
EVENT_ATOMIC_XOR = tl.constexpr(events.ATOMIC_XOR)
EVENT_ATOMIC_AND = tl.constexpr(events.ATOMIC_AND)
EVENT_ATOMIC_OR = tl.constexpr(events.ATOMIC_OR)
EVENT_ATOMIC_MIN = tl.constexpr(events.ATOMIC_MIN)
EVENT_ATOMIC_MAX = tl.constexpr(events.ATOMIC_MAX)
EVENT_ATOMIC_CAS = tl.constexpr(events.ATOMIC_CAS)
EVENT_WAIT = tl.constexpr(events.WAIT)
EVENT_TRANSFER = tl.constexpr(events.TRANSFER)
EVENT_REDUCE = tl.constexpr(events.REDUCE)
EVENT_BARRIER = tl.constexpr(events.BARRIER)
EVENT_USER = tl.constexpr(events.USER)

# word indices inside the tracing words
_ENABLED = tl.constexpr(0)
_MAX_EVENTS = tl.constexpr(1)
_COUNTER = tl.constexpr(2)
_OP_INDEX = tl.constexpr(3)
_BUFFERS = 4
(_EVENT_ID, _PID, _PID_M, _PID_N, _CUR_RANK, _TARGET_RANK, _SM_ID, _TIMESTAMP, _ADDRESS, _DURATION,
 _OP, _PAYLOAD) = (tl.constexpr(_BUFFERS + TRACE_FIELDS.index(name)) for name in (
    "event_id", "pid", "pid_m", "pid_n", "cur_rank", "target_rank", "sm_id", "timestamp", "address",
    "duration", "op_index", "payload_size"))
NO_EVENT = tl.constexpr(-1)  # the handle of an event that was not recorded


@triton.constexpr_function
def _numel(shape):
    n = 1
    for s in shape:
        n *= int(getattr(s, "value", s))
    return n


@triton.constexpr_function
def _rank_of(shape):
    return len(shape)


@triton.constexpr_function
def _element_bytes(pointer_type):
    return max(pointer_type.element_ty.primitive_bitwidth // 8, 1)


@triton.jit
def _slot(words, base, WORD: tl.constexpr):
    """The int64 buffer (or counter) whose heap offset is tracing word WORD."""
    return tl.cast(base + tl.load(words + WORD), tl.pointer_type(tl.int64))


@triton.jit
def _put(words, base, WORD: tl.constexpr, index, value):
    tl.store(_slot(words, base, WORD) + index, tl.cast(value, tl.int64))


@triton.jit
def _address_and_payload(address, mask):
    """(lowest address of the block, bytes it covers: masked-in elements x element size)."""
    if address is None:
        lowest = tl.full((), 0, tl.int64)
        payload = tl.full((), 0, tl.int64)
    elif _rank_of(address.shape) == 0:
        ELEMENT: tl.constexpr = _element_bytes(address.dtype)
        lowest = tl.cast(address, tl.int64)
        if mask is None:
            payload = tl.full((), ELEMENT, tl.int64)
        else:
            payload = tl.cast(mask, tl.int64) * ELEMENT
    else:
        ELEMENT: tl.constexpr = _element_bytes(address.dtype)
        lowest = tl.min(tl.cast(address, tl.int64))
        if mask is None:
            payload = tl.full((), _numel(address.shape) * ELEMENT, tl.int64)
        else:
            payload = tl.sum(tl.cast(tl.broadcast_to(mask, address.shape), tl.int64)) * ELEMENT
    return lowest, payload


@triton.jit
def _record_start(words, rank, heap_bases, event_id, target_rank, address, pid_m, pid_n, mask):
    handle = tl.full((), NO_EVENT, tl.int64)
    if tl.load(words + _ENABLED) != 0:
        base = tl.load(heap_bases + rank)
        handle = tl.atomic_add(_slot(words, base, _COUNTER), 1, sem="relaxed", scope="gpu")
        op_index = tl.atomic_add(_slot(words, base, _OP_INDEX), 1, sem="relaxed", scope="gpu")
        if handle < tl.load(words + _MAX_EVENTS).to(tl.int64):
            lowest, payload = _address_and_payload(address, mask)
            _put(words, base, _EVENT_ID, handle, event_id)
            _put(words, base, _PID, handle, tl.program_id(0))
            _put(words, base, _PID_M, handle, pid_m)
            _put(words, base, _PID_N, handle, pid_n)
            _put(words, base, _CUR_RANK, handle, rank)
            _put(words, base, _TARGET_RANK, handle, target_rank)
            _put(words, base, _SM_ID, handle, sm_id())
            _put(words, base, _ADDRESS, handle, lowest)
            _put(words, base, _DURATION, handle, -1)
            _put(words, base, _OP, handle, op_index)
            _put(words, base, _PAYLOAD, handle, payload)
            _put(words, base, _TIMESTAMP, handle, global_timer())  # last: the event starts now
    return handle


@triton.jit
def _record_end(words, rank, heap_bases, handle):
    now = global_timer()
    if (handle >= 0) & (handle < tl.load(words + _MAX_EVENTS).to(tl.int64)):
        base = tl.load(heap_bases + rank)
        start = tl.load(_slot(words, base, _TIMESTAMP) + handle)
        _put(words, base, _DURATION, handle, now - start)


@aggregate
class DeviceTracing:
    """The device side of event tracing (`ctx.tracing`): records events into the trace area.

    Built by `Context.initialize`; with `enabled` false (a constexpr) every method compiles to
    nothing. The host side is `iris_jax.tracing`.

    Attributes:
      enabled: whether the kernel records (a constexpr).
      words: uint64 pointer to the context's tracing words.
      rank: this device's rank.
      heap_bases: pointer to the W heap bases.
    """

    enabled: tl.constexpr
    words: tl.tensor  # uint64 pointer to the context's tracing words
    rank: tl.tensor
    heap_bases: tl.tensor

    @triton.constexpr_function
    def __init__(self, enabled, words, rank, heap_bases):
        self.enabled = tl.constexpr(enabled)
        self.words = words
        self.rank = rank
        self.heap_bases = heap_bases

    @triton.jit
    def record_event_start(self, event_id, target_rank, address, pid_m=None, pid_n=None, mask=None):
        """Records the start of an event; returns the handle for record_event_end.

        Args:
          event_id: an EVENT_* id (or EVENT_USER + k for a kernel's own events).
          target_rank: the peer the operation involves (my rank for local work).
          address: a pointer or block of pointers (the lowest is recorded; with `mask`
            the payload counts the masked-in elements, else all of them), or None
            (address and payload 0: a phase with no memory of its own).
          pid_m: the tile's row coordinate (default: program id 0).
          pid_n: the tile's column coordinate (default: program id 1).
          mask: the lanes of `address` that take part (None: all).

        Returns:
          The handle for record_event_end; NO_EVENT (-1) when nothing was recorded (tracing
          off at run time).
        """
        if self.enabled:
            if pid_m is None:
                pid_m = tl.program_id(0)
            if pid_n is None:
                pid_n = tl.program_id(1)
            return _record_start(self.words, self.rank, self.heap_bases, event_id, target_rank, address,
                                 pid_m, pid_n, mask)
        else:
            return NO_EVENT

    @triton.jit
    def record_event_end(self, handle):
        """Stores the duration (ns) of the event started with record_event_start."""
        if self.enabled:
            _record_end(self.words, self.rank, self.heap_bases, handle)
