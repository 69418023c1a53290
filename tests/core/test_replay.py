"""The simulator's replay of recorded kernels (iris_core.sim.replay): a kernel whose run does not
depend on its data is recorded at its first launch and replayed afterwards, with the values
the interpreter gives; a kernel whose run does depend on them is interpreted every time."""

import numpy as np
import pytest
import triton
import triton.language as tl

from iris_core.errors import NotOnHeapError
from iris_core.sim import get_world, interpreter, replay
from iris_core.sim.interpreter import Pointer, launch, run_kernel
from iris_jax import Context


@triton.jit
def _affine(x_ptr, y_ptr, out_ptr, n, scale, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    y = tl.load(y_ptr + offs, mask=mask, other=0.0)
    value = tl.where(x > y, x * scale, y - 1.0) + pid.to(tl.float32)
    tl.store(out_ptr + offs, value, mask=mask)
    tl.atomic_add(out_ptr + n, 1.0, mask=pid == 0)  # a scalar effect, once per launch


@triton.jit
def _sum_rows(x_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr):
    tile = tl.load(x_ptr + tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :])
    tl.store(out_ptr + tl.arange(0, ROWS), tl.sum(tile, axis=1))  # a reduction: numpy, outside the builder


@triton.jit
def _count_up(out_ptr, n, BLOCK: tl.constexpr):
    for start in range(0, n, BLOCK):  # Python reads n: the run depends on the data
        offs = start + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, offs, mask=offs < n)


@triton.jit
def _copy_if_positive(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    if tl.load(x_ptr) > 0:  # a branch on a loaded value
        tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def _print_and_copy(x_ptr, out_ptr, BLOCK: tl.constexpr):
    print()  # Python's print, run by the interpreter at every launch
    print("copying", BLOCK)
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def _put_shifted(context_ptr, x_ptr, shift, W: tl.constexpr, BLOCK: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.arange(0, BLOCK)
    ctx.store(x_ptr + shift + offs, tl.load(x_ptr + offs), to_rank=(ctx.rank + 1) % W)


def _program_of(kernel):
    kept = [p for key, p in interpreter._PROGRAMS.items() if key[0] is interpreter.as_interpreted(kernel).fn]
    return kept[-1] if kept else None


# -- run in a simulated rank's worker (where the language's own kernels, tl.sum among them, are
# interpreted; the tests' process imported Triton before turning its interpreter on) ---------------

def _affine_launches(state):
    rng = np.random.default_rng(0)
    n, block = 300, 128
    grid = (-(-n // block),)
    for launch_number in range(3):
        x, y = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
        scale = float(launch_number) + 0.5
        out = np.full(n + 1, np.nan, np.float32)
        out[n] = 0.0
        launch(_affine, grid, x, y, out, n, scale, BLOCK=block)
        pid = np.arange(n) // block
        expected = np.where(x > y, x * np.float32(scale), y - np.float32(1.0)) + pid.astype(np.float32)
        np.testing.assert_array_equal(out[:n], expected.astype(np.float32))
        assert out[n] == 1.0
    program = _program_of(_affine)
    return isinstance(program, replay.Program) and program.steps


def _data_dependent_launches(state):
    for n in (5, 37, 64):
        out = np.full(64, -1, np.int32)
        launch(_count_up, (1,), out, n, BLOCK=16)
        np.testing.assert_array_equal(out[:n], np.arange(n))
        assert (out[n:] == -1).all()
    for first in (1.0, -1.0, 2.0):
        x = np.arange(8, dtype=np.float32) + 10
        x[0] = first
        out = np.zeros(8, np.float32)
        launch(_copy_if_positive, (1,), x, out, BLOCK=8)
        np.testing.assert_array_equal(out, x if first > 0 else np.zeros(8, np.float32))
    rows = np.arange(32, dtype=np.float32).reshape(4, 8)
    for k in (1, 2):
        out = np.zeros(4, np.float32)
        launch(_sum_rows, (1,), rows * k, out, ROWS=4, COLS=8)
        np.testing.assert_array_equal(out, (rows * k).sum(axis=1))
    for k in (1, 2):
        x, out = np.arange(8, dtype=np.float32) * k, np.zeros(8, np.float32)
        launch(_print_and_copy, (1,), x, out, BLOCK=8)
        np.testing.assert_array_equal(out, x)
    return [_program_of(kernel) for kernel in (_count_up, _copy_if_positive, _sum_rows, _print_and_copy)]


def _puts(state, session, offset, shift, block):
    """Every rank's put of the block at `offset` into the next rank's heap, `shift` elements on
    (this worker plays every rank: no rank waits for another)."""
    heap = state.heap(session)
    W = heap.world_size
    for rank in range(W):
        args = [Pointer(heap.context(rank).ctypes.data, np.int32), Pointer(heap.address(rank, offset), np.float32),
                shift]
        run_kernel(_put_shifted, (1,), args, dict(W=W, BLOCK=block))
    return isinstance(_program_of(_put_shifted), replay.Program)


def test_a_kernel_is_replayed_with_the_values_the_interpreter_gives():
    steps, = get_world(1).run(_affine_launches)
    assert steps > 0


def test_kernels_whose_run_depends_on_their_data_are_interpreted_every_time():
    whys, = get_world(1).run(_data_dependent_launches)
    assert whys == ["a value read by tensor.__index__", "a value read by tensor.__bool__",
                    "a value made outside the builder", "print"]


def test_a_replayed_access_outside_the_heap_is_refused(sim_heap):
    """The heap guard's check is a step of the recorded program: run again at every replay, on
    that launch's pointers."""
    heap = sim_heap(4, 1 << 16)
    W, block = 4, 64
    offset = heap.allocate(4 * block * 4)
    for rank in range(W):
        heap.host_view(rank, offset, (4 * block,), np.float32)[:] = np.arange(4 * block) + 1000 * rank
    world = get_world(W)
    assert world.call(0, _puts, heap.session, offset, 2 * block, block)  # recorded at the first rank's put
    for rank in range(W):
        received = heap.host_view((rank + 1) % W, offset + 2 * block * 4, (block,), np.float32)
        np.testing.assert_array_equal(received, np.arange(block) + 1000 * rank)
    before = [heap.host_view(rank, 0, (1 << 16) // 4, np.float32).copy() for rank in range(W)]
    with pytest.raises(NotOnHeapError, match="past the heap.s end"):
        world.call(0, _puts, heap.session, offset, (1 << 16) // 4, block)  # past the heap's end: refused
    for rank in range(W):  # before anything was written
        np.testing.assert_array_equal(heap.host_view(rank, 0, (1 << 16) // 4, np.float32), before[rank])


def test_without_replay_every_launch_is_interpreted(monkeypatch):
    monkeypatch.setattr(replay, "ENABLED", False)
    monkeypatch.setattr(interpreter, "_PROGRAMS", {})
    x, y = np.full(16, 2.0, np.float32), np.ones(16, np.float32)
    out = np.zeros(17, np.float32)
    launch(_affine, (1,), x, y, out, 16, 2.0, BLOCK=16)
    np.testing.assert_array_equal(out, [4.0] * 16 + [1.0])
    assert interpreter._PROGRAMS == {}
