"""The status line: the first 256 bytes of every heap, where kernels report refused accesses.

Every translated access is checked on the device (iris_core.device.rma): a pointer outside
the caller's heap, or a rank outside [0, world_size), is masked off and reported in the
caller's status word (heap offset STATUS_OFFSET) as one int64:

    bit 62      set: an error is recorded
    bits 56-61  the op (index into OPS)
    bit 55      0: the pointer was outside the heap; 1: a rank was out of range
    bits 40-54  the target rank, or the bad rank (signed, 15 bits)
    bits 0-39   the pointer's byte offset from the caller's heap base (signed, 40 bits:
                exact within +-512 GiB of the base)

Lanes write with plain stores, so when several fail one of them is kept. An access that
cannot be masked (a compare-and-swap, a pointer returned by `translate`) is redirected to
the target's SINK_OFFSET line instead, inside its heap. The host reads and clears the word
after the call (iris_jax.check_heap_errors) and raises NotOnHeapError.

The guard's bound is the int64 at BOUND_OFFSET of the caller's own heap: how many bytes of
every rank's heap are memory (`SymmetricHeap.mapped_size`), not the upper bound reserved for
growth, past which nothing is mapped. The host writes it into each heap it owns at init and
after each growth, once every process mapped the new bytes of every rank (iris_core.heap.
symmetric), so a kernel reads it current from memory, whenever it was compiled; a bound that
is one growth behind only refuses what was not there yet, it never lets a fault through.
"""

from __future__ import annotations

from iris_core.errors import NotOnHeapError

RESERVED_BYTES = 256  # offset 0 of every heap: never handed out by the allocator
STATUS_OFFSET = 0
BOUND_OFFSET = 64  # the guard's bound (the bytes mapped on every rank), an int64: see above
SINK_OFFSET = 128

OPS = ("translate", "load", "store", "get", "put", "copy", "atomic_add", "atomic_sub", "atomic_xchg",
       "atomic_xor", "atomic_and", "atomic_or", "atomic_min", "atomic_max", "atomic_cas")
OP_CODES = {name: i for i, name in enumerate(OPS)}

ERROR_BIT = 1 << 62
OP_SHIFT = 56
RANK_ERROR_BIT = 1 << 55
RANK_SHIFT = 40
RANK_BITS = 15
RANK_MASK = (1 << RANK_BITS) - 1
OFFSET_BITS = 40
OFFSET_MASK = (1 << OFFSET_BITS) - 1


def _signed(value: int, bits: int) -> int:
    return value - (1 << bits) if value >= 1 << (bits - 1) else value


def encode(op: str, rank: int, offset: int = 0, rank_error: bool = False) -> int:
    """The status word a kernel writes (see the module docstring)."""
    return (ERROR_BIT | OP_CODES[op] << OP_SHIFT | (RANK_ERROR_BIT if rank_error else 0)
            | (rank & RANK_MASK) << RANK_SHIFT | (offset & OFFSET_MASK))


def decode(word: int) -> dict | None:
    """{op, rank, offset, rank_error} of a status word; None when no error is recorded."""
    word &= (1 << 64) - 1
    if not word & ERROR_BIT:
        return None
    code = (word >> OP_SHIFT) & 63
    return {"op": OPS[code] if code < len(OPS) else f"op {code}",
            "rank": _signed((word >> RANK_SHIFT) & RANK_MASK, RANK_BITS),
            "offset": _signed(word & OFFSET_MASK, OFFSET_BITS),
            "rank_error": bool(word & RANK_ERROR_BIT)}


def describe(info: dict, rank: int, bound: int, kernel: str | None = None, upper: int | None = None) -> str:
    """The NotOnHeapError message for a decoded status word of `rank`, whose heap's guard
    bound (mapped bytes) was `bound` of an `upper` bound reserved for growth."""
    who = f"kernel {kernel}" if kernel else "an iris kernel"
    if info["rank_error"]:
        return (f"{who} on rank {rank}: {info['op']} with rank {info['rank']}, which is outside "
                "[0, world_size); nothing was accessed. Pass a rank of the world (ctx.rank, a group member).")
    offset = info["offset"]
    if offset < 0:
        where = "before the heap"
    elif offset < bound:
        where = f"at the heap's end ({bound} bytes mapped)"
    elif upper is None or upper <= bound:
        where = f"past the heap's end ({bound} bytes)"
    elif offset >= upper:
        where = f"past the heap's upper bound ({upper} bytes, of which {bound} are mapped)"
    else:
        where = (f"past the heap's {bound} mapped bytes (below its upper bound of {upper}: reserved for growth, "
                 "not memory)")
    return (f"{who} on rank {rank}: {info['op']} to rank {info['rank']} through a pointer at byte offset "
            f"{offset} from the caller's heap base, {where}; nothing was accessed. A pointer "
            "given to a remote op must point into the caller's symmetric heap: pass arrays made by iris_jax "
            "(zeros, to_heap, ...) straight into the jitted function, and keep offsets inside them.")


def error_from_word(word: int, rank: int, bound: int, kernel: str | None = None,
                    upper: int | None = None) -> NotOnHeapError | None:
    info = decode(word)
    return None if info is None else NotOnHeapError(describe(info, rank, bound, kernel, upper))
