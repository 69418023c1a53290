"""The host side of GPU faults (iris_jax._runtime.faults): the watchdog and the checks at iris's entry points.

On the simulator kernels raise their faults themselves and heaps have no fault page, so these
tests give the watch a heap whose pages are plain host arrays, written as a GPU kernel writes
them (iris_core.faults' layout): what the host does from there is the same code as on GPUs.
"""

from __future__ import annotations

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core import faults
from iris_core.errors import IrisError, NotOnHeapError, PeerFailedError, PeerTimeoutError
from iris_core.heap import status
from iris_jax._runtime import faults as watch_lib

from .helpers import use_runtime

HANG_S = 60  # a bound against a hung watchdog only: it passes every WATCH_S (0.2 s)


class PagedHeap:
    """The part of a GPU heap the watch reads: a fault page and a status word per local rank."""

    heap_size = mapped_size = 1 << 20  # (a heap mapped to its bound)

    def __init__(self, ranks=(0, 1)):
        self.local_ranks = list(ranks)
        self.pages = {r: np.zeros(faults.PAGE_BYTES // 8, np.int64) for r in ranks}
        self.status = {r: 0 for r in ranks}

    def fault_words(self, rank):
        return self.pages[rank]

    def peek_status(self, rank):
        return self.status[rank]

    def clear_status(self, rank):
        self.status[rank] = 0

    def record(self, rank, code, what, peer, program=0, epoch=3, time_ns=None):
        """What a kernel's fail() writes: the fields, then the code (`what` registered, as
        iris's launches register their ops)."""
        faults.named(what)
        at = faults.SLOTS_AT + program * faults.SLOT
        words = self.pages[rank]
        words[at + 1:at + faults.SLOT] = [faults.what_id(what), peer, epoch, -1, 0, 0, time_ns or time.time_ns()]
        words[at] = code


class Owner:
    def __init__(self, heap):
        self.heap = heap


@pytest.fixture
def paged():
    heap = PagedHeap()
    watch = watch_lib.FaultWatch(Owner(heap), "exit")
    yield heap, watch
    watch.close()


def test_the_watch_sets_each_page_s_mode():
    heap = PagedHeap()
    for mode in ("exit", "trap"):
        watch = watch_lib.FaultWatch(Owner(heap), mode)
        watch.close()
        assert all(words[0] == faults.MODES[mode] for words in heap.pages.values())


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match=r"unknown on_fault='bogus'.*\('trap', 'exit'\)"):
        watch_lib.check_mode("bogus")


def watchdog_passes(watch) -> threading.Semaphore:
    """A semaphore released after each of the watchdog's passes over the pages from now on (its
    thread looks `_collect` up on every pass; take() passes report=False)."""
    passes, collect = threading.Semaphore(0), watch._collect

    def counted(report, peek):
        collect(report, peek)
        if report:
            passes.release()

    watch._collect = counted
    return passes


def next_pass(passes) -> None:
    assert passes.acquire(timeout=HANG_S), f"the watchdog made no pass in {HANG_S} s"


def test_the_watchdog_reports_a_record_on_stderr(paged, capfd):
    """The watchdog prints a new record once. (How soon: benchmarks/fault_latency.py.)"""
    heap, watch = paged
    passes = watchdog_passes(watch)
    faults.named("psum over i@watch", kernel="_collective_kernel")
    heap.record(1, faults.TIMEOUT, "psum over i@watch", peer=0)
    while watch.reported_at is None:  # the pass that reads the record reports it
        next_pass(passes)
    err = capfd.readouterr().err
    assert ("iris watchdog: PeerTimeoutError: iris psum over i@watch: timed out waiting for rank 0 (it never "
            "arrived) (on rank 1, kernel _collective_kernel, flag epoch 3)") in err
    for _ in range(3):  # three more passes over the same record
        next_pass(passes)
    assert capfd.readouterr().err == ""  # once only
    [error] = watch.take()
    assert isinstance(error, PeerTimeoutError) and "on rank 1" in str(error)
    assert faults.read_records(heap.pages[1]) == []  # taken: the page is cleared
    assert watch.take() == []


def test_take_gives_every_rank_s_records_and_refused_accesses_oldest_first(paged):
    heap, watch = paged
    heap.record(0, faults.PEER_FAILED, "all_gather@watch", peer=1, program=4, time_ns=20)
    heap.record(1, faults.TIMEOUT, "all_gather@watch", peer=0, program=0, time_ns=10)
    heap.status[0] = status.encode("store", rank=1, offset=-64)
    errors = watch.take()
    assert sorted(type(e).__name__ for e in errors) == ["NotOnHeapError", "PeerFailedError", "PeerTimeoutError"]
    assert heap.status[0] == 0  # the status word is cleared with the records
    with pytest.raises(PeerTimeoutError) as raised:
        watch_lib.raise_first(errors, cause=RuntimeError("CUDA_ERROR_LAUNCH_FAILED"))
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert "rank 1 gave up on an earlier collective" in str(raised.value)  # the others follow in its message


@pytest.fixture
def faulty_runtime(monkeypatch):
    """The simulator's runtime with its fault watch over a PagedHeap."""
    rt = use_runtime(2)
    heap = PagedHeap(ranks=(0, 1))
    watch = watch_lib.FaultWatch(Owner(heap), "exit")
    monkeypatch.setattr(rt, "_faults", watch)
    yield rt, heap
    watch.close()


def test_entry_points_raise_a_recorded_fault_once(faulty_runtime):
    rt, heap = faulty_runtime
    iris_jax.check_faults()  # nothing recorded
    heap.record(0, faults.TIMEOUT, "psum@entry", peer=1)
    with pytest.raises(PeerTimeoutError, match="iris psum@entry: timed out waiting for rank 1"):
        iris_jax.check_faults()
    iris_jax.check_faults()  # raised once
    heap.record(1, faults.PEER_FAILED, "psum@entry", peer=0)
    with pytest.raises(PeerFailedError, match="on rank 1"):
        iris_jax.block_until_ready(jnp.ones(3))
    heap.record(1, faults.TIMEOUT, "psum@entry", peer=0)
    with pytest.raises(PeerTimeoutError):
        iris_jax.barrier()
    heap.status[1] = status.encode("put", rank=0, offset=1 << 30)
    with pytest.raises(NotOnHeapError):
        iris_jax.check_faults()


def test_replaced_functions_check_before_the_call_and_chain_the_call_s_error(faulty_runtime):
    rt, heap = faulty_runtime
    mesh = jax.make_mesh((2,), ("i",), devices=rt.devices)
    x = jax.device_put(jnp.arange(8.0), NamedSharding(mesh, P("i")))
    step = iris_jax.replace_lax_collectives(
        jax.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P()))
    np.testing.assert_allclose(np.asarray(step(x)), np.arange(8.0).reshape(2, 4).sum(0))
    heap.record(0, faults.TIMEOUT, "psum@replaced", peer=1)
    with pytest.raises(PeerTimeoutError, match="psum@replaced"):
        step(x)  # a fault recorded before: raised before the call runs
    assert step.lower(x) is not None  # the jitted function's other methods stay

    calls = []

    def trapped(v):  # stands for a launch whose kernel trapped after writing its record
        calls.append(v)
        heap.record(1, faults.TIMEOUT, "psum@trapped", peer=0)
        raise RuntimeError("CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure")

    with pytest.raises(PeerTimeoutError, match="psum@trapped") as raised:
        iris_jax.sync.guarded_call(trapped, 1)
    assert calls == [1] and "CUDA_ERROR_LAUNCH_FAILED" in str(raised.value.__cause__)
    with pytest.raises(ValueError, match="no record"):  # an error with no record stays itself
        iris_jax.sync.guarded_call(lambda: (_ for _ in ()).throw(ValueError("no record")))


def test_init_checks_on_fault():
    use_runtime(2)
    with pytest.raises(IrisError, match="already initialized with on_fault='exit'.*conflicts"):
        iris_jax.init(on_fault="trap")
    iris_jax.shutdown()
    with pytest.raises(ValueError, match="unknown on_fault='bogus'"):
        iris_jax.init(heap_size=1 << 20, devices=jax.devices()[:2], on_fault="bogus")
    assert not iris_jax.is_initialized()


def test_a_failed_execution_raises_the_error_it_carries():
    """The fault gate fails an execution with the error's words (a refusal it reported is kept
    nowhere else): iris_jax.block_until_ready and replace_lax_collectives raise it by its name."""
    jax_error = RuntimeError("UNKNOWN: NotOnHeapError: an iris kernel on rank 1: store to rank 0 ... "
                             "nothing was accessed. [executable_name='jit_step']")
    named = watch_lib.carried(jax_error)
    assert type(named) is NotOnHeapError
    assert str(named) == "an iris kernel on rank 1: store to rank 0 ... nothing was accessed."
    assert watch_lib.carried(RuntimeError("INTERNAL: ValueError: not iris's")) is None

    class Failed:  # what jax.block_until_ready meets: an output of the failed execution
        def block_until_ready(self):
            raise jax_error

    with pytest.raises(NotOnHeapError) as info:
        iris_jax.block_until_ready(Failed())
    assert info.value.__cause__ is jax_error
