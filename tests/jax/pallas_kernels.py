"""Kernels of the iris_jax.pallas tests, shared by the simulator tests (tests/jax/test_pallas.py),
the in-process GPU tests (tests/gpu/test_gpu_pallas.py) and the multi-rank `pallas` scenario
(tests/gpu/scenarios.py), and a loader of the Pallas example's kernel."""

import importlib.util
import os
import sys

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

N = 8  # elements per rank
POISON = -7.0
ROUNDS = 5  # lock rounds of cas_lock on every rank
SEMS = ("relaxed", "acquire", "release", "acq_rel")  # add_into_rank0's counters, one per sem
EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "06_pallas_all_reduce.py")


def ring_put(ctx, inbox_ref, flags_ref, x_ref, o_ref):
    """Put x into the next rank's inbox, raise its flag, wait for mine, read my inbox."""
    peer = (ctx.rank + 1) % ctx.world_size
    ctx.store(inbox_ref, x_ref[...] * 2.0, to_rank=peer)
    ctx.sync_threads()  # GPUs: every thread's part of the store before the flag
    ctx.atomic_add(flags_ref.at[0], 1, to_rank=peer, sem="release")
    ctx.wait(flags_ref.at[0], 1)
    o_ref[...] = ctx.load(inbox_ref, from_rank=ctx.rank)


def contended(ctx, counters_ref, o_ref):
    """Every program of every rank adds into every rank's counters (grid of 3)."""
    i = pl.program_id(0)
    old = jnp.zeros((), jnp.int32)
    for peer in range(ctx.world_size):
        old += ctx.atomic_add(counters_ref.at[0], 1, to_rank=peer)
        ctx.atomic_max(counters_ref.at[1], ctx.rank * 10 + i, to_rank=peer, sem="relaxed")
        ctx.atomic_min(counters_ref.at[2], ctx.rank * 10 + i, to_rank=peer, scope="gpu")
        ctx.atomic_or(counters_ref.at[3], 1 << ctx.rank, to_rank=peer)
        ctx.atomic_xor(counters_ref.at[4], 1 << ctx.rank, to_rank=peer)
        ctx.atomic_and(counters_ref.at[5], ~(1 << ctx.rank), to_rank=peer)
        ctx.atomic_sub(counters_ref.at[6], 2, to_rank=peer)
    ctx.atomic_add(counters_ref.at[pl.ds(8, 8)], jnp.arange(8, dtype=jnp.int32), to_rank=0)
    o_ref[i] = old


CONTENDED_START = [0, -1, 100, 0, 0, -1, 0, 0] + [0] * 8  # each rank's 16 counters before `contended`


def contended_expected(W: int, programs_per_rank: int = 3):
    """What `contended` leaves in every rank's counters (16 int32 each, starting from CONTENDED_START)."""
    import numpy as np

    programs = programs_per_rank * W
    row = np.array([programs, (W - 1) * 10 + programs_per_rank - 1, 0, (1 << W) - 1,
                    ((1 << W) - 1) if programs_per_rank % 2 else 0, -1 & ~((1 << W) - 1), -2 * programs, 0]
                   + [0] * 8, np.int32)
    rows = np.tile(row, (W, 1))
    rows[0, 8:] = np.arange(8) * programs
    return rows


def add_into_rank0(ctx, counters_ref, o_ref):
    """Every program of every rank adds 1 into each of rank 0's counters, counter k with
    sem SEMS[k] (system scope); o[program * len(SEMS) + k] is the old value it got."""
    i = pl.program_id(0)
    for k, sem in enumerate(SEMS):
        o_ref[i * len(SEMS) + k] = ctx.atomic_add(counters_ref.at[k], 1, to_rank=0, sem=sem, scope="sys")


def make_cas_lock(rounds: int):
    """A kernel that `rounds` times takes the lock on rank 0 (CAS), increments rank 0's counter
    with a plain remote load + store, and releases with an exchange. Lost updates would show
    without mutual exclusion. Its output: lock rounds plus failed tries (>= rounds)."""
    def cas_lock(ctx, lock_ref, counter_ref, o_ref):
        def round_(k, acquired):
            def spin(_):
                return ctx.atomic_cas(lock_ref.at[0], 0, 1, to_rank=0, sem="acquire")

            tries = lax.while_loop(lambda old: old != 0, spin, spin(None))
            ctx.sync_threads()
            value = ctx.load(counter_ref.at[0], from_rank=0)
            ctx.store(counter_ref.at[0], value + 1, to_rank=0)
            ctx.sync_threads()
            ctx.atomic_xchg(lock_ref.at[0], 0, to_rank=0, sem="release")
            return acquired + 1 + tries

        o_ref[0] = lax.fori_loop(0, rounds, round_, jnp.zeros((), jnp.int32))

    return cas_lock


cas_lock = make_cas_lock(ROUNDS)


def poisoned_output(kernel, count: int):
    """`kernel(ctx, *count inputs, out)` taking one more input before its output: the array that the
    output aliases (input_output_aliases={count: 0}), so that the output starts as that array
    (poisoned) and a kernel that writes nothing shows."""
    def with_poisoned_output(ctx, *refs):  # refs: the inputs, the aliased input, the output
        kernel(ctx, *refs[:count], refs[count + 1])

    with_poisoned_output.__name__ = kernel.__name__
    return with_poisoned_output


def example():
    """examples/06_pallas_all_reduce.py as a module (its kernel `one_shot_all_reduce`, its `N`).
    The example picks its platform on import (examples/_common.py); the environment it sets is
    put back, as JAX is already up here."""
    saved = dict(os.environ)
    directory = os.path.dirname(os.path.abspath(EXAMPLE))
    added = directory not in sys.path
    if added:
        sys.path.insert(0, directory)  # for its `import _common`
    try:
        spec = importlib.util.spec_from_file_location("pallas_all_reduce_example", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if added:
            sys.path.remove(directory)
        os.environ.clear()
        os.environ.update(saved)
    return module
