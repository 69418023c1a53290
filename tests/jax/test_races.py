"""The simulator's race detector (iris_core.sim.races): every seeded bug of race_kernels.py is found
at 2 and 4 ranks, with a report naming both accesses; correct code (the same kernel without the
bug, collectives and their variants, a tile-level collective, ragged_all_to_all) is never reported."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import RaceWarning
from iris_core.sim import races
from tests.jax import race_kernels
from tests.jax.helpers import TEST_HEAP

N = 64


def detecting(world: int, mode: str = "warn", collectives: str = "kernels"):
    """A runtime over the first `world` devices with the race detector on; its collectives run their
    kernels under the interpreter (the tests that check the kernels), or on the host ("host", the
    default of init: the detector sees their reads, writes and order, not their kernels)."""
    iris_jax.shutdown()
    return iris_jax.init(heap_size=TEST_HEAP, devices=jax.devices()[:world], detect_races=mode,
                         sim_collectives=collectives)


@pytest.fixture(autouse=True)
def _fresh_runtime():
    yield
    iris_jax.shutdown()


def run_pairs(world: int, bug: int):
    """pair_exchange over `world` ranks; returns (each rank's output, RaceWarning messages)."""
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    data = iris_jax.zeros((world, N), jnp.float32, sharding=rows, name="data")
    flags = [iris_jax.zeros((world, 8), jnp.int64 if jax.config.jax_enable_x64 else jnp.int32, sharding=rows,
                            name=name) for name in ("data_flag", "ack", "counter")]
    x = jax.device_put(np.arange(world * N, dtype=np.float32).reshape(world, N), rows)

    def body(d, f, a, c, v):
        return iris_jax.triton_call(d[0], f[0], a[0], c[0], v[0], kernel=race_kernels.pair_exchange,
                                    out_shape=jax.ShapeDtypeStruct((N,), jnp.float32), grid=(1,), BUG=bug,
                                    W=world, BLOCK=N)[None]

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = np.asarray(program(data, *flags, x))
    return out, [str(w.message) for w in caught if issubclass(w.category, RaceWarning)]


def _ranks_of(reports):
    import re

    for report in reports:
        for text in report.split("data race on rank")[1:]:
            ranks = re.findall(r"by rank (\d+)", text)
            yield ranks[0], ranks[1]


def run_ring(world: int, form: int):
    """race_kernels.ring over `world` ranks in `form`; returns (each rank's output, RaceWarning messages)."""
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    inbox = iris_jax.zeros((world, N), jnp.float32, sharding=rows, name="inbox")
    flag = iris_jax.zeros((world, 8), jnp.int32, sharding=rows, name="ring_flag")
    x = jax.device_put(np.arange(world * N, dtype=np.float32).reshape(world, N), rows)

    def body(b, f, v):
        return iris_jax.triton_call(b[0], f[0], v[0], kernel=race_kernels.ring, grid=(1,), FORM=form, W=world,
                                    BLOCK=N, out_shape=jax.ShapeDtypeStruct((N,), jnp.float32))[None]

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    return _caught(lambda: np.asarray(program(inbox, flag, x)))


def _small(world: int, where: int):
    """small_stores over int8 cells; returns (rank 0's cells, RaceWarning messages)."""
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    cells = iris_jax.zeros((world, 8), jnp.int8, sharding=rows, name="cells")

    def body(c):
        return iris_jax.triton_call(c[0], kernel=race_kernels.small_stores, grid=(1,), W=world, WHERE=where,
                                    out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))[None]

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    _, found = _caught(lambda: jax.block_until_ready(program(cells)))
    return np.asarray(cells)[0], found


def _verdict_cases(world: int, every: bool = True):
    """(name, run: () -> RaceWarning messages, the array a race is on or None for correct code, the
    kernel the reports name). `every`: all of race_kernels.py; else pair_exchange and the ring."""
    x = np.arange(world * N, dtype=np.float32).reshape(world, N)

    def pairs(code):
        def run():
            out, found = run_pairs(world, code)
            if code == race_kernels.NONE:  # each reader got both rounds of its writer
                for r in range(1, world, 2):
                    np.testing.assert_array_equal(out[r], x[r - 1] + x[r - 1] + 1)
            return found
        return run

    def ring(form):
        def run():
            out, found = run_ring(world, form)
            if form == race_kernels.RING_CORRECT:
                np.testing.assert_array_equal(out, np.roll(x, 1, axis=0))
            return found
        return run

    cases = [("pair_exchange correct", pairs(race_kernels.NONE), None, "pair_exchange")]
    cases += [(f"pair_exchange {bug}", pairs(code), "counter" if bug == "plain_stores" else "data", "pair_exchange")
              for bug, code in sorted(race_kernels.BUGS.items())]
    cases += [(f"ring {form}", ring(code), None if form == "correct" else "inbox", "ring")
              for form, code in race_kernels.RING_FORMS.items()]
    if not every:
        return cases

    def programs(code, count):
        return lambda: run_programs(world, code, count)[1]

    cases += [(f"programs {bug}", programs(code, 2), "tiles", "programs_of_one_rank")
              for bug, code in sorted(race_kernels.PROGRAM_BUGS.items())]
    cases += [(f"programs {case}", programs(code, 2 if case in ("flag", "peer_flag_passed") else 4), None,
               "programs_of_one_rank") for case, code in sorted(race_kernels.PROGRAM_CORRECT.items())]
    small = {"same": race_kernels.SAME, "neighbours": race_kernels.NEIGHBOURS, "word": race_kernels.WORD}
    cases += [(f"small_stores {where}", lambda code=code: _small(world, code)[1],
               None if where == "neighbours" else "cells", "small_stores") for where, code in small.items()]
    cases += [(f"pallas_ring {bug}", lambda bug=bug: _run_pallas(world, race_kernels.pallas_ring(bug))[1],
               None if bug is None else "inbox", f"pallas_ring_{bug or 'correct'}")
              for bug in (None, *race_kernels.PALLAS_BUGS)]
    return cases


def _stagger_s(world: int) -> float:
    """A late rank's wait at each launch: longer than a whole launch of these kernels (about 0.15 s
    per case at 2 ranks, more at 8 on a 2-core box)."""
    return 0.4 * max(1, world // 4)


def _check_verdicts(world: int, position: str, every: bool = True):
    """Each case of `_verdict_cases` in `position`: "first" (the first kernel of a fresh runtime),
    "after" (after the cases before it and their allocations, in one runtime), "staggered" (the same,
    every odd rank's launches beginning `_stagger_s` late: its peers may run a whole launch first)."""
    rt = detecting(world)
    if position == "staggered":
        races.stagger(rt.sim_session, world, rt.heap_size, [_stagger_s(world) * (r % 2) for r in range(world)])
    else:  # kernels and allocations before the first case
        run_ring(world, race_kernels.RING_CORRECT)
    wrong = []
    for i, (name, run, array, kernel) in enumerate(_verdict_cases(world, every)):
        if position == "first" and i:
            detecting(world)
        found = run()
        if array is None:
            if found:
                wrong.append(f"{name}: reported\n{found[0]}")
            continue
        if not found:
            wrong.append(f"{name}: no race reported")
            continue
        for report in found:
            parts = ["data race on rank", f"kernel {kernel} at", f'array "{array}" (', "to order them"]
            if kernel == "programs_of_one_rank":
                parts[-1] = "scope='gpu'"
            missing = [part for part in parts if part not in report]
            if missing:
                wrong.append(f"{name}: the report lacks {missing}\n{report}")
        if kernel == "pair_exchange":  # only partners race
            racing = {tuple(sorted((int(a), int(b)))) for a, b in _ranks_of(found)}
            if not racing <= {(p, p + 1) for p in range(0, world, 2)}:
                wrong.append(f"{name}: ranks {racing} race\n{found[0]}")
    assert not wrong, f"{len(wrong)} wrong verdicts at {world} ranks, {position}:\n" + "\n\n".join(wrong)


@pytest.mark.parametrize("position", ["first", "after", "staggered"])
@pytest.mark.parametrize("world", [2, 4])
def test_verdicts_whatever_the_schedule(world, position):
    """Every seeded bug of race_kernels.py is reported, and its correct forms are not, as the first
    kernel, after other kernels and new allocations, and with launch starts staggered (issue 56)."""
    _check_verdicts(world, position)


@pytest.mark.parametrize("position", ["first", "after", "staggered"])
def test_verdicts_at_eight_ranks(position):
    """pair_exchange's bugs and the ring's forms at 8 ranks."""
    _check_verdicts(8, position, every=False)


def test_memory_reused_has_no_history():
    """A heap array freed and a new one allocated at the same offset between two kernels: the new
    one's words keep nothing of the old one's accesses (each rank stored into the next one's old
    inbox; each reads its new one with nothing ordering it after those stores: no report)."""
    import gc

    world = 2
    detecting(world)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    x = jax.device_put(np.arange(world * N, dtype=np.float32).reshape(world, N), rows)
    row = jax.ShapeDtypeStruct((N,), jnp.float32)
    smap = partial_smap(mesh)
    send = smap(lambda b, v: iris_jax.triton_call(b[0], v[0], kernel=race_kernels.store_to_next, out_shape=row,
                                                  grid=(1,), W=world, BLOCK=N)[None], 1)
    receive = smap(lambda b: iris_jax.triton_call(b[0], kernel=race_kernels.read_own, out_shape=row, grid=(1,),
                                                  BLOCK=N)[None], 1)
    old = iris_jax.zeros((world, N), jnp.float32, sharding=rows, name="old")
    where = old.addressable_shards[0].data.unsafe_buffer_pointer()
    _, found = _caught(lambda old=old: jax.block_until_ready(send(old, x)))
    assert not found, found[0]
    del old
    gc.collect()
    new = iris_jax.zeros((world, N), jnp.float32, sharding=rows, name="new")
    assert new.addressable_shards[0].data.unsafe_buffer_pointer() == where  # the same heap memory
    got, found = _caught(lambda: np.asarray(receive(new)))
    assert not found, found[0]
    np.testing.assert_array_equal(got, 0)
    _, found = _caught(lambda: np.asarray(send(new, x)))  # still checked: a store into a peer's inbox that it read
    assert found and 'array "new" (' in found[0] and "load by rank" in found[0], found


def test_flag_loads_are_recorded():
    """A volatile or acquiring load is an atomic read: a peer's later plain store that nothing orders
    after it races with it (issue 56). Each rank reads its own flag, then stores a plain 0 over the
    next rank's; rank 1 begins late, so its store comes after rank 0's read."""
    world = 2
    rt = detecting(world)
    races.stagger(rt.sim_session, world, rt.heap_size, [0, _stagger_s(world)])
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    flag = iris_jax.zeros((world, 8), jnp.int32, sharding=rows, name="polled")
    smap = partial_smap(mesh)
    for acquire in (False, True):
        step = smap(lambda f, acquire=acquire: iris_jax.triton_call(
            f[0], kernel=race_kernels.poll_then_clear, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(1,),
            W=world, ACQUIRE=acquire)[None], 1)
        _, found = _caught(lambda step=step: np.asarray(step(flag)))
        late = [r for r in found if "  flag load by rank 0, program 0: " in r and "  store by rank 1, " in r]
        assert late and 'array "polled" (' in late[0], (acquire, found)


def test_raise_mode_names_the_race():
    detecting(2, "raise")
    with pytest.raises(Exception, match="RaceError") as error:
        run_pairs(2, race_kernels.READ_BEFORE_FLAG)
    assert "data race on rank" in str(error.value)


def test_mode_setting():
    assert races.mode_of(True) == "raise" and races.mode_of("warn") == "warn"
    assert races.mode_of(False) is None and races.mode_of("0") is None
    with pytest.raises(ValueError, match="detect_races"):
        races.mode_of("loud")


# -- programs of one launch on one rank ----------------------------------------------------------------
def run_programs(world: int, case: int, programs: int, dtype=jnp.float32):
    """programs_of_one_rank over `world` ranks, `programs` programs each, tiles of `dtype`; returns (each
    rank's output, RaceWarning messages)."""
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    tiles = iris_jax.zeros((world, (programs + 1) * N), dtype, sharding=rows, name="tiles")
    flag = iris_jax.zeros((world, 8), jnp.int32, sharding=rows, name="program_flag")

    def body(t, f):
        return iris_jax.triton_call(t[0], f[0], kernel=race_kernels.programs_of_one_rank,
                                    out_shape=jax.ShapeDtypeStruct((programs * N,), jnp.float32),
                                    grid=(programs,), CASE=case, W=world, BLOCK=N)[None]

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    return _caught(lambda: np.asarray(program(tiles, flag)))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("bug", sorted(race_kernels.PROGRAM_BUGS))
def test_race_between_programs_is_found(world, bug):
    """Two programs of one launch on one rank: the report names both programs and says that a
    release / acquire at gpu scope orders them (not a barrier between ranks)."""
    detecting(world)
    _, found = run_programs(world, race_kernels.PROGRAM_BUGS[bug], 2)
    assert found, f"{bug} at {world} ranks: no race reported"
    reports = "\n".join(found).split("data race on rank")[1:]
    if bug == "peer_flag_elsewhere":  # between ranks: the odd rank's program 1 and its peer's program 0
        assert len(reports) == world // 2, found
        for report in reports:
            assert 'array "tiles" (' in report and "race_kernels.py:" in report, report
            ((writer, reader),) = _ranks_of(["data race on rank" + report])
            assert int(reader) == int(writer) + 1 and int(writer) % 2 == 0, report
            assert f"store by rank {writer}, program 0: " in report, report
            assert f"load by rank {reader}, program 1: " in report, report
            assert "orders that program only" in report and "scope='gpu'" in report, report
        return
    assert len(reports) == world, found  # each rank's programs race on its own tiles, and only there
    for report in reports:
        assert 'array "tiles" (' in report, report
        ranks = {int(rank) for rank, _ in _ranks_of(["data race on rank" + report])}
        assert len(ranks) == 1, report  # both accesses by one rank
        assert ", program 0: " in report and ", program 1: " in report, report
        assert "programs_of_one_rank" in report and "race_kernels.py:" in report, report
        assert "scope='gpu'" in report and "run concurrently" in report, report
        # the hint: the reader polled the flag the writer raised, both at cta scope
        assert ("did read a flag the earlier one changed" in report) == (bug == "cta_flag"), report
        assert bug != "cta_flag" or "sem=acquire, scope=cta" in report, report
    if bug == "overlapping_tiles":
        assert "store by rank" in reports[0] and "tiles overlap" in reports[0], reports[0]
        assert "its bytes [252, 256)" in reports[0], reports[0]  # the one element both tiles hold
    else:
        assert "store by rank" in reports[0] and "load by rank" in reports[0], reports[0]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("case", sorted(race_kernels.PROGRAM_CORRECT))
def test_ordered_programs_are_not_reported(world, case):
    detecting(world)
    programs = 2 if case in ("flag", "peer_flag_passed") else 4
    out, found = run_programs(world, race_kernels.PROGRAM_CORRECT[case], programs)
    assert not found, found[0]
    value = np.arange(N, dtype=np.float32)
    # what the kernel writes: program 1's copy of tile 0, the last program's sum, every program's tile
    written, want = {"flag": (slice(0, N), value), "peer_flag_passed": (slice(0, N), value),
                     "last_arrives": (slice(0, N), sum(value + 1000 * p for p in range(programs))),
                     "disjoint_tiles": (slice(None), np.concatenate([value + 1000 * p for p in range(programs)]))}[case]
    for r in range(1, world, 2) if case == "peer_flag_passed" else range(world):  # the readers
        np.testing.assert_array_equal(out[r][written], want)


# -- correct code: nothing is reported ---------------------------------------------------------------
def _collective_cases(world):
    """(name, function of one rank's row, numpy reference of all rows)."""
    ax = "i"
    cases = [(f"psum {variant}", lambda v, variant=variant: iris_jax.all_reduce(v, ax, "sum", variant),
              lambda x: np.broadcast_to(x.sum(0), x.shape))
             for variant in ("one_shot", "two_shot", "atomic", "spinlock", "ring")]
    cases += [
        ("pmax", lambda v: iris_jax.pmax(v, ax), lambda x: np.broadcast_to(x.max(0), x.shape)),
        ("all_gather", lambda v: iris_jax.all_gather(v, ax, tiled=True),
         lambda x: np.broadcast_to(x.reshape(-1), (world, x.size))),
        ("psum_scatter", lambda v: iris_jax.psum_scatter(v, ax, tiled=True),
         lambda x: x.sum(0).reshape(world, -1)),
        ("all_to_all", lambda v: iris_jax.all_to_all(v, ax, 0, 0, tiled=True),
         lambda x: x.reshape(world, world, -1).transpose(1, 0, 2).reshape(world, -1)),
        ("ppermute", lambda v: iris_jax.ppermute(v, ax, [(r, (r + 1) % world) for r in range(world)]),
         lambda x: np.roll(x, 1, axis=0)),
        ("psum twice", lambda v: iris_jax.psum(iris_jax.psum(v, ax) * 0.5, ax),
         lambda x: np.broadcast_to(x.sum(0) * 0.5 * world, x.shape)),
    ]
    return cases


@pytest.mark.parametrize("collectives", ["kernels", "host"])
@pytest.mark.parametrize("world", [2, 4])
def test_collectives_are_not_reported(world, collectives):
    detecting(world, collectives=collectives)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    x = np.random.default_rng(0).standard_normal((world, 96 * world)).astype(np.float32)
    for name, f, ref in _collective_cases(world):
        program = jax.jit(jax.shard_map(lambda v, f=f: f(v[0])[None], mesh=mesh, in_specs=P("i"),
                                        out_specs=P("i"), check_vma=False))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # back to back: the second call reuses the workspace and flags
                got = np.asarray(program(jax.device_put(x, rows)))
        found = [str(w.message) for w in caught if issubclass(w.category, RaceWarning)]
        assert not found, f"{name}: {found[0]}"
        np.testing.assert_allclose(got, ref(x), rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("launch", ["programs", "streamed", "push"])
def test_collectives_of_many_programs_are_not_reported(world, launch):
    """Small tiles over more programs per rank (the programs of one launch are threads of their own:
    what one program of a rank writes another may touch only after a release / acquire at gpu or sys
    scope), streamed (sending and receiving programs of one rank) and pushed."""
    detecting(world)
    config = {"programs": iris_jax.CollectiveConfig(block=256, programs_per_sm=4),
              "streamed": iris_jax.CollectiveConfig(stream_from=0, block=256),
              "push": iris_jax.CollectiveConfig(push_from=0, block=256, programs_per_sm=4)}[launch]
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    x = np.random.default_rng(1).standard_normal((world, 1024 * world)).astype(np.float32)
    with iris_jax.use_config(config):
        for name, f, ref in _collective_cases(world):
            program = jax.jit(jax.shard_map(lambda v, f=f: f(v[0])[None], mesh=mesh, in_specs=P("i"),
                                            out_specs=P("i"), check_vma=False))
            got, found = _caught(lambda: [np.asarray(program(jax.device_put(x, rows))) for _ in range(2)][-1])
            assert not found, f"{name}: {found[0]}"
            np.testing.assert_allclose(got, ref(x), rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("world", [2, 4])
def test_fused_ops_are_not_reported(world):
    """The fused GEMM ops: programs that compute tiles and programs of the same rank that reduce or
    send them once flagged (gpu-scope edges between programs of one launch)."""
    from jax import lax

    from iris_jax import ops

    detecting(world)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rng = np.random.default_rng(2)
    m, k, n = 37, 21, 19
    rows = m + (-m) % world

    def put(shape, spec):
        return jax.device_put(rng.standard_normal(shape).astype(np.float32), NamedSharding(mesh, spec))

    ins = (P(None, "i"), P(None, "i"), P("i", None), P("i", None), P(None, "i"))
    args = [put(shape, spec) for shape, spec in zip(
        [(m, world * k), (rows, world * k), (world * k, n), (world * m, k), (k, world * n)], ins)]
    specs = dict(ar=P(), ag=P(None, "i"), rs=P("i"))

    def fused(a_row, a_rs, b_row, a_col, b_col):
        return dict(ar=ops.matmul_all_reduce(a_row, b_row, "i", impl="fused"),
                    ag=ops.all_gather_matmul(a_col, b_col, "i", impl="fused"),
                    rs=ops.matmul_reduce_scatter(a_rs, b_row, "i", impl="fused"))

    def reference(a_row, a_rs, b_row, a_col, b_col):
        return dict(ar=lax.psum(a_row @ b_row, "i"), ag=lax.all_gather(a_col, "i", tiled=True) @ b_col,
                    rs=lax.psum_scatter(a_rs @ b_row, "i", tiled=True))

    program = jax.jit(jax.shard_map(fused, mesh=mesh, in_specs=ins, out_specs=specs))
    got, found = _caught(lambda: [jax.tree.map(np.asarray, program(*args)) for _ in range(2)][-1])
    assert not found, found[0]
    want = jax.jit(jax.shard_map(reference, mesh=mesh, in_specs=ins, out_specs=specs))(*args)
    for key in specs:
        np.testing.assert_allclose(got[key], np.asarray(want[key]), rtol=1e-4, atol=1e-4, err_msg=key)


@pytest.mark.parametrize("variant", ["ring", "two_shot", "atomic"])
def test_repeated_group_calls_are_not_reported(variant):
    """Calls of several flag rounds per epoch, back to back: each member writes its call's signature
    beside its flag once per epoch (group.py's signal), not in every round, where a member may be
    reading it (a race the detector reported when it did)."""
    world = 4
    detecting(world)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    for n in (1, 96 * world):
        x = np.random.default_rng(n).standard_normal((world, n)).astype(np.float32)
        program = jax.jit(jax.shard_map(lambda v: iris_jax.all_reduce(v[0], "i", "sum", variant)[None], mesh=mesh,
                                        in_specs=P("i"), out_specs=P("i"), check_vma=False))
        got, found = _caught(lambda: [np.asarray(program(jax.device_put(x, rows))) for _ in range(3)][-1])
        assert not found, f"{variant}, {n} elements: {found[0]}"
        np.testing.assert_allclose(got, np.broadcast_to(x.sum(0), x.shape), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.int8, jnp.bfloat16])
@pytest.mark.parametrize("where", ["same", "neighbours", "word"])
def test_small_elements(dtype, where):
    """Elements of 1 and 2 bytes are checked byte by byte: two ranks storing into one element race,
    into neighbouring elements of one 4-byte word do not; a whole-word store over them races."""
    world = 4
    detecting(world)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    cells = iris_jax.zeros((world, 8), dtype, sharding=rows, name="cells")
    code = {"same": race_kernels.SAME, "neighbours": race_kernels.NEIGHBOURS, "word": race_kernels.WORD}[where]

    def body(c):
        return iris_jax.triton_call(c[0], kernel=race_kernels.small_stores, grid=(1,), W=world, WHERE=code,
                                    out_shape=jax.ShapeDtypeStruct((1,), jnp.int32))[None]

    program = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
    # twice: the second launch is checked against the first's records too (nothing orders launches of ranks)
    _, found = _caught(lambda: [jax.block_until_ready(program(cells)) for _ in range(2)])
    if where == "neighbours":
        assert not found, found[0]
        got = np.asarray(cells)[0]
        np.testing.assert_array_equal(got[:world].astype(np.float32), np.arange(1, world + 1))
    else:
        assert found and all('array "cells" (' in report for report in found), found
        assert "store by rank" in found[0] and "small_stores" in found[0], found[0]


def _caught(run):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = run()
    return out, [str(w.message) for w in caught if issubclass(w.category, RaceWarning)]


@pytest.mark.parametrize("between", ["device_barrier", "host_barrier", "nothing", "psum", "psum kernels"])
def test_launches_ordered_by_a_barrier(between):
    """A store into the next rank's inbox, then that rank's plain load of it in a later launch: a
    device_barrier, a host barrier or a psum between (run on the host, or its kernel) orders them;
    nothing between is a race."""
    world = 2
    detecting(world, collectives="kernels" if between == "psum kernels" else "host")
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    inbox = iris_jax.zeros((world, N), jnp.float32, sharding=rows)
    x = jax.device_put(np.arange(world * N, dtype=np.float32).reshape(world, N), rows)
    row = jax.ShapeDtypeStruct((N,), jnp.float32)

    def send(b, v):
        return iris_jax.triton_call(b[0], v[0], kernel=race_kernels.store_to_next, out_shape=row, grid=(1,),
                                    W=world, BLOCK=N)[None]

    def receive(b, *after):
        return iris_jax.triton_call(b[0], *[a[0] for a in after], kernel=race_kernels.read_own, out_shape=row,
                                    grid=(1,), BLOCK=N)[None]

    smap = partial_smap(mesh)
    if between.startswith("psum"):
        def step(b, v):
            sent = send(b, v)
            total = iris_jax.psum(sent, "i")  # (kernel calls and collectives run in program order)
            return receive(b), total
        (got, _), found = _caught(lambda: jax.block_until_ready(smap(step, 2)(inbox, x)))
    elif between == "device_barrier":
        def step(b, v):
            sent = send(b, v)
            _, b, sent = iris_jax.device_barrier(b, sent)
            return receive(b), sent
        (got, _), found = _caught(lambda: jax.block_until_ready(smap(step, 2)(inbox, x)))
    else:
        def both():
            jax.block_until_ready(smap(send, 1)(inbox, x))
            if between == "host_barrier":
                iris_jax.barrier()
            return np.asarray(smap(receive, 1)(inbox))
        got, found = _caught(both)
    if between == "nothing":
        assert found and "load by rank" in found[0] and "store by rank" in found[0], found
    else:
        assert not found, found[0]
        np.testing.assert_array_equal(np.asarray(got), np.roll(np.asarray(x), 1, axis=0))


@pytest.mark.parametrize("collectives", ["host", "kernels"])
def test_collective_reading_a_peers_unordered_store(collectives):
    """Each rank stores into the next rank's inbox, then every rank psums its inbox with nothing
    between: the psum's read races with the previous rank's store, whether the psum runs on the host
    or as its kernel, and the report names both, the array and the psum's line."""
    world = 4
    detecting(world, collectives=collectives)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    inbox = iris_jax.zeros((world, N), jnp.float32, sharding=rows, name="inbox")
    x = jax.device_put(np.arange(world * N, dtype=np.float32).reshape(world, N), rows)

    def step(b, v):
        sent = iris_jax.triton_call(b[0], v[0], kernel=race_kernels.store_to_next, grid=(1,), W=world, BLOCK=N,
                                    out_shape=jax.ShapeDtypeStruct((N,), jnp.float32))
        return iris_jax.psum(b[0], "i")[None], sent[None]

    _, found = _caught(lambda: jax.block_until_ready(partial_smap(mesh)(step, 2)(inbox, x)))
    assert found, "no race reported"
    report = found[0]
    assert 'array "inbox"' in report and "store_to_next" in report, report
    assert "load by rank" in report and "store by rank" in report, report
    if collectives == "host":
        assert "iris all_reduce(sum)" in report and "test_races.py" in report, report


def partial_smap(mesh):
    def smap(f, outputs):
        out_specs = P("i") if outputs == 1 else (P("i"),) * outputs
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=out_specs, check_vma=False))
    return smap


@pytest.mark.parametrize("collectives", ["kernels", "host"])
def test_ragged_all_to_all_is_not_reported(collectives):
    from tests.jax.test_ragged_all_to_all import _inputs, _want

    world = 4
    detecting(world, collectives=collectives)
    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    arrays = _inputs(world, 2, 24, 24, (3,), np.float32)
    program = jax.jit(jax.shard_map(lambda *a: iris_jax.ragged_all_to_all(*[v[0] for v in a], axis_name="i")[None],
                                    mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    got, found = _caught(lambda: np.asarray(program(*[jax.device_put(a, NamedSharding(mesh, P("i")))
                                                      for a in arrays])))
    assert not found, found[0]
    np.testing.assert_array_equal(got, _want(arrays))


@pytest.mark.parametrize("example", ["00_load_store.py", "03_message_passing.py", "06_pallas_all_reduce.py"])
def test_examples_are_not_reported(example):
    """With IRIS_DETECT_RACES=1 a race would raise RaceError and fail the script."""
    from tests.jax.helpers import run_python

    result = run_python([f"examples/{example}"], timeout=300, IRIS_DETECT_RACES="1",
                        XLA_FLAGS="--xla_force_host_platform_device_count=4")
    assert result.returncode == 0 and "OK:" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("bug", ["none", "read_before_flag", "plain_stores"])
def test_launched_ranks(bug):
    """One process per rank (python -m iris_core.sim): the same detector, in each rank's process."""
    from tests.jax.helpers import run_python

    code = race_kernels.NONE if bug == "none" else race_kernels.BUGS[bug]
    result = run_python(["-m", "iris_core.sim", "-n", "2", "--timeout", "240", "tests/jax/launched_races.py",
                         str(code)], timeout=300, IRIS_DETECT_RACES="warn")
    assert result.returncode == 0, result.stdout + result.stderr
    counts = [int(line.rsplit(" ", 1)[1]) for line in result.stdout.splitlines() if "RACES" in line]
    assert len(counts) == 2, result.stdout
    if bug == "none":
        assert counts == [0, 0], result.stdout
    else:
        assert sum(counts) > 0 and "data race on rank" in result.stdout, result.stdout
        assert 'array "data" (' in result.stdout or 'array "counter" (' in result.stdout, result.stdout


# -- Pallas kernels (iris_jax.pallas): their remote ops go through the same detector -------------------
def _run_pallas(world: int, kernel, *symmetric_kernels, grid=()):
    """`kernel` (race_kernels.pallas_ring's signature) over `world` ranks, then each of
    `symmetric_kernels` (tests/jax/pallas_kernels.py's contended and cas_lock); returns (the ring's
    output, RaceWarning messages)."""
    from iris_jax import pallas as ipl
    from tests.jax import pallas_kernels

    mesh = jax.make_mesh((world,), ("i",), devices=jax.devices()[:world])
    rows = NamedSharding(mesh, P("i"))
    n = pallas_kernels.N
    inbox = iris_jax.full((world * n,), pallas_kernels.POISON, jnp.float32, sharding=rows, name="inbox")
    flags = iris_jax.zeros((world * 4,), jnp.int32, sharding=rows, name="flags")
    x = jax.device_put(np.arange(world * n, dtype=np.float32), rows)

    def smapped(step, specs, out):
        return jax.jit(jax.shard_map(step, mesh=mesh, in_specs=specs, out_specs=out, check_vma=False))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = ipl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32), symmetric=(0, 1), grid=grid)
        out = np.asarray(smapped(step, (P("i"),) * 3, P("i"))(inbox, flags, x))
        for made in symmetric_kernels:
            lock = iris_jax.zeros((world,), jnp.int32, sharding=rows, name="lock")
            counter = iris_jax.zeros((world,), jnp.int32, sharding=rows, name="counter")
            step = ipl.pallas_call(made, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), symmetric=(0, 1))
            np.asarray(smapped(step, (P("i"),) * 2, P("i"))(lock, counter))
    return out.reshape(world, n), [str(w.message) for w in caught if issubclass(w.category, RaceWarning)]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("bug", race_kernels.PALLAS_BUGS)
def test_pallas_seeded_race_is_found(world, bug):
    detecting(world)
    _, found = _run_pallas(world, race_kernels.pallas_ring(bug))
    assert found, f"{bug} at {world} ranks: no race reported"
    report = found[0]
    assert f"kernel pallas_ring_{bug} at tests/jax/race_kernels.py:" in report, report
    assert 'array "inbox" (' in report and "to order them" in report, report


@pytest.mark.parametrize("world", [2, 4])
def test_pallas_kernels_are_not_reported(world):
    """The correct ring, then a lock taken with atomic_cas around plain remote loads and stores."""
    from tests.jax import pallas_kernels

    detecting(world)
    out, found = _run_pallas(world, race_kernels.pallas_ring(None), pallas_kernels.cas_lock)
    assert not found, found[0]
    x = np.arange(world * pallas_kernels.N, dtype=np.float32).reshape(world, -1)
    np.testing.assert_array_equal(out, np.roll(x * 2.0, 1, axis=0))


# -- what the detector does not see (docs/device-api.md "What it does not see"): each a seeded race --------
@pytest.mark.xfail(strict=True, reason="a peer's view of a rank is one number: acquiring program 1's release "
                   "counts program 0's earlier store as seen")
def test_hole_peer_sees_a_rank_as_one_number():
    detecting(2)
    _, found = run_programs(2, race_kernels.PEER_SEES_ONE_NUMBER, 2)
    assert found and 'array "tiles" (' in found[0], found


def test_loads_of_two_programs_checked_byte_by_byte():
    """Elements under 4 bytes: program 0's load, replaced in the rank's byte record by program 1's,
    is kept aside and checked by program 1's store (the word planes do the same)."""
    detecting(2)
    _, found = run_programs(2, race_kernels.READ_BY_BOTH, 2, jnp.int8)
    assert found and 'array "tiles" (' in found[0], found


@pytest.mark.xfail(strict=True, reason="between programs a rank keeps two loads per word (the launch's first "
                   "unseen one and its last): a store that saw both misses a third program's load between them")
def test_hole_a_load_between_two_kept():
    detecting(2)
    _, found = run_programs(2, race_kernels.READ_BETWEEN, 4)
    assert found and 'array "tiles" (' in found[0], found


@pytest.mark.xfail(strict=True, reason="a Pallas kernel's programs count as one thread of their rank")
def test_hole_pallas_programs_are_one_thread():
    detecting(2)
    _, found = _run_pallas(2, race_kernels.pallas_ring("programs_overlap"), grid=(2,))
    assert found and 'array "inbox" (' in found[0], found


@pytest.mark.xfail(strict=True, reason="a Pallas kernel's plain ref reads and writes act on interpret mode's "
                   "copies of its blocks, not on the heap, and are not checked")
def test_hole_pallas_plain_ref_accesses():
    detecting(2)
    _, found = _run_pallas(2, race_kernels.pallas_ring("ref_read"))
    assert found and 'array "inbox" (' in found[0], found
