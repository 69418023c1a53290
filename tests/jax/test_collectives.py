"""iris_jax collectives against the lax ops, on the CPU simulator.

Every collective, every implemented all-reduce variant and op, for groups of 2, 3, 4 and 8
ranks on 1-D meshes and over each axis and each tuple of axes of 2x2 and 2x4 meshes, in
float32, bfloat16, float16 and int32, on odd shapes (scalars, 1, 37, (3, 5), zero-size,
shapes that are not multiples of the simulator's 256-element block nor of the group size)
and with axis / scatter_dimension / split_axis / concat_axis other than 0, tiled and not.

Each (mesh, axes, dtype) runs every case in one jit of iris calls (chained, see after())
and one jit of the lax references, and also checks at trace time that each iris result
varies over the same mesh axes as lax's (the `check_vma` type). Inputs are random and
never zero; before each run the simulator's staging areas and the collective workspaces
are filled with a poison pattern, so an output element a kernel forgets to write cannot
pass as a zero or a stale value.

All modules share one runtime over the 8 CPU devices; meshes use the first 2, 3, 4 or 8. This
module's tests run twice: with the collectives on the host (init(sim_collectives="host"), the
default) and as kernels under the interpreter ("kernels").

The helpers here (run_cases, mesh_of, rand) are shared by the other test_collectives_*
modules.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax import compat
from iris_jax._runtime.workspace import workspaces
from iris_jax.calls.triton_call import vary, varying_axes
from tests.jax.helpers import use_runtime

F32, BF16, F16, I32 = jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32
SIXTEEN_BIT = (jnp.dtype(BF16), jnp.dtype(F16))
# reductions of 16-bit inputs: iris accumulates in float32 and rounds once, so it must be
# within about one ulp of the float32 reduction rounded to the dtype
REDUCE_TOL = {jnp.dtype(F32): 1e-5, jnp.dtype(BF16): 1e-2, jnp.dtype(F16): 2e-3, jnp.dtype(I32): 0}
POISON_BYTE = 0x7F  # float32/bfloat16 ~3.4e38, float16 NaN, int32 2139062143


# -- helpers shared by the collectives test modules ---------------------------------------
RUNTIME_DEVICES = 8
RUNTIME_HEAP = 64 << 20  # every partition of the ranks into groups gets its own workspace (~1.3 MiB)


SIM_COLLECTIVES = {"mode": None}  # how this module's tests run the collectives (None: the environment's)


@pytest.fixture(autouse=True, scope="module", params=["host", "kernels"])
def sim_collectives(request):
    """Every test of this module runs both ways: the collectives on the host (the simulator's
    default) and as the collective kernels under Triton's interpreter (as GPUs run them)."""
    SIM_COLLECTIVES["mode"] = request.param
    yield request.param
    SIM_COLLECTIVES["mode"] = None


def runtime():
    """The runtime of these tests: one over all 8 devices, (re)initialized if another is current."""
    return use_runtime(RUNTIME_DEVICES, RUNTIME_HEAP, sim_collectives=SIM_COLLECTIVES["mode"])


def mesh_of(shape, names):
    """A mesh over the first prod(shape) devices (a subset of the runtime's devices)."""
    runtime()
    return jax.make_mesh(tuple(shape), tuple(names), devices=jax.devices()[:math.prod(shape)])


def rand(rng, shape, dtype):
    """Random values, never zero: ints in +-[1, 999], floats ~N(0, 1) with |x| >= 1e-2."""
    dtype = jnp.dtype(dtype)
    if dtype == jnp.dtype(I32):
        v = rng.integers(1, 1000, shape) * rng.choice([-1, 1], shape)
        return np.asarray(v, np.int32)
    v = rng.standard_normal(shape).astype(np.float32)
    v = np.where(np.abs(v) < 1e-2, np.float32(0.5), v)
    return np.asarray(v).astype(dtype)


def shard(mesh, array, spec=None):
    return jax.device_put(array, NamedSharding(mesh, P(*mesh.axis_names) if spec is None else spec))


def poison():
    """Fills every rank's staging area (XLA buffers pass through it to the workers) and the
    data buffers (streamed ones too) of every collective workspace with POISON_BYTE; flags and epochs are left
    alone. A kernel must neither leave an output element unwritten nor rely on a zeroed
    workspace (accumulators and locks are its own to reset)."""
    from iris_jax.calls.cpu_execution import StagingAreas

    rt = iris_jax.runtime()
    pool = workspaces(rt)
    staging = rt.service("cpu_staging", lambda _: StagingAreas())
    for rank in range(rt.world_size):
        area = staging.for_rank(rank)
        with area.lock:
            area.ensure(1 << 20).buffer[:] = POISON_BYTE
        for ws in pool.allocated("collective"):  # one workspace per partition of the ranks and size class
            offset, layout = ws.offset, ws.layout
            data = rt.heap.host_view(rank, offset + layout.data, (4 * layout.data_bytes,), np.uint8)
            data[:] = POISON_BYTE
            del data
            # the streamed calls' buffers (after their `failed` line)
            sdata = rt.heap.host_view(rank, offset + layout.stream + 128, (2 * layout.stream_capacity,), np.uint8)
            sdata[:] = POISON_BYTE
            del sdata


@dataclass
class Case:
    """One comparison: `iris(v)` against `ref(v)` on a per-device input of `shape`."""

    name: str
    shape: tuple
    iris: Callable
    ref: Callable
    reduces: bool = False  # 16-bit: ref in float32, rounded; compared within REDUCE_TOL
    check_vma: bool = True  # the iris result's varying axes equal the ref's
    tol: float | None = None  # instead of REDUCE_TOL (reductions that round more than once)


def after(v, prev):
    """`v`, computed only once `prev` is: a data dependency that XLA cannot fold away (v is
    unchanged unless prev's first element is exactly a sentinel no result here takes).

    XLA's CPU runtime starts independent operations as soon as their inputs are ready, so
    two independent iris collectives can run in different orders on different ranks and
    pair up wrongly (see test_collectives_errors.py::test_independent_collectives_in_one_jit).
    The comparisons here chain every call to the previous one."""
    if prev is None or prev.size == 0:
        return v
    sentinel = 123456789 if jnp.issubdtype(prev.dtype, jnp.integer) else -1024.0
    return jnp.where(prev.reshape(-1)[0] == jnp.asarray(sentinel, prev.dtype), jnp.zeros_like(v), v)


def run_cases(mesh, cases, dtype, rng, *, check_vma=True):
    """Runs every case over `mesh` (inputs split over every mesh axis, one block of
    case.shape per device), iris in one jit with the calls chained one after the other,
    the lax references in another, and compares every device's result."""
    names = tuple(mesh.axis_names)
    lead = tuple(mesh.shape[a] for a in names)
    dtype = jnp.dtype(dtype)
    inputs = [shard(mesh, rand(rng, lead + tuple(c.shape), dtype)) for c in cases]
    vmas = {}

    def program(use_iris):
        def body(*xs):
            outs, prev = [], None
            for c, x in zip(cases, xs, strict=True):
                v = x.reshape(c.shape)
                if use_iris:
                    out = c.iris(after(v, prev))
                    prev = out if out.size else prev
                elif c.reduces and dtype in SIXTEEN_BIT:
                    out = c.ref(v.astype(F32)).astype(dtype)
                else:
                    out = c.ref(v)
                vmas.setdefault(c.name, [None, None])[0 if use_iris else 1] = varying_axes(out)
                outs.append(out.reshape((1,) * len(names) + out.shape))
            return outs

        return jax.jit(jax.shard_map(body, mesh=mesh, in_specs=tuple(P(*names) for _ in cases),
                                     out_specs=P(*names), check_vma=check_vma))

    compiled = program(True).trace(*inputs).lower().compile()  # lowering allocates the workspaces
    poison()
    got_all = jax.device_get(compiled(*inputs))
    want_all = jax.device_get(program(False)(*inputs))
    failures = []
    for c, got, want in zip(cases, got_all, want_all, strict=True):
        if check_vma and c.check_vma and vmas[c.name][0] != vmas[c.name][1]:
            failures.append(f"{c.name}: iris varies over {sorted(vmas[c.name][0])}, lax over "
                            f"{sorted(vmas[c.name][1])}")
        if got.shape != want.shape or got.dtype != want.dtype:
            failures.append(f"{c.name}: iris gives {got.dtype}{list(got.shape)}, lax {want.dtype}{list(want.shape)}")
            continue
        tol = (c.tol if c.tol is not None else REDUCE_TOL[dtype]) if c.reduces else 0
        try:
            np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=tol, atol=tol,
                                       err_msg=c.name)
        except AssertionError as e:
            failures.append(str(e))
    assert not failures, f"{len(failures)} of {len(cases)} cases differ ({dtype}):\n" + "\n".join(failures)
    return vmas


# -- the cases ------------------------------------------------------------------------------
EPS = {jnp.dtype(BF16): 2.0 ** -8, jnp.dtype(F16): 2.0 ** -11}
ONE_ROUNDING = ("auto", "one_shot", "two_shot")  # accumulate in float32, round once


def variants(dtype):
    """The all-reduce variants that sum `dtype` (atomic: float32 and int32 only)."""
    if jnp.dtype(dtype) in (jnp.dtype(F32), jnp.dtype(I32)):
        return ("one_shot", "two_shot", "ring", "atomic", "spinlock")
    return ("one_shot", "two_shot", "ring", "spinlock")


def _reduce_tol(dtype, G, variant):
    """ring and spinlock round every partial to the dtype: up to G - 1 roundings."""
    dtype = jnp.dtype(dtype)
    if variant in ONE_ROUNDING or dtype not in EPS:
        return None
    return max(REDUCE_TOL[dtype], 2 * G * EPS[dtype])


def reduction_cases(axes, G, full, dtype):
    ax = axes

    def ar(shape, op, variant):
        ref = {"sum": lax.psum, "max": lax.pmax, "min": lax.pmin}[op]
        return Case(f"all_reduce({shape}, {op}, {variant})", shape,
                    lambda v: iris_jax.all_reduce(v, ax, op, variant), lambda v: ref(v, ax), op == "sum",
                    tol=_reduce_tol(dtype, G, variant))

    cases = [
        Case("psum(37)", (37,), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
        Case("psum(3,5)", (3, 5), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
        Case("psum(scalar)", (), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
        Case("psum(0)", (0,), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
        Case("pmax(37)", (37,), lambda v: iris_jax.pmax(v, ax), lambda v: lax.pmax(v, ax)),
        Case("pmin(3,5)", (3, 5), lambda v: iris_jax.pmin(v, ax), lambda v: lax.pmin(v, ax)),
        ar((300,), "max", "two_shot"), ar((300,), "min", "ring"),
    ]
    # every variant on two tiles (lite) or three (full: with G = 2, member 0 reduces two of them)
    cases += [ar((517,) if full else (300,), "sum", variant) for variant in variants(dtype)]
    if full:
        cases += [
            Case("psum(1)", (1,), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
            Case("psum(2,0)", (2, 0), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
            Case("psum(2,3,4)", (2, 3, 4), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
            Case("psum(517)", (517,), lambda v: iris_jax.psum(v, ax), lambda v: lax.psum(v, ax), True),
            Case("pmax(scalar)", (), lambda v: iris_jax.pmax(v, ax), lambda v: lax.pmax(v, ax)),
            Case("pmin(1)", (1,), lambda v: iris_jax.pmin(v, ax), lambda v: lax.pmin(v, ax)),
            Case("pmax(0)", (0,), lambda v: iris_jax.pmax(v, ax), lambda v: lax.pmax(v, ax)),
            ar((3, 5), "sum", "auto"), ar((3, 5), "max", "auto"), ar((517,), "min", "one_shot"),
            ar((517,), "min", "two_shot"), ar((517,), "max", "ring"), ar((37,), "max", "one_shot"),
        ]
        # one tile (owned by member 0 in two-shot), a scalar, nothing at all
        cases += [ar(shape, "sum", variant) for variant in variants(dtype) for shape in ((37,), (), (0,))]
    return cases


def _pbroadcast_ref(v, axes, root):
    """lax.pbroadcast, which XLA lowers on GPUs only: the root's value summed with zeros
    (exact), then varying over the input's axes again (pbroadcast keeps the input's type)."""
    total = lax.psum(jnp.where(lax.axis_index(axes) == root, v, jnp.zeros_like(v)), axes)
    return vary(total, tuple(sorted(varying_axes(v))))


def movement_cases(axes, G, full):
    """all_gather, psum_scatter, all_to_all, ppermute, pshuffle, broadcast (psum_scatter reduces)."""
    ax = axes
    shift = [(i, (i + 1) % G) for i in range(G)]
    partial = [(i, i + 1) for i in range(G - 1)]  # member 0 receives nothing: zeros

    def ag(shape, axis, tiled):
        return Case(f"all_gather({shape}, axis={axis}, tiled={tiled})", shape,
                    lambda v: iris_jax.all_gather(v, ax, axis=axis, tiled=tiled),
                    lambda v: lax.all_gather(v, ax, axis=axis, tiled=tiled))

    def ps(shape, dim, tiled):
        return Case(f"psum_scatter({shape}, dim={dim}, tiled={tiled})", shape,
                    lambda v: iris_jax.psum_scatter(v, ax, scatter_dimension=dim, tiled=tiled),
                    lambda v: lax.psum_scatter(v, ax, scatter_dimension=dim, tiled=tiled), True)

    def a2a(shape, split, concat, tiled):
        return Case(f"all_to_all({shape}, split={split}, concat={concat}, tiled={tiled})", shape,
                    lambda v: iris_jax.all_to_all(v, ax, split, concat, tiled=tiled),
                    lambda v: lax.all_to_all(v, ax, split, concat, tiled=tiled))

    def pp(shape, perm, label):
        return Case(f"ppermute({shape}, {label})", shape, lambda v: iris_jax.ppermute(v, ax, perm),
                    lambda v: lax.ppermute(v, ax, perm))

    def shuffle(shape):  # member i receives member i + 1's value: source and destination not confused
        perm = [(i + 1) % G for i in range(G)]
        return Case(f"pshuffle({shape}, rotate)", shape, lambda v: iris_jax.pshuffle(v, ax, perm),
                    lambda v: lax.pshuffle(v, ax, perm))

    def bc(shape, root):
        # iris_jax.broadcast is lax.pbroadcast: the root's value, varying like the input
        return Case(f"broadcast({shape}, root={root})", shape, lambda v: iris_jax.broadcast(v, ax, root),
                    lambda v: _pbroadcast_ref(v, ax, root))

    cases = [
        ag((37,), 0, False), ag((3, 5), 1, True),
        ps((3, 2 * G), 1, True),
        a2a((2 * G, 3), 0, 1, True), a2a((2, G, 3), 1, 2, False),
        pp((3, 5), partial, "partial: member 0 receives nothing"),
        shuffle((3, 5)),
        bc((37,), G - 1),
    ]
    if full:
        cases += [
            ag((37,), 0, True), ag((3, 5), 1, False), ag((3, 5), 0, True), ag((2, 3, 4), 2, False),
            ag((2, 3, 4), 2, True), ag((), 0, False), ag((1,), 0, True), ag((0,), 0, False), ag((2, 0), 0, True),
            ag((2, 0), 1, False), ag((3, 5), -1, False), ag((3, 5), -1, True), ag((300,), 0, True),
            ps((3 * G,), 0, True), ps((G, 5), 0, False), ps((5, G), 1, False), ps((2, G, 3), 1, False),
            ps((37 * G,), 0, True), ps((G, 0), 0, False), ps((0, G), 1, False),
            # lax cannot lower a negative scatter_dimension; iris counts it from the end
            Case("psum_scatter((2, 2G, 3), dim=-2, tiled=True)", (2, 2 * G, 3),
                 lambda v: iris_jax.psum_scatter(v, ax, scatter_dimension=-2, tiled=True),
                 lambda v: lax.psum_scatter(v, ax, scatter_dimension=1, tiled=True), True),
            a2a((G, 5), 0, 1, False), a2a((3, G), 1, 0, False), a2a((3, 2 * G), 1, 0, True),
            a2a((3 * G, 5), 0, 0, True), a2a((2, G, 3), 1, 1, True), a2a((G, 300), 0, 1, False),
            a2a((G, 0), 0, 1, False),
            pp((37,), shift, "shift by one"), pp((), [(0, G - 1)], "one pair"),
            pp((300,), [(i, G - 1 - i) for i in range(G)], "reverse"), pp((0,), shift, "shift, zero-size"),
            pp((1,), [], "empty perm: zeros"),
            bc((3, 5), 0), bc((), G // 2), bc((0,), 0), bc((517,), 1),
        ]
    return cases


# -- the tests --------------------------------------------------------------------------------
ONE_D = [(G, dtype, full) for G in (2, 3, 4, 8)
         for dtype, full in ((F32, True), (I32, G < 8), (BF16, False), (F16, False))]


@pytest.mark.parametrize("G,dtype,full", ONE_D,
                         ids=[f"G{G}-{jnp.dtype(d).name}" for G, d, _ in ONE_D])
def test_1d_mesh_matches_lax(G, dtype, full, rng):
    mesh = mesh_of((G,), ("i",))
    run_cases(mesh, reduction_cases("i", G, full, dtype) + movement_cases("i", G, full), dtype, rng)


# 2-D meshes: over each axis and each tuple of axes, in both orders (members numbered like
# lax.axis_index of the tuple)
TWO_D = [((2, 2), axes, dtype, full)
         for axes, dtype, full in (("x", F32, True), ("y", F32, False), (("x", "y"), F32, True),
                                   (("y", "x"), F32, False), (("x", "y"), BF16, False), ("y", I32, False))]
TWO_D += [((2, 4), axes, dtype, full)
          for axes, dtype, full in (("x", F32, False), ("y", F32, False), (("x", "y"), F32, False),
                                    (("y", "x"), F32, False), ("y", F16, False), (("x", "y"), I32, False))]


def _axes_id(axes):
    return axes if isinstance(axes, str) else "+".join(axes)


@pytest.mark.parametrize("shape,axes,dtype,full", TWO_D,
                         ids=[f"{s[0]}x{s[1]}-{_axes_id(a)}-{jnp.dtype(d).name}" for s, a, d, _ in TWO_D])
def test_2d_mesh_matches_lax(shape, axes, dtype, full, rng):
    mesh = mesh_of(shape, ("x", "y"))
    G = math.prod(mesh.shape[a] for a in ((axes,) if isinstance(axes, str) else axes))
    with compat.ppermute_in_any_axis_order():  # jax 0.12's lax.ppermute refuses ("y", "x") by default
        run_cases(mesh, reduction_cases(axes, G, full, dtype) + movement_cases(axes, G, full), dtype, rng)


def test_ppermute_over_axes_out_of_mesh_order_fails_as_lax_does():
    mesh = mesh_of((2, 2), ("x", "y"))
    x = jax.device_put(jnp.arange(4 * 3, dtype=F32).reshape(2, 2, 3), NamedSharding(mesh, P("x", "y")))
    perm = [(i, (i + 1) % 4) for i in range(4)]
    results = {}
    for name, ppermute in (("lax", lax.ppermute), ("iris", iris_jax.ppermute)):
        f = jax.jit(jax.shard_map(lambda v, ppermute=ppermute: ppermute(v, ("y", "x"), perm), mesh=mesh,
                                  in_specs=P("x", "y"), out_specs=P("x", "y")))
        if compat.ppermute_axis_order_checked():
            with pytest.raises(RuntimeError, match="same order as the axis_names declared on the mesh"):
                f(x)
        with compat.ppermute_in_any_axis_order():
            results[name] = np.asarray(f(x))
    np.testing.assert_array_equal(results["iris"], results["lax"])


def test_2d_mesh_alternating_axes_with_a_late_rank(rng):
    """Calls over x, y, x, then both axes of a 2x2 mesh, rank 1 arriving 1 s late in the
    middle: the other ranks run ahead into calls with other partners meanwhile. (Regression:
    when flags were indexed by group position in one workspace shared by both axes, a peer of
    the next call could satisfy a wait early, then hang; now each axis has its own.)"""
    import time

    from jax.experimental import io_callback

    mesh = mesh_of((2, 2), ("x", "y"))
    x = shard(mesh, rand(rng, (2, 2 * 5), F32))

    def late(v):
        return io_callback(lambda a: (time.sleep(1.0), a)[1], jax.ShapeDtypeStruct(v.shape, v.dtype), v)

    def program(ps):
        def body(v):
            rank = lax.axis_index("x") * 2 + lax.axis_index("y")
            a = ps(v, "x")
            a = lax.cond(rank == 1, late, lambda a: a, a)
            b = ps(a * 2 + 1, "y")
            c = ps(b * 3 + rank.astype(v.dtype), "x")
            return ps(c, ("x", "y"))

        return np.asarray(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("x", "y"), out_specs=P("x", "y"),
                                                check_vma=False))(x))

    want = program(lax.psum)
    got = program(lambda v, a: iris_jax.all_reduce(v, a, timeout_s=60))  # far above rank 1's 1 s on any machine
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_invariant_input_is_summed_like_lax(rng):
    """psum / pmax of a value replicated over the axis (in_specs P()): lax multiplies."""
    mesh = mesh_of((3,), ("i",))
    x = shard(mesh, rand(rng, (7,), F32), P())

    def run(mod):
        def body(v):
            s = mod.psum(v, "i")
            return s, mod.pmax(after(v, s), "i")

        return jax.device_get(jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(), out_specs=P()))(x))

    (a, b), (c, d) = run(iris_jax), run(lax)
    np.testing.assert_allclose(a, c, rtol=1e-6)
    np.testing.assert_array_equal(b, d)


def test_check_vma_false(rng):
    """The same collectives with check_vma=False (no varying-axes types)."""
    mesh = mesh_of((3,), ("i",))
    cases = reduction_cases("i", 3, False, F32) + movement_cases("i", 3, False)
    cases += [Case("psum(0) unchecked", (0,), lambda v: iris_jax.psum(v, "i"), lambda v: lax.psum(v, "i")),
              Case("all_gather(2,0) unchecked", (2, 0), lambda v: iris_jax.all_gather(v, "i", axis=1),
                   lambda v: lax.all_gather(v, "i", axis=1))]
    run_cases(mesh, cases, F32, rng, check_vma=False)


def test_broadcast_from_every_root(rng):
    mesh = mesh_of((4,), ("i",))
    x = rand(rng, (4, 6), F32)
    def body(v):  # each broadcast after the previous one (see after())
        outs = []
        for r in range(4):
            outs.append(iris_jax.broadcast(after(v[0], outs[-1] if outs else None), "i", r)[None])
        return outs

    f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
    outs = f(shard(mesh, x))
    for r, out in enumerate(outs):
        np.testing.assert_array_equal(np.asarray(out), np.broadcast_to(x[r], (4, 6)))
