"""What a kernel that gives up leaves behind: the fault page, its records, call signatures.

Every GPU rank has a fault page: pinned host memory mapped into the device (the heap's
`fault_page`), whose address the context carries (iris_core.heap.context_layout). A kernel
that gives up (a peer that never arrived, a peer that gave up before, a peer whose call
differs) writes a record into its program's slot there, then stops (iris_core.device.faults).
The host reads the page without the CUDA driver, so it learns what happened even when the
kernel trapped and took the CUDA context with it (iris_jax._runtime.faults: the watchdog).

Page layout, int64 words:

    word 0                  the mode: TRAP (0) or EXIT (1), written by the host
    word STATUS_COPY        where the host copies the heap's status word (refused accesses) to
    SLOTS_AT + p * SLOT     program p's record (p modulo SLOTS):
                            [code, what, peer, epoch, group, mine, theirs, time_ns]

`code` is written last (after a system fence): a record whose code is 0 is empty. `what`
names the op (`what_id` of its name), `peer` the rank waited for, `epoch` the group's flag
epoch (its count of chunks), `group` the heap offset of the group's workspace (-1: none),
`mine` and `theirs` the call signatures that differed (MISMATCH) or 0.

A signature (`signature`) packs what must agree between the members of a call: the kernel
kind, the op, the algorithm, the dtype, the input blocks and the column count. A member
writes its signature next to its flag before it raises it; a member that reads a different
one fails both calls with RankMismatchError instead of pairing them.
"""

from __future__ import annotations

import dataclasses

import triton

from iris_core.collectives.kinds import FUSED_KINDS, KIND_NAMES, OP_NAMES, VARIANT_NAMES
from iris_core.errors import PeerFailedError, PeerTimeoutError, RankMismatchError

TRAP, EXIT = 0, 1  # what a kernel does after writing its record: trap (the CUDA context is lost) or exit
MODES = {"trap": TRAP, "exit": EXIT}
STATUS_COPY = 1
SLOTS_AT = 8
SLOT = 8
SLOTS = 256
PAGE_BYTES = 8 * (SLOTS_AT + SLOTS * SLOT)
FIELDS = ("code", "what", "peer", "epoch", "group", "mine", "theirs", "time_ns")

TIMEOUT, PEER_FAILED, MISMATCH = 1, 2, 3
ERRORS = {TIMEOUT: PeerTimeoutError, PEER_FAILED: PeerFailedError, MISMATCH: RankMismatchError}

# signatures: bits 0-31 the column count, 32-39 input blocks, 40-44 dtype, 45-49 kind, 50-53 op,
# 54-57 algorithm, 58 always set (a written signature is never 0)
DTYPES = ("fp32", "bf16", "fp16", "fp64", "int32", "int64", "int16", "int8", "uint8", "uint16", "uint32",
          "uint64", "fp8e4nv", "fp8e5", "int1")
_NUMPY_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64", "int1": "bool",
                "fp8e4nv": "float8_e4m3fn", "fp8e5": "float8_e5m2"}
SIGNED = 1 << 58
# the tile-level collectives' flag words (iris_core.device.tile_collectives: int32 locks): bit 30 set
# (a signed word is never 0 or 1 and stays below TILE_POISON), bits 28-29 the collective, 23-27 the
# dtype, 0-22 a hash of the tile's blocks and the view's shape
TILE_SIGNED = 1 << 30
TILE_KINDS = ("all_reduce_one_shot", "all_reduce_two_shot", "reduce_scatter")
TILE_SHAPE_MASK = (1 << 23) - 1
TILE_POISON = (1 << 31) - 2  # a tile flag whose writer gave up (the largest int32 marks a wait that timed out)

_names: dict[int, str] = {}  # what_id -> name, of every op this process launched
_kernels: dict[int, str] = {}  # what_id -> the kernel that last ran the op
_partitions: dict[int, tuple] = {}  # workspace heap offset -> the partition of the ranks (groups) it serves
_shapes: dict[int, str] = {}  # shape_field -> the shapes it stands for, of every call this process launched


@triton.constexpr_function  # called by device code too, at compile time
def fnv1a(text: str) -> int:
    """A 32-bit hash of `text`, equal in every process (FNV-1a; Triton's compile-time code calls no
    library function)."""
    h = 2166136261
    for byte in text.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFF_FFFF
    return h


@triton.constexpr_function  # called by device code too, at compile time
def what_id(name: str) -> int:
    """The record's number for an op's name (stable across processes: 31 bits of fnv1a)."""
    return fnv1a(name) & 0x7FFF_FFFF


def named(name: str, kernel: str | None = None) -> str:
    """Registers `name` (a kernel's WHAT; run by `kernel`) so that its records can be read; returns it."""
    _names[what_id(name)] = name
    if kernel:
        _kernels[what_id(name)] = kernel
    return name


def name_workspace(offset: int, partition) -> None:
    """Registers the partition of the ranks (a tuple of rank tuples) whose groups' workspace sits
    at heap `offset`."""
    _partitions[offset] = tuple(tuple(g) for g in partition)


@triton.constexpr_function
def signature_head(kind: int, op: int, variant: int, dtype, blocks: int) -> int:
    """Everything of a signature but the column count (a compile-time constant); `dtype` a
    Triton dtype or its name."""
    dtype = getattr(dtype, "name", dtype)
    code = len(DTYPES)
    for i in range(len(DTYPES)):  # no tuple methods: Triton refuses them in compile-time code
        if DTYPES[i] == dtype:
            code = i
    return (SIGNED | (variant & 15) << 54 | (op & 15) << 50 | (kind & 31) << 45 | (code & 31) << 40
            | (blocks & 255) << 32)


@triton.constexpr_function  # called by device code, at compile time
def tile_signature_head(kind: int, dtype) -> int:
    """A tile flag word's collective and dtype (TILE_SIGNED; the shape hash is added at run time)."""
    code = (signature_head(0, 0, 0, dtype, 0) >> 40) & 31
    return TILE_SIGNED | (kind & 3) << 28 | code << 23


@triton.constexpr_function  # called by device code, at compile time
def tile_blocks_hash(block_m: int, block_n: int) -> int:
    """The seed of a tile flag word's shape hash: the tile's blocks."""
    return fnv1a(f"{block_m} x {block_n}")


def describe_tile_signature(word: int) -> str:
    """A tile flag word as a call, e.g. `tile all_reduce_one_shot of float32 (blocks and shape #1a2b3c)`."""
    kind, dtype = (word >> 28) & 3, DTYPES[(word >> 23) & 31] if (word >> 23) & 31 < len(DTYPES) else "?"
    name = TILE_KINDS[kind] if kind < len(TILE_KINDS) else f"#{kind}"
    return f"tile {name} of {_NUMPY_NAMES.get(dtype, dtype)} (blocks and shape #{word & TILE_SHAPE_MASK:06x})"


def signature(kind: int, op: int, variant: int, dtype: str, blocks: int, columns: int) -> int:
    return signature_head(kind, op, variant, dtype, blocks) | (columns & 0xFFFF_FFFF)


@triton.constexpr_function  # called by device code too, at compile time
def shape_field(shapes: str) -> int:
    """A signature's column field for shapes that do not fit it (the fused ops' M, N and K): a
    hash of their text, which `describe_signature` shows as the text where this process made such
    a call (a call it never made shows as the hash)."""
    field = fnv1a(shapes)
    _shapes[field] = shapes
    return field


@triton.constexpr_function  # called by device code too, at compile time
def matmul_shapes(M: int, N: int, K: int) -> int:
    """The signature field of a fused op's shapes, A [M x K] @ B [K x N] (shape_field)."""
    return shape_field(f"[{M} x {K}] @ [{K} x {N}]")


def describe_signature(sig: int) -> str:
    """A signature as a call, e.g. `all_reduce(sum, one_shot) of float32[1, 64]`."""
    if 0 < sig < (1 << 31) and sig & TILE_SIGNED:
        return describe_tile_signature(sig)
    if not sig & SIGNED:
        return f"an unsigned call (0x{sig:x})"

    def name(table, i):
        return table[i] if i < len(table) else f"#{i}"

    kind, op, variant = (sig >> 45) & 31, (sig >> 50) & 15, (sig >> 54) & 15
    dtype = name(DTYPES, (sig >> 40) & 31)
    shape = f"{_NUMPY_NAMES.get(dtype, dtype)}[{(sig >> 32) & 255}, {sig & 0xFFFF_FFFF}]"
    if kind in FUSED_KINDS:
        columns = sig & 0xFFFF_FFFF
        return f"{name(KIND_NAMES, kind)} of {_NUMPY_NAMES.get(dtype, dtype)} {_shapes.get(columns, f'#{columns:08x}')}"
    if name(KIND_NAMES, kind) == "all_reduce":
        return f"all_reduce({name(OP_NAMES, op)}, {name(VARIANT_NAMES, variant)}) of {shape}"
    if name(KIND_NAMES, kind) == "reduce_scatter":
        return f"reduce_scatter({name(OP_NAMES, op)}) of {shape}"
    return f"{name(KIND_NAMES, kind)} of {shape}"


@dataclasses.dataclass(frozen=True)
class Record:
    """One slot of a fault page, read on the host."""
    code: int
    what: int
    peer: int
    epoch: int
    group: int
    mine: int
    theirs: int
    time_ns: int

    def error(self, rank: int, timeout_s: float | None = None) -> Exception:
        """The error this record stands for, raised on `rank`."""
        name = _names.get(self.what, f"op #{self.what}")
        return ERRORS.get(self.code, PeerTimeoutError)(
            message(self.code, name, rank, self.peer, self.epoch, self.group, self.mine, self.theirs, timeout_s))


def read_records(words) -> list[Record]:
    """The records of a fault page (a sequence of int64 words), oldest first."""
    records = []
    for p in range(SLOTS):
        slot = [int(w) for w in words[SLOTS_AT + p * SLOT:SLOTS_AT + (p + 1) * SLOT]]
        if slot[0]:
            records.append(Record(*slot))
    return sorted(records, key=lambda r: r.time_ns)


def has_records(words) -> bool:
    """Whether a fault page (an int64 array) holds a record: a record's first word, its code, is
    written last."""
    return bool(words[SLOTS_AT::SLOT].any())


def clear_records(words) -> None:
    """Empties every slot of a fault page (a writable int64 array)."""
    for p in range(SLOTS):
        words[SLOTS_AT + p * SLOT] = 0


def _where(what: str, rank: int, epoch: int, group: int) -> str:
    parts = [f"on rank {rank}"]
    if what_id(what) in _kernels:
        parts.append(f"kernel {_kernels[what_id(what)]}")
    members = next((g for g in _partitions.get(group, ()) if rank in g), None)
    if members is not None:
        parts.append(f"group of ranks {list(members)}")
    elif group >= 0:
        parts.append(f"group workspace at heap offset {group}")
    parts.append(f"flag epoch {epoch}")
    return f" ({', '.join(parts)})"


def message(code: int, what: str, rank: int, peer: int, epoch: int, group: int, mine: int = 0, theirs: int = 0,
            timeout_s: float | None = None) -> str:
    """What a fault says, the same on GPUs (from a record) and on the simulator (raised in the
    kernel): the op, the rank that failed, the peer, the group and the flag epoch."""
    where = _where(what, rank, epoch, group)
    if code == MISMATCH:
        return (f"iris {what}: rank {peer} made a different call than rank {rank}: rank {rank} called "
                f"{describe_signature(mine)}, rank {peer} {describe_signature(theirs)}{where}. The members of a "
                "group must make the same collectives in the same order with the same shapes (a rank-dependent "
                "branch with a different collective in each arm does not pair). Both calls failed, nothing was "
                "exchanged, and the group's later calls fail too: start again (iris_jax.shutdown() then init()).")
    if code == PEER_FAILED:
        return (f"iris {what}: rank {peer} gave up on an earlier collective of this group (a timeout or a "
                f"mismatch){where}, so the group's flags no longer agree and no later collective of it can be "
                "trusted. Start again: iris_jax.shutdown() then init() (GPUs with on_fault='exit', and the "
                "simulator), or new processes")
    after = f" after {timeout_s:g} s" if timeout_s else ""
    return f"iris {what}: timed out{after} waiting for rank {peer} (it never arrived){where}"
