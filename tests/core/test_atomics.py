"""Remote atomics between simulated ranks: returned old values and final memory.

Each rank applies every atomic twice to both neighbours' heaps, once per (sem, scope)
combination, on slots no other rank touches, so old values are deterministic; the
hammer tests then make every rank and program hit one counter at once.
"""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.device import Context
from iris_core.sim import get_world, launch

BLOCK = 64
N = 37
OPS = ["add", "sub", "xchg", "xor", "and", "or", "min", "max", "cas"]
# Integer-only in Triton; xchg too under Triton 3.6's interpreter ("Unsupported data type"
# for float32, though GPUs have it).
INT_ONLY = {"xchg", "xor", "and", "or"}
# (sem, scope, hint); sem None: the Context defaults (acq_rel, sys), arguments left out.
# int32 runs every combination, the other dtypes a few (the interpreter is slow).
ALL_COMBOS = [(None, None, None)] + [
    (sem, scope, hint)
    for sem in ("relaxed", "acquire", "release", "acq_rel")
    for scope, hint in (("gpu", None), ("sys", 16), ("cta", (16,)))
]
SOME_COMBOS = [(None, None, None), ("relaxed", "gpu", None), ("acq_rel", "sys", 16)]


def combos_for(dtype_name: str) -> list:
    return ALL_COMBOS if dtype_name == "int32" else SOME_COMBOS
DTYPES = {"int32": np.dtype(np.int32), "int64": np.dtype(np.int64), "uint32": np.dtype(np.uint32),
          "float32": np.dtype(np.float32)}
POISON = {"int32": -123456789, "int64": -(1 << 60) + 5, "uint32": 0xDEADBEEF, "float32": np.nan}


@triton.jit
def _atomic(ctx, OP: tl.constexpr, ptr, val, cmp, peer, mask, SEM: tl.constexpr, SCOPE: tl.constexpr,
            HINT: tl.constexpr, DEFAULTS: tl.constexpr):
    if DEFAULTS:
        if OP == 0:
            old = ctx.atomic_add(ptr, val, peer, mask=mask)
        elif OP == 1:
            old = ctx.atomic_sub(ptr, val, peer, mask=mask)
        elif OP == 2:
            old = ctx.atomic_xchg(ptr, val, peer, mask=mask)
        elif OP == 3:
            old = ctx.atomic_xor(ptr, val, peer, mask=mask)
        elif OP == 4:
            old = ctx.atomic_and(ptr, val, peer, mask=mask)
        elif OP == 5:
            old = ctx.atomic_or(ptr, val, peer, mask=mask)
        elif OP == 6:
            old = ctx.atomic_min(ptr, val, peer, mask=mask)
        elif OP == 7:
            old = ctx.atomic_max(ptr, val, peer, mask=mask)
        else:
            old = ctx.atomic_cas(ptr, cmp, val, peer)
    else:
        if OP == 0:
            old = ctx.atomic_add(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 1:
            old = ctx.atomic_sub(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 2:
            old = ctx.atomic_xchg(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 3:
            old = ctx.atomic_xor(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 4:
            old = ctx.atomic_and(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 5:
            old = ctx.atomic_or(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 6:
            old = ctx.atomic_min(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        elif OP == 7:
            old = ctx.atomic_max(ptr, val, peer, mask=mask, sem=SEM, scope=SCOPE, hint=HINT)
        else:
            old = ctx.atomic_cas(ptr, cmp, val, peer, sem=SEM, scope=SCOPE, hint=HINT)
    return old


@triton.jit
def _twice(ctx, OP: tl.constexpr, target_ptr, old_ptr, val_ptr, cmp_ptr, peer, n, BLOCK: tl.constexpr,
           SEM: tl.constexpr, SCOPE: tl.constexpr, HINT: tl.constexpr, DEFAULTS: tl.constexpr):
    """Applies op OP with the first then the second value; cas compares with cmp, then with
    the first value (so it succeeds exactly where the first one did)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    if OP == 8:
        mask = offs < BLOCK  # atomic_cas has no mask: every lane is live
    v1 = tl.load(val_ptr + offs)
    v2 = tl.load(val_ptr + BLOCK + offs)
    old1 = _atomic(ctx, OP, target_ptr + offs, v1, tl.load(cmp_ptr + offs), peer, mask, SEM, SCOPE, HINT, DEFAULTS)
    tl.store(old_ptr + offs, old1, mask=mask)
    old2 = _atomic(ctx, OP, target_ptr + offs, v2, v1, peer, mask, SEM, SCOPE, HINT, DEFAULTS)
    tl.store(old_ptr + BLOCK + offs, old2, mask=mask)


@triton.jit
def atomics_kernel(context_ptr, target_ptr, old_ptr, val_ptr, cmp_ptr, n, W: tl.constexpr, BLOCK: tl.constexpr,
                   NUM_OPS: tl.constexpr, INT_OPS: tl.constexpr, SEM: tl.constexpr, SCOPE: tl.constexpr,
                   HINT: tl.constexpr, DEFAULTS: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    for d in tl.static_range(2):
        peer = (ctx.rank + 1 + d * (W - 2)) % W  # d == 0: next rank, d == 1: previous rank
        for op in tl.static_range(NUM_OPS):
            if INT_OPS or (op != 2 and op != 3 and op != 4 and op != 5):
                slot = d * NUM_OPS + op
                _twice(ctx, op, target_ptr + slot * BLOCK, old_ptr + slot * 2 * BLOCK, val_ptr,
                       cmp_ptr + d * BLOCK, peer, n, BLOCK, SEM, SCOPE, HINT, DEFAULTS)


def atomics_rank(state, session, offsets, dtype_name):
    heap = state.heap(session)
    dtype = DTYPES[dtype_name]
    rank = state.rank
    combos = combos_for(dtype_name)
    target = heap.host_view(rank, offsets["target"], (len(combos), 2, len(OPS), BLOCK), dtype)
    old = heap.host_view(rank, offsets["old"], (len(combos), 2, len(OPS), 2, BLOCK), dtype)
    val = heap.host_view(rank, offsets["val"], (2, BLOCK), dtype)
    cmp = heap.host_view(rank, offsets["cmp"], (len(combos), 2, BLOCK), dtype)
    for c, (sem, scope, hint) in enumerate(combos):
        launch(atomics_kernel, (1,), heap.context(rank), target[c], old[c], val, cmp[c], N, W=state.world_size,
               BLOCK=BLOCK, NUM_OPS=len(OPS), INT_OPS=dtype.kind in "iu", SEM=sem, SCOPE=scope, HINT=hint,
               DEFAULTS=sem is None)


def reference(op: str, memory: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Memory after one atomic (for cas, `value` is (cmp, val))."""
    if op == "add":
        return memory + value
    if op == "sub":
        return memory - value
    if op == "xchg":
        return value.copy()
    if op == "xor":
        return memory ^ value
    if op == "and":
        return memory & value
    if op == "or":
        return memory | value
    if op == "min":
        return np.minimum(memory, value)
    if op == "max":
        return np.maximum(memory, value)
    cmp, val = value
    return np.where(memory == cmp, val, memory)


def random_values(rng, dtype: np.dtype, shape) -> np.ndarray:
    if dtype.kind == "f":  # quarters: sums stay exact in float32
        return (rng.integers(-4000, 4000, shape) / 4).astype(dtype)
    if dtype.kind == "u":  # the high bit set half the time: min/max must compare unsigned
        return rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(dtype)
    values = rng.integers(-(1 << 20), 1 << 20, shape)
    if dtype.itemsize == 8:
        values = values * (1 << 32) + rng.integers(0, 1 << 32, shape)  # both words significant
    return values.astype(dtype)


def bits(array: np.ndarray) -> np.ndarray:
    array = np.ascontiguousarray(array)
    return array.view(f"u{array.dtype.itemsize}")


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_atomic_on_both_neighbours(sim_heap, world_size, dtype_name):
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(world_size * 10 + list(DTYPES).index(dtype_name))
    heap = sim_heap(world_size)
    combos = combos_for(dtype_name)
    C, D, K = len(combos), 2, len(OPS)
    shapes = {"target": (C, D, K, BLOCK), "old": (C, D, K, 2, BLOCK), "val": (2, BLOCK), "cmp": (C, D, BLOCK)}
    offsets = {k: heap.allocate(int(np.prod(s)) * dtype.itemsize) for k, s in shapes.items()}
    view = lambda r, k: heap.host_view(r, offsets[k], shapes[k], dtype)
    init = [random_values(rng, dtype, shapes["target"]) for _ in range(world_size)]
    vals = [random_values(rng, dtype, shapes["val"]) for _ in range(world_size)]
    even = np.arange(BLOCK) % 2 == 0
    for r in range(world_size):
        view(r, "target")[:] = init[r]
        view(r, "old")[:] = POISON[dtype_name]
        view(r, "val")[:] = vals[r]
        for d, peer in enumerate([(r + 1) % world_size, (r - 1) % world_size]):
            # cas: even lanes hold the peer's current value (swap), odd lanes do not (no swap)
            peer_cas = init[peer][:, d, OPS.index("cas")]
            view(r, "cmp")[:, d] = np.where(even, peer_cas, peer_cas + 1)

    get_world(world_size).run(atomics_rank, heap.session, offsets, dtype_name)

    lanes = np.arange(BLOCK) < N
    for q in range(world_size):
        for d, (peer, writer) in enumerate([((q + 1) % world_size, (q - 1) % world_size),
                                            ((q - 1) % world_size, (q + 1) % world_size)]):
            for k, op in enumerate(OPS):
                if dtype.kind == "f" and op in INT_ONLY:
                    continue
                live = np.ones(BLOCK, bool) if op == "cas" else lanes
                for c, combo in enumerate(combos):
                    where = f"rank {q}, atomic_{op} ({'next' if d == 0 else 'prev'} peer), {combo}, {dtype_name}"
                    # memory of this rank, updated by `writer`
                    v1, v2 = vals[writer]
                    first = (view(writer, "cmp")[c, d], v1) if op == "cas" else v1
                    second = (v1, v2) if op == "cas" else v2
                    mid = reference(op, init[q][c, d, k], first)
                    final = np.where(live, reference(op, mid, second), init[q][c, d, k])
                    np.testing.assert_array_equal(bits(view(q, "target")[c, d, k]), bits(final.astype(dtype)),
                                                  err_msg=f"memory: {where}")
                    # old values this rank got back from `peer`
                    v1, v2 = vals[q]
                    first = (view(q, "cmp")[c, d], v1) if op == "cas" else v1
                    start = init[peer][c, d, k]
                    expected_old = np.full((2, BLOCK), POISON[dtype_name], dtype)
                    expected_old[0, live] = start[live]
                    expected_old[1, live] = reference(op, start, first)[live]
                    np.testing.assert_array_equal(bits(view(q, "old")[c, d, k]), bits(expected_old),
                                                  err_msg=f"returned old values: {where}")


HAMMER_ITERS = 200
HAMMER_PROGRAMS = 4
MIXED_ITERS = 6
LANES = 32


@triton.jit
def hammer_kernel(context_ptr, counter_ptr, olds_ptr, W: tl.constexpr, ITERS: tl.constexpr):
    """Every program of every rank adds 1 to rank 0's counter ITERS times."""
    ctx = Context.initialize(context_ptr, W)
    pid = tl.program_id(0)
    for i in range(ITERS):
        # relaxed on even programs, the defaults (acq_rel, sys) on odd ones: both atomic
        if pid % 2 == 0:
            old = ctx.atomic_add(counter_ptr, 1, 0, sem="relaxed", scope="gpu")
        else:
            old = ctx.atomic_add(counter_ptr, 1, 0)
        tl.store(olds_ptr + pid * ITERS + i, old)


@triton.jit
def mixed_hammer_kernel(context_ptr, counters_ptr, W: tl.constexpr, ITERS: tl.constexpr, LANES: tl.constexpr):
    """Six atomics on rank 0's counters; every lane of each vector op hits the same word."""
    ctx = Context.initialize(context_ptr, W)
    pid = tl.program_id(0)
    lane = tl.arange(0, LANES)
    same = tl.zeros((LANES,), tl.int32)
    for i in range(ITERS):
        value = (ctx.rank * 7919 + pid * 1031 + i * 31 + lane * 4099) % 100003
        ctx.atomic_add(counters_ptr + same, 1, 0, sem="relaxed")
        ctx.atomic_xor(counters_ptr + 1 + same, value * 977, 0, sem="release")
        ctx.atomic_max(counters_ptr + 2 + same, value, 0, sem="acquire", scope="gpu")
        ctx.atomic_min(counters_ptr + 3 + same, value, 0, sem="acq_rel", scope="sys")
        ctx.atomic_or(counters_ptr + 4 + same, 1 << ((ctx.rank * 5 + pid * 3 + i + lane) % 31), 0)
        ctx.atomic_sub(counters_ptr + 5 + same, 2, 0, mask=lane % 3 != 0)


def hammer_rank(state, session, counter_off, olds_off, counters_off):
    heap = state.heap(session)
    rank, ctx = state.rank, heap.context(state.rank)
    olds = heap.host_view(rank, olds_off, (HAMMER_PROGRAMS, HAMMER_ITERS), np.int32)
    launch(hammer_kernel, (HAMMER_PROGRAMS,), ctx, heap.host_view(rank, counter_off, (1,), np.int32), olds,
           W=state.world_size, ITERS=HAMMER_ITERS)
    launch(mixed_hammer_kernel, (HAMMER_PROGRAMS,), ctx, heap.host_view(rank, counters_off, (6,), np.int32),
           W=state.world_size, ITERS=MIXED_ITERS, LANES=LANES)
    return olds.copy()


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_hammer_rank0_counters_from_every_rank_and_program(sim_heap, world_size):
    heap = sim_heap(world_size)
    counter_off, counters_off = heap.allocate(4), heap.allocate(6 * 4)
    olds_off = heap.allocate(HAMMER_PROGRAMS * HAMMER_ITERS * 4)
    initial = np.array([0, 0, -1, 1 << 30, 0, 0], np.int32)
    for r in range(world_size):
        heap.host_view(r, counter_off, (1,), np.int32)[:] = 0 if r == 0 else -5
        heap.host_view(r, counters_off, (6,), np.int32)[:] = initial if r == 0 else -5
        heap.host_view(r, olds_off, (HAMMER_PROGRAMS, HAMMER_ITERS), np.int32)[:] = -1

    olds = get_world(world_size).run(hammer_rank, heap.session, counter_off, olds_off, counters_off)

    total = world_size * HAMMER_PROGRAMS * HAMMER_ITERS
    assert total == world_size * 800
    assert heap.host_view(0, counter_off, (1,), np.int32)[0] == total
    # each atomic_add returned a distinct old value: together exactly 0 .. total-1
    np.testing.assert_array_equal(np.sort(np.concatenate([o.ravel() for o in olds])), np.arange(total))

    rank, pid, i, lane = np.meshgrid(np.arange(world_size), np.arange(HAMMER_PROGRAMS), np.arange(MIXED_ITERS),
                                     np.arange(LANES), indexing="ij")
    value = (rank * 7919 + pid * 1031 + i * 31 + lane * 4099) % 100003
    expected = np.array([
        value.size,
        np.bitwise_xor.reduce((value * 977).ravel()),
        value.max(),
        value.min(),
        np.bitwise_or.reduce((1 << ((rank * 5 + pid * 3 + i + lane) % 31)).ravel()),
        -2 * np.count_nonzero(lane % 3 != 0),
    ], np.int32)
    np.testing.assert_array_equal(heap.host_view(0, counters_off, (6,), np.int32), expected)
    for r in range(1, world_size):  # nothing landed on the other ranks' copies
        assert heap.host_view(r, counter_off, (1,), np.int32)[0] == -5
        np.testing.assert_array_equal(heap.host_view(r, counters_off, (6,), np.int32), np.full(6, -5))


LOCK_ITERS = 30


@triton.jit
def spinlock_kernel(context_ptr, lock_ptr, counter_ptr, W: tl.constexpr, ITERS: tl.constexpr):
    """A cas spinlock on rank 0 guards a plain (non-atomic) read-modify-write of its counter."""
    ctx = Context.initialize(context_ptr, W)
    for _ in range(ITERS):
        while ctx.atomic_cas(lock_ptr, 0, 1, 0, sem="acquire") != 0:
            pass
        count = ctx.load(counter_ptr, 0, volatile=True)
        ctx.store(counter_ptr, count + 1, 0)
        ctx.atomic_xchg(lock_ptr, 0, 0, sem="release")


def spinlock_rank(state, session, lock_off, counter_off):
    heap = state.heap(session)
    lock = heap.host_view(state.rank, lock_off, (1,), np.int32)
    counter = heap.host_view(state.rank, counter_off, (1,), np.int64)
    launch(spinlock_kernel, (HAMMER_PROGRAMS,), heap.context(state.rank), lock, counter, W=state.world_size,
           ITERS=LOCK_ITERS)


@pytest.mark.parametrize("world_size", [2, 4])
def test_cas_spinlock_serializes_plain_updates(sim_heap, world_size):
    heap = sim_heap(world_size)
    lock_off, counter_off = heap.allocate(4), heap.allocate(8)
    for r in range(world_size):
        heap.host_view(r, lock_off, (1,), np.int32)[:] = 0
        heap.host_view(r, counter_off, (1,), np.int64)[:] = 0

    get_world(world_size).run(spinlock_rank, heap.session, lock_off, counter_off, timeout_s=120)

    assert heap.host_view(0, counter_off, (1,), np.int64)[0] == world_size * HAMMER_PROGRAMS * LOCK_ITERS
    assert heap.host_view(0, lock_off, (1,), np.int32)[0] == 0
