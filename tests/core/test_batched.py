"""Several ranks' launches of a kernel as one batched replay (iris_core.sim.batched): the same
results as each rank's own launch, each rank's error its own, and kernels without a batched form
left to per-rank launches."""

import pickle

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.errors import NotOnHeapError
from iris_core.sim import batched, get_world
from iris_core.sim.interpreter import Pointer, batched_form, pointer_to, run_batched, run_kernel, run_kernel_batch
from iris_jax import Context


@triton.jit
def _tiles(x_ptr, y_ptr, out_ptr, pairs_ptr, counter_ptr, n, scale, R: tl.constexpr, C: tl.constexpr):
    # (`n`, an int, is an input of the recorded program; `scale`, a float, a value in it)
    """2-D tiles through the shape operations, a dot, a partial mask, the program id and an atomic."""
    pid = tl.program_id(0)
    rows = tl.arange(0, R)[:, None]
    cols = tl.arange(0, C)[None, :]
    offs = pid * R * C + rows * C + cols
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=-1.0)  # the last program's tile runs past n
    y = tl.load(y_ptr + tl.arange(0, C)[:, None] * R + tl.arange(0, R)[None, :])  # (C, R)
    mixed = tl.dot(x, y) + tl.trans(x + pid.to(tl.float32))  # (R, R): R == C
    flat = tl.reshape(mixed, (R * C,))
    tl.store(out_ptr + pid * R * C + tl.arange(0, R * C), flat * scale)
    even, odd = tl.split(tl.reshape(x, (R, C // 2, 2)))
    swapped = tl.reshape(tl.join(odd, even), (R, C))
    tl.store(pairs_ptr + offs, tl.where(swapped > 0, swapped, 0.0), mask=mask)
    tl.atomic_add(counter_ptr + tl.arange(0, 2), tl.full((2,), 1, tl.int32) + pid)


@triton.jit
def _reduce(x_ptr, out_ptr, BLOCK: tl.constexpr):
    tl.store(out_ptr, tl.sum(tl.load(x_ptr + tl.arange(0, BLOCK))))  # a reduction: numpy, not the builder


@triton.jit
def _put_next(context_ptr, x_ptr, out_ptr, shift, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    ctx.store(x_ptr + shift + offs, x, to_rank=(ctx.rank + 1) % W)
    tl.store(out_ptr + offs, x + ctx.rank)


R = C = 16
N = 2 * R * C - 37  # two programs, the second one partly masked


def _tile_arrays(rank: int):
    rng = np.random.default_rng(rank)
    x = rng.standard_normal(2 * R * C).astype(np.float32)
    y = rng.standard_normal(R * C).astype(np.float32)
    return x, y, np.full(2 * R * C, np.nan, np.float32), np.full(2 * R * C, np.nan, np.float32)


def _tile_launches(W: int, counter: np.ndarray) -> tuple[list, list]:
    arrays = [_tile_arrays(rank) for rank in range(W)]
    launches = [[pointer_to(x), pointer_to(y), pointer_to(out), pointer_to(pairs), pointer_to(counter), N,
                 0.5] for x, y, out, pairs in arrays]
    return arrays, launches


def _batched_matches_per_rank(state, W, pickled):
    constexprs = dict(R=R, C=C)
    alone = np.zeros(2, np.int32)
    arrays_alone, launches = _tile_launches(W, alone)
    for args in launches:  # each rank's own launch (the first one records the program)
        run_kernel(_tiles, (2,), args, constexprs)
    together = np.zeros(2, np.int32)
    arrays, launches = _tile_launches(W, together)
    form = batched_form(_tiles, launches[0], constexprs)
    assert isinstance(form, batched.BatchedProgram), form
    if pickled:  # as a worker hands it to the process that holds every rank's buffers
        form = pickle.loads(pickle.dumps(form))
    assert run_batched(form, _tiles, (2,), launches) == [None] * W
    for (_, _, out, pairs), (_, _, out_alone, pairs_alone) in zip(arrays, arrays_alone):
        assert not np.isnan(out).any()
        np.testing.assert_array_equal(out, out_alone)
        np.testing.assert_array_equal(pairs[:N], pairs_alone[:N])
        assert np.isnan(pairs[N:]).all()  # the masked lanes untouched
    np.testing.assert_array_equal(together, alone)
    np.testing.assert_array_equal(together, [3 * W, 3 * W])  # every rank's atomics, both programs


@pytest.mark.parametrize("W", [2, 4, 8])
@pytest.mark.parametrize("pickled", [False, True], ids=["here", "pickled"])
def test_a_batched_replay_gives_each_ranks_own_results(W, pickled):
    get_world(1).call(0, _batched_matches_per_rank, W, pickled)


def _without_a_batched_form(state, W):
    xs = [np.arange(8, dtype=np.float32) * (rank + 1) for rank in range(W)]
    outs = [np.full(1, np.nan, np.float32) for _ in range(W)]
    launches = [[pointer_to(x), pointer_to(out)] for x, out in zip(xs, outs)]
    errors = run_kernel_batch(_reduce, (1,), launches, dict(BLOCK=8))  # one launch after another
    assert errors == [None] * W
    assert [float(out[0]) for out in outs] == [28.0 * (rank + 1) for rank in range(W)]
    return batched_form(_reduce, launches[0], dict(BLOCK=8))


def test_a_kernel_without_a_batched_form_runs_per_rank():
    assert get_world(1).call(0, _without_a_batched_form, 4) is None


def _floats_that_differ(state, W):
    """A float argument is a value of the recorded program: launches whose floats differ have
    different programs, and run one after another."""
    arrays, launches = _tile_launches(W, np.zeros(2, np.int32))
    for rank, args in enumerate(launches):
        args[-1] = 0.5 + rank
    constexprs = dict(R=R, C=C)
    run_kernel(_tiles, (2,), launches[0], constexprs)
    form = batched_form(_tiles, launches[0], constexprs)
    assert run_batched(form, _tiles, (2,), launches) is None
    assert run_kernel_batch(_tiles, (2,), launches, constexprs) == [None] * W
    for rank, (_, _, out, _) in enumerate(arrays):
        expected = [np.full(2 * R * C, np.nan, np.float32) for _ in range(2)]
        x, y, _, _ = _tile_arrays(rank)
        run_kernel(_tiles, (2,), [pointer_to(x), pointer_to(y), pointer_to(expected[0]), pointer_to(expected[1]),
                                  pointer_to(np.zeros(2, np.int32)), N, 0.5 + rank], constexprs)
        np.testing.assert_array_equal(out, expected[0])


def test_launches_whose_values_differ_run_per_rank():
    get_world(1).call(0, _floats_that_differ, 3)


def _puts(state, session, offset, shifts, block):
    """Every rank's put into the next rank's heap, one batched replay; `shifts`: each rank's."""
    heap = state.heap(session)
    W = heap.world_size
    outs = [np.full(block, np.nan, np.float32) for _ in range(W)]
    contexts = [heap.context(rank) for rank in range(W)]  # (alive until every launch ran)

    def launch(rank):
        return [pointer_to(contexts[rank]), Pointer(heap.address(rank, offset), np.float32), pointer_to(outs[rank]),
                shifts[rank]]

    constexprs = dict(W=W, BLOCK=block)
    run_kernel(_put_next, (1,), launch(0), constexprs)  # recorded
    errors = run_kernel_batch(_put_next, (1,), [launch(rank) for rank in range(W)], constexprs)
    return [None if e is None else (type(e), str(e)) for e in errors], outs


@pytest.mark.parametrize("W", [2, 4])
def test_a_ranks_refused_access_is_its_own_error(sim_heap, W):
    """One rank's put runs past the heap: that rank gets the heap guard's error and writes nothing,
    as its own launch would have; the other ranks' launches complete."""
    heap = sim_heap(W, 1 << 16)
    block = 64
    offset = heap.allocate(4 * block * 4)
    for rank in range(W):
        heap.host_view(rank, offset, (4 * block,), np.float32)[:] = np.arange(4 * block) + 1000 * rank
    bad = W - 1
    shifts = [2 * block] * W
    shifts[bad] = (1 << 16) // 4  # past the end of the next rank's heap
    before = heap.host_view((bad + 1) % W, 0, (1 << 16) // 4, np.float32).copy()
    errors, outs = get_world(W).call(0, _puts, heap.session, offset, shifts, block)
    assert errors[bad][0] is NotOnHeapError and "past the heap" in errors[bad][1]
    assert errors[:bad] == [None] * bad
    assert np.isnan(outs[bad]).all()  # it stopped at the put, before its own store
    for rank in range(W):
        if rank != bad:
            np.testing.assert_array_equal(outs[rank], np.arange(block) + 1000 * rank + rank)
            received = heap.host_view((rank + 1) % W, offset + 2 * block * 4, (block,), np.float32)
            np.testing.assert_array_equal(received, np.arange(block) + 1000 * rank)
    # the bad rank's target hears from no one else in a ring: untouched
    np.testing.assert_array_equal(heap.host_view((bad + 1) % W, 0, (1 << 16) // 4, np.float32), before)
