"""Scenarios of the multi-process GPU runs (tests/gpu/mp_script.py), checked against numpy on every rank.

Every process runs the same scenarios in the same order (SPMD). A scenario records each
mismatch and carries on, so that every rank makes the same kernel and collective calls
whatever it finds; at its end it fails, naming every mismatch. Numpy is the reference
because lax cannot be one when ranks share a GPU (NCCL refuses two ranks on one device).

    SCENARIOS: name -> (function, environment settings while it runs)
"""

from __future__ import annotations

import contextlib
import os
import time
import traceback

import numpy as np

SIZES = (37, 4099, (1 << 20) + 3)  # below a tile, a few tiles, 4 MiB of float32 (not multiples of anything)
SMALL, MID, LARGE = SIZES
ZERO_COPY_SIZE = (1 << 22) + 3  # 16 MiB of float32: inputs on the heap are read in place from here
TILE_SHAPE = (300, 517)  # partial 64 x 64 tiles at both edges
HAMMER = (132, 100)  # programs (one per SM) and atomic adds of each into rank 0's counter
BARRIER_ROUNDS = 100
VARIANTS = ("auto", "one_shot", "two_shot", "ring", "atomic", "spinlock")
DTYPES = ("float32", "bfloat16", "float16", "int32")
# (rtol, atol as a fraction of the largest expected magnitude); int32 and data movement are exact
TOLERANCE = {"float32": (1e-5, 1e-5), "bfloat16": (2e-2, 2e-2), "float16": (4e-3, 4e-3), "int32": (0, 0)}


# Larger worlds compile slower kernels (loops over the ranks unroll, and jax-triton compiles every
# kernel in every process): about 1.6 s per collective kernel at 2 ranks, 2-4 s at 4, 8-12 s at 8 on
# the H200 machine with the three worlds at once. So the collective matrix
# thins with the world (tier): 2 ranks every variant, kind, dtype and path; 4 ranks every variant and
# kind in float32 and the other dtypes and paths through a few kernels; 8 ranks every variant and
# kind once (float32, 2^20 + 3 elements, the default paths); scenarios whose kernels do not depend
# on the world size (atomics, tuple_hint) or that smaller worlds cover (the forced paths, zero-copy,
# the Pallas kernels at 2 and 4 ranks) do not run at the top tiers (UP_TO_TIER), so that the three
# worlds fit one 10-minute device call.
def tier(world) -> int:
    return _tier(world.size)


def _tier(size: int) -> int:
    return 0 if size < 4 else 1 if size < 8 else 2


class World:
    """This process's ranks in the run (one per local device: one in multi-process runs, every
    rank on the simulator): mesh, sharding, inputs, and the checks of the running scenario."""

    def __init__(self, out_dir: str, shared_gpu: bool = False):
        import jax
        from jax.sharding import Mesh, NamedSharding
        from jax.sharding import PartitionSpec as P

        import iris_jax

        self.runtime = iris_jax.runtime()
        devices = sorted(jax.devices(), key=lambda d: d.id)
        self.mesh = Mesh(np.array(devices), ("i",))  # mesh position == iris rank (see Runtime.rank_of)
        self.ranks = sorted(self.runtime.rank_of(d) for d in jax.local_devices())
        self.process, self.size, self.out_dir = jax.process_index(), len(devices), out_dir
        self.shared_gpu = shared_gpu  # every process's rank on one GPU (launcher's --shared)
        self.rows = NamedSharding(self.mesh, P("i"))
        self.failures: list[str] = []
        self.checks = 0

    # -- inputs and outputs ---------------------------------------------------------------------
    def put(self, blocks: np.ndarray, axis: int = 0):
        """A global array whose rank-r block along `axis` is blocks[r] (every process passes all blocks)."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        whole = np.concatenate(list(blocks), axis=axis)
        spec = P(*([None] * axis), "i")
        return jax.make_array_from_callback(whole.shape, NamedSharding(self.mesh, spec), lambda idx: whole[idx])

    def heap(self, blocks: np.ndarray, axis: int = 0):
        """Like put, on the symmetric heap, once every process's shards hold their blocks (a heap
        constructor fills only its own process's shards, and peers' kernels may write into them)."""
        import iris_jax

        array = iris_jax.to_heap(self.put(blocks, axis))
        iris_jax.barrier()
        return array

    def shard(self, a, rank: int) -> np.ndarray:
        """Rank's shard of `a` (read from its device now); rank must be one of self.ranks."""
        (data,) = [s.data for s in a.addressable_shards if self.runtime.rank_of(s.device) == rank]
        return np.asarray(data)

    def smap(self, f, in_specs, out_specs, check_vma: bool = True):
        import jax

        return jax.jit(jax.shard_map(f, mesh=self.mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check_vma))

    def inputs(self, n: int, dtype: str, seed: int) -> np.ndarray:
        """Every rank's input (W x n), the same in every process; float values are normals, ints in +-1000."""
        import jax.numpy as jnp

        rng = np.random.default_rng(seed)
        if dtype == "int32":
            return rng.integers(-1000, 1000, (self.size, n)).astype(np.int32)
        return rng.standard_normal((self.size, n)).astype(jnp.dtype(dtype))

    # -- checks -------------------------------------------------------------------------------
    def expect(self, what: str, got, want, dtype: str = "float32", exact: bool = False) -> None:
        """Records a mismatch of `got` (this rank's value) against numpy's `want`."""
        self.checks += 1
        got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
        rtol, atol = (0, 0) if exact else TOLERANCE[dtype]
        atol *= max(1.0, float(np.abs(want).max(initial=0)))
        try:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
        except AssertionError as e:
            self.failures.append(f"{what}: {str(e).strip()[:600]}")

    def require(self, what: str, condition: bool, detail: object = "") -> None:
        self.checks += 1
        if not condition:
            self.failures.append(f"{what}: {detail}")

    def attempt(self, what: str, check, *args) -> None:
        """Runs a check that asserts; records its AssertionError instead of raising (SPMD: go on)."""
        self.checks += 1
        try:
            check(*args)
        except AssertionError as e:
            self.failures.append(f"{what}: {str(e).strip()[:600]}")

    def say(self, text: str) -> None:
        print(f"process {self.process}: {text}", flush=True)


@contextlib.contextmanager
def _settings(env: dict[str, str]):
    """The environment while a scenario runs; its IRIS_COLLECTIVE_* variables become the collective
    config of the calls traced meanwhile (iris reads the environment once, so they go in as a config)."""
    import iris_jax

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with iris_jax.use_config(iris_jax.CollectiveConfig.from_env()):
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(world: World, name: str) -> bool:
    """Runs scenario `name`; prints `process P: scenario NAME OK|FAIL ...`; True when it passed.

    Reports, then waits for every process (a host barrier), also after a failure: a kernel's trap
    ends this process's CUDA context but not its part in the host barrier. Not after the
    scenarios that end in failed kernels (mp_script's ending sees to those)."""
    import jax

    fn, env = SCENARIOS[name]
    world.failures, world.checks = [], 0
    world.say(f"scenario {name} start (rank {','.join(map(str, world.ranks))} of {world.size}) "
              f"{' '.join(f'{k}={v}' for k, v in env.items())}".strip())
    start = time.monotonic()
    error = None
    with _settings(env):
        try:
            fn(world)
        except Exception:  # noqa: BLE001 - reported, and the run goes on with the next scenario
            error = traceback.format_exc()
    if name not in ENDS_IN_FAILED_KERNELS:  # this process's kernels finished
        try:
            world.runtime.backend.wait_for_devices(jax.local_devices()[:1])
            jax.effects_barrier()
        except Exception:  # noqa: BLE001
            error = (error or "") + "after the scenario: " + traceback.format_exc()
    seconds = time.monotonic() - start
    passed = error is None and not world.failures
    if passed:
        world.say(f"scenario {name} OK {seconds:.1f} s, {world.checks} checks")
    else:
        details = "\n".join(world.failures[:8] + ([error] if error else []))
        world.say(f"scenario {name} FAIL {seconds:.1f} s, {len(world.failures)} of {world.checks} checks failed"
                  f"{', raised' if error else ''}\n{details}")
    if name not in ENDS_IN_FAILED_KERNELS:  # (after those, a process whose call never returned is ended instead)
        world.runtime.sync_processes()  # every process finished it before the next one starts
    return passed


# -- collectives ---------------------------------------------------------------------------------
def _collective_batch(world: World, what: str, n: int, dtype: str, calls) -> None:
    """One jitted program running every (name, iris fn, out spec, expected) of `calls` on one input."""
    from jax.sharding import PartitionSpec as P

    xs = world.inputs(n, dtype, seed=n * 7 + DTYPES.index(dtype))
    x = world.put(xs)
    f = world.smap(lambda v: tuple(fn(v) for _, fn, _, _ in calls), P("i"), tuple(spec for _, _, spec, _ in calls))
    outs = f(x)
    wide = xs.astype(np.float64)
    for (name, _, _, expected), out in zip(calls, outs, strict=True):
        for me in world.ranks:
            world.expect(f"{what}{name} n={n} {dtype} on rank {me}", world.shard(out, me), expected(wide, me), dtype)


def _all_reduce_calls(world: World, dtype: str, variants=VARIANTS, ops=("sum",)):
    from jax.sharding import PartitionSpec as P

    import iris_jax

    reduce = {"sum": lambda xs, _: xs.sum(0), "max": lambda xs, _: xs.max(0), "min": lambda xs, _: xs.min(0)}
    calls = []
    for op in ops:
        for variant in variants:
            if (variant in ("atomic", "spinlock") and op != "sum") or (variant == "atomic" and dtype not in (
                    "float32", "int32")):
                continue  # unsupported: iris raises at trace time (tests/jax/test_collectives_errors.py)
            calls.append((f"all_reduce({op}, {variant})",
                          lambda v, op=op, variant=variant: iris_jax.all_reduce(v, "i", op=op, variant=variant),
                          P(), reduce[op]))
    return calls


KINDS = ("pmax", "pmin", "all_gather", "psum_scatter", "all_to_all", "ppermute", "broadcast")
STREAMING_KINDS = ("all_gather", "psum_scatter", "all_to_all")  # with psum: every member sends to every other


def _every_collective(world: World, n: int, dtype: str, variants=VARIANTS, kinds=KINDS) -> None:
    """all_reduce through `variants`, then the other collectives `kinds` (tests/gpu/cases.py), in one program."""
    from tests.gpu.cases import collective_cases, numpy_reference

    others = [(name, fn, spec, lambda xs, me, name=name: numpy_reference(name, xs, me))
              for name, fn, _, spec in collective_cases(n, world.size) if name in kinds]
    _collective_batch(world, "", n, dtype, _all_reduce_calls(world, dtype, variants) + others)


def all_reduce_and_collectives(world: World) -> None:
    """Every all-reduce variant and every other collective. 2 ranks: float32 at 37 elements (fewer
    than a tile; some ranks' split blocks hold nothing), 4099 and 2^20 + 3, every dtype at 4099,
    all_reduce max/min through every variant that has them. 4 ranks: float32 at 2^20 + 3, the
    variants and split kinds at 37, the other dtypes through auto and some kinds at 4099. 8 ranks:
    float32 at 2^20 + 3."""
    if tier(world) == 0:
        for n, dtype in [(SMALL, "float32")] + [(MID, d) for d in DTYPES] + [(LARGE, "float32")]:
            _every_collective(world, n, dtype)
        _every_collective(world, LARGE, "bfloat16", variants=("auto",))
        _collective_batch(world, "", MID, "float32", _all_reduce_calls(world, "float32", ops=("max", "min")))
        return
    _every_collective(world, LARGE, "float32")
    if tier(world) == 1:
        _every_collective(world, SMALL, "float32", kinds=("psum_scatter", "all_to_all", "ppermute"))
        for dtype in ("bfloat16", "float16", "int32"):
            _every_collective(world, MID, dtype, variants=("auto",), kinds=("all_gather", "psum_scatter"))


@contextlib.contextmanager
def _launches():
    """The keyword arguments of every collective kernel launch traced inside (what really ran)."""
    from iris_jax.collectives import lowering

    seen, real = [], lowering.triton_call

    def spy(*args, **kwargs):
        seen.append(kwargs)
        return real(*args, **kwargs)

    lowering.triton_call = spy
    try:
        yield seen
    finally:
        lowering.triton_call = real


def pushed(world: World) -> None:
    """Every size pushes in chunks and nothing streams (as arrays too large to stream do)."""
    with _launches() as seen:
        if tier(world) == 0:
            for n, dtype in ((MID, "float32"), (LARGE, "bfloat16")):
                _every_collective(world, n, dtype, variants=("one_shot",))
        else:
            _every_collective(world, LARGE, "float32", variants=("one_shot",), kinds=STREAMING_KINDS)
    world.require("some launches pushed", any(k["PUSH"] for k in seen), [k["KIND"] for k in seen])
    world.require("no launch streamed", not any(k["STREAM"] for k in seen))


def streamed(world: World) -> None:
    """Every one-chunk call of the kinds that can stream streams."""
    with _launches() as seen:
        if tier(world) == 0:
            for n, dtype in ((SMALL, "float32"), (MID, "int32"), (LARGE, "float16")):
                _every_collective(world, n, dtype, variants=("auto",))
        else:
            _every_collective(world, LARGE, "float32", variants=("auto",), kinds=STREAMING_KINDS)
    world.require("some launches streamed", any(k["STREAM"] for k in seen), [k["KIND"] for k in seen])


def chunked(world: World) -> None:
    """Blocks and chunks of at most 64 KiB: a 4 MiB call runs in 64 chunks, pulled and pushed."""
    if tier(world) == 0:
        _every_collective(world, LARGE, "float32")
        with _settings({"IRIS_COLLECTIVE_PUSH_FROM": "0", "IRIS_COLLECTIVE_STREAM_UNTIL": "0"}):
            _every_collective(world, LARGE, "bfloat16", variants=("one_shot",))
    else:
        _every_collective(world, LARGE, "float32", variants=("one_shot", "ring"), kinds=("all_gather",))


def zero_copy(world: World) -> None:
    """Inputs of 16 MiB that already lie on the heap: peers read them in place (2 and 4 ranks)."""
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.cases import numpy_reference

    n = ZERO_COPY_SIZE
    xs = world.inputs(n, "float32", seed=5)
    x = world.heap(xs)
    f = world.smap(lambda v: (iris_jax.psum(v, "i"), iris_jax.all_gather(v, "i"), iris_jax.ppermute(
        v, "i", [(i, (i + 1) % world.size) for i in range(world.size)])), P("i"), (P(), P("i"), P("i")))
    total, gathered, permuted = f(x)
    wide = xs.astype(np.float64)
    for me in world.ranks:
        world.expect("psum of a heap input", world.shard(total, me), wide.sum(0))
        world.expect("all_gather of a heap input", world.shard(gathered, me), wide)
        world.expect("ppermute of a heap input", world.shard(permuted, me), numpy_reference("ppermute", wide, me))


# -- kernels, atomics, barrier -------------------------------------------------------------------
def kernels(world: World) -> None:
    """Remote stores and loads around the ring, an atomic hammer from every SM, ping-pong through
    flags between rank pairs, a kernel in a fori_loop (check_vma), and both launch paths."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.kernels import hammer, ping_pong
    from tests.jax.kernels import read_local, ring_load, ring_store

    W = world.size
    for n, hint in ((SMALL, None), (MID, 16), (LARGE, 16)):
        xs = world.inputs(n, "float32", seed=n)
        buf = iris_jax.full((W * n,), -7.0, jnp.float32, sharding=world.rows)
        iris_jax.barrier()  # every rank's buf is poisoned before any rank stores into it
        x = world.put(xs)
        out_t = jax.ShapeDtypeStruct((n,), jnp.float32)
        grid = (-(-n // 1024),)
        store = world.smap(lambda b, x, n=n, hint=hint, grid=grid, out_t=out_t: iris_jax.triton_call(
            b, x, n, kernel=ring_store, out_shape=out_t, grid=grid, W=W, BLOCK=1024, HINT=hint, symmetric=(0,)),
            (P("i"), P("i")), P("i"))
        out = store(buf, x)
        for me in world.ranks:
            world.expect(f"ring_store out n={n}", world.shard(out, me), xs[me] * 2 + me, exact=True)
        iris_jax.barrier()
        read = world.smap(lambda b, n=n, grid=grid, out_t=out_t: iris_jax.triton_call(
            b, n, kernel=read_local, out_shape=out_t, grid=grid, BLOCK=1024), P("i"), P("i"))
        got = read(buf)
        for me in world.ranks:
            world.expect(f"ring_store landed n={n}", world.shard(got, me), xs[(me - 1) % W], exact=True)
        load = world.smap(lambda b, n=n, grid=grid, out_t=out_t: iris_jax.triton_call(
            b, n, kernel=ring_load, out_shape=out_t, grid=grid, W=W, BLOCK=1024, symmetric=(0,)), P("i"), P("i"))
        got = load(buf)
        for me in world.ranks:
            world.expect(f"ring_load n={n}", world.shard(got, me), xs[me], exact=True)

    counter = iris_jax.zeros((W * 64,), jnp.int32, sharding=world.rows)
    iris_jax.barrier()  # every rank zeroed its counter before any rank adds into rank 0's
    programs, iters = HAMMER
    world.smap(lambda c: iris_jax.triton_call(
        c, kernel=hammer, out_shape=jax.ShapeDtypeStruct((programs,), jnp.int32), grid=(programs,), ITERS=iters, W=W,
        symmetric=(0,)), P("i"), P("i"))(counter).block_until_ready()
    iris_jax.barrier()
    for me in world.ranks:
        expected = np.zeros(64, np.int32)
        expected[0] = W * programs * iters if me == 0 else 0
        world.expect("hammer counter", world.shard(counter, me), expected, exact=True)

    if W % 2 == 0:
        flags = iris_jax.zeros((W * 128,), jnp.int32, sharding=world.rows)
        data = iris_jax.zeros((W * 128,), jnp.int32, sharding=world.rows)
        iris_jax.barrier()
        res = world.smap(lambda f, d: iris_jax.triton_call(
            f, d, kernel=ping_pong, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(1,), ROUNDS=101, W=W,
            symmetric=(0, 1)), (P("i"), P("i")), P("i"))(flags, data)
        for me in world.ranks:  # odd ranks receive last
            world.expect("ping_pong", world.shard(res, me), [100 if me % 2 == 0 else 101], exact=True)
        iris_jax.barrier()

    n = 1000
    buf = iris_jax.zeros((W * n,), jnp.float32, sharding=world.rows)
    iris_jax.barrier()
    out_t = jax.ShapeDtypeStruct((n,), jnp.float32)

    def body(buf, x):
        step = lambda i, acc: iris_jax.triton_call(buf, acc, n, kernel=ring_store, out_shape=out_t, grid=(1,), W=W,
                                                   BLOCK=1024, HINT=None) * 0.5
        return jax.lax.fori_loop(0, 10, step, x)

    out = world.smap(body, (P("i"), P("i")), P("i"))(buf, world.put(np.ones((W, n), np.float32)))
    for me in world.ranks:  # acc <- acc + rank / 2, ten times
        world.expect("fori_loop with check_vma", world.shard(out, me), np.full(n, 1 + 10 * me / 2))
    iris_jax.barrier()

    for mode, target in (("ffi", "iris_triton_kernel_call"), ("legacy", "triton_kernel_call_ffi")):
        with _settings({"IRIS_TRITON_CALL": mode}):
            xs = np.arange(W * 301, dtype=np.float32).reshape(W, 301)
            x = world.put(xs)
            f = world.smap(lambda v: iris_jax.psum(v * 2, "i") + 1, P("i"), P())
            if not world.runtime.backend.interprets_kernels:  # (the simulator has its own lowering)
                world.require(f"{mode} launch path",
                              f'custom_call_target="{target}"' in f.lower(x).compile().as_text())
            out = f(x)
            for me in world.ranks:
                world.expect(f"psum through the {mode} launch path", world.shard(out, me), xs.sum(0) * 2 + 1)


def atomics(world: World) -> None:
    """Every atomic (add, sub, xchg, xor, and, or, min, max, cas) with every sem/scope/hint on
    both neighbours' heaps, returned old values and final memory (tests/core/test_atomics.py's
    kernel and expectations; int32 every combination, uint32 and float32 a few); then every rank
    and program hammering rank 0's counters with relaxed and acq_rel atomics of six kinds."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.core import test_atomics as A
    from tests.gpu.kernels import every_atomic, mixed_hammer

    W = world.size
    for dtype_name in ("int32", "uint32", "float32"):
        dtype = A.DTYPES[dtype_name]
        rng = np.random.default_rng(W * 10 + list(A.DTYPES).index(dtype_name))
        combos = A.combos_for(dtype_name)
        C, D, K, B = len(combos), 2, len(A.OPS), A.BLOCK
        init = np.stack([A.random_values(rng, dtype, (C, D, K, B)) for _ in range(W)])
        vals = np.stack([A.random_values(rng, dtype, (2, B)) for _ in range(W)])
        even = np.arange(B) % 2 == 0
        cmps = np.empty((W, C, D, B), dtype)
        for r in range(W):
            for d, peer in enumerate([(r + 1) % W, (r - 1) % W]):
                # cas: even lanes hold the peer's current value (swap), odd lanes do not
                peer_cas = init[peer][:, d, A.OPS.index("cas")]
                cmps[r, :, d] = np.where(even, peer_cas, peer_cas + 1)
        # one target and one old-value array per combination, each on the heap as a whole (a
        # slice taken inside jit would be XLA's copy, off the heap)
        targets = [world.heap(init[:, c]) for c in range(C)]
        olds = [world.heap(np.full((W, D, K, 2, B), A.POISON[dtype_name], dtype)) for _ in range(C)]
        val = world.put(vals)
        for c, (sem, scope, hint) in enumerate(combos):
            hint = hint if world.runtime.backend.interprets_kernels else _gpu_hint(hint)
            f = world.smap(lambda t, o, v, m, sem=sem, scope=scope, hint=hint: iris_jax.triton_call(
                t, o, v, m, A.N, kernel=every_atomic, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                grid=(1,), W=W, BLOCK=B, NUM_OPS=K, INT_OPS=dtype.kind in "iu", SEM=sem, SCOPE=scope, HINT=hint,
                DEFAULTS=sem is None, symmetric=(0, 1)), (P("i"),) * 4, P("i"))
            f(targets[c], olds[c], val, world.put(cmps[:, c])).block_until_ready()
        iris_jax.barrier()  # every rank's atomics landed
        for me in world.ranks:
            want_memory, want_old = _atomics_expected(A, me, W, dtype_name, combos, init, vals, cmps)
            got_memory = np.stack([world.shard(t, me) for t in targets])
            got_old = np.stack([world.shard(o, me) for o in olds])
            for c, combo in enumerate(combos):
                for k, op in enumerate(A.OPS):
                    where = f"atomic_{op} {combo} {dtype_name} on rank {me}"
                    world.require(f"memory after {where}", np.array_equal(A.bits(got_memory[c, :, k]),
                                                                          A.bits(want_memory[c, :, k])),
                                  f"got {got_memory[c, :, k, :4]}, want {want_memory[c, :, k, :4]}")
                    world.require(f"old values of {where}", np.array_equal(A.bits(got_old[c, :, k]),
                                                                           A.bits(want_old[c, :, k])),
                                  f"got {got_old[c, :, k, :, :4]}, want {want_old[c, :, k, :, :4]}")

    programs, iters = A.HAMMER_PROGRAMS, A.HAMMER_ITERS
    counter = world.heap(np.array([[0 if r == 0 else -5] for r in range(W)], np.int32))
    initial = np.array([0, 0, -1, 1 << 30, 0, 0], np.int32)
    counters = world.heap(np.stack([initial if r == 0 else np.full(6, -5, np.int32) for r in range(W)]))
    olds = world.smap(lambda c: iris_jax.triton_call(
        c, kernel=A.hammer_kernel, out_shape=jax.ShapeDtypeStruct((programs, iters), jnp.int32), grid=(programs,),
        W=W, ITERS=iters, symmetric=(0,)), P("i"), P("i"))(counter)
    world.smap(lambda c: iris_jax.triton_call(
        c, kernel=mixed_hammer, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32), grid=(programs,), W=W,
        ITERS=A.MIXED_ITERS, LANES=A.LANES, symmetric=(0,)), P("i"), P("i"))(counters).block_until_ready()
    iris_jax.barrier()
    total = W * programs * iters
    for me in world.ranks:
        mine = world.shard(olds, me).ravel()
        world.require("hammer: distinct old values", len(np.unique(mine)) == mine.size and mine.min() >= 0 and
                      mine.max() < total, f"{mine.min()}..{mine.max()}, {len(np.unique(mine))} distinct of {mine.size}")
        world.expect("hammer counter", world.shard(counter, me), [total if me == 0 else -5], exact=True)
    rank, pid, i, lane = np.meshgrid(np.arange(W), np.arange(programs), np.arange(A.MIXED_ITERS),
                                     np.arange(A.LANES), indexing="ij")
    value = (rank * 7919 + pid * 1031 + i * 31 + lane * 4099) % 100003
    expected = np.array([value.size, np.bitwise_xor.reduce((value * 977).ravel()), value.max(), value.min(),
                         np.bitwise_or.reduce((1 << ((rank * 5 + pid * 3 + i + lane) % 31)).ravel()),
                         -2 * np.count_nonzero(lane % 3 != 0)], np.int32)
    for me in world.ranks:
        world.expect("mixed hammer counters", world.shard(counters, me), expected if me == 0 else np.full(6, -5),
                     exact=True)


def _gpu_hint(hint):
    """A tuple hint passed as a kernel's constexpr parameter does not compile on GPUs (triton 3.6:
    tl.multiple_of gets constexpr((16,)) and wants int elements; scenario `tuple_hint`), so the
    atomics pass its int (1-D: the same hint)."""
    return hint[0] if isinstance(hint, tuple) and len(hint) == 1 else hint


def tuple_hint(world: World) -> None:
    """A store whose hint is a tuple, passed through a constexpr parameter (test_atomics' ("cta", (16,)) case)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.jax.kernels import ring_store

    W, n = world.size, MID
    xs = world.inputs(n, "float32", seed=11)
    buf = iris_jax.full((W * n,), -7.0, jnp.float32, sharding=world.rows)
    iris_jax.barrier()
    out = world.smap(lambda b, x: iris_jax.triton_call(
        b, x, n, kernel=ring_store, out_shape=jax.ShapeDtypeStruct((n,), jnp.float32), grid=(-(-n // 1024),), W=W,
        BLOCK=1024, HINT=(16,), symmetric=(0,)), (P("i"), P("i")), P("i"))(buf, world.put(xs))
    for me in world.ranks:
        world.expect("ring_store with hint=(16,)", world.shard(out, me), xs[me] * 2 + me, exact=True)


def _atomics_expected(A, q, W, dtype_name, combos, init, vals, cmps):
    """Rank q's memory and returned old values after atomics_kernel on every rank (as test_atomics)."""
    dtype = A.DTYPES[dtype_name]
    B = A.BLOCK
    memory = init[q].copy()
    old = np.full((len(combos), 2, len(A.OPS), 2, B), A.POISON[dtype_name], dtype)
    lanes = np.arange(B) < A.N
    for d, (peer, writer) in enumerate([((q + 1) % W, (q - 1) % W), ((q - 1) % W, (q + 1) % W)]):
        for k, op in enumerate(A.OPS):
            if dtype.kind == "f" and op in A.INT_ONLY:
                continue
            live = np.ones(B, bool) if op == "cas" else lanes
            for c in range(len(combos)):
                v1, v2 = vals[writer]
                first = (cmps[writer][c, d], v1) if op == "cas" else v1
                second = (v1, v2) if op == "cas" else v2
                mid = A.reference(op, init[q][c, d, k], first)
                memory[c, d, k] = np.where(live, A.reference(op, mid, second), init[q][c, d, k])
                v1, v2 = vals[q]
                first = (cmps[q][c, d], v1) if op == "cas" else v1
                start = init[peer][c, d, k]
                old[c, d, k, 0, live] = start[live]
                old[c, d, k, 1, live] = A.reference(op, start, first)[live]
    return memory, old


def device_barrier(world: World, rounds: int = BARRIER_ROUNDS) -> None:
    """Device barriers between kernels, `rounds` back to back; then a value stored into the next rank
    before a barrier is there after it."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.kernels import read_after
    from tests.jax.kernels import ring_store

    W = world.size
    xs = np.arange(W * 3.0, dtype=np.float32).reshape(W, 3)
    f = world.smap(lambda v: iris_jax.device_barrier(v * 2), P("i"), (P("i"), P("i")))
    x = world.put(xs)
    for _ in range(rounds):
        status, y = f(x)
    for me in world.ranks:
        world.attempt("device_barrier status", iris_jax.check_barrier, world.shard(status, me))
        world.expect("device_barrier passes its arrays through", world.shard(y, me), xs[me] * 2, exact=True)

    # each rank stores into the next rank's inbox, then a barrier, then reads its own inbox
    n = 37
    inbox = iris_jax.full((W * n,), -7.0, jnp.float32, sharding=world.rows)
    iris_jax.barrier()
    xs = world.inputs(n, "float32", seed=3)
    out_t = jax.ShapeDtypeStruct((n,), jnp.float32)

    def step(inbox, x):
        stored = iris_jax.triton_call(inbox, x, n, kernel=ring_store, out_shape=out_t, grid=(1,), W=W, BLOCK=64,
                                      HINT=None, symmetric=(0,))
        status, stored = iris_jax.device_barrier(stored)
        # status is an (unused) argument of the read: it runs after the barrier (device_barrier's docstring)
        return status, iris_jax.triton_call(inbox, status, n, kernel=read_after, out_shape=out_t, grid=(1,),
                                            BLOCK=64), stored

    status, got, _ = world.smap(step, (P("i"), P("i")), (P("i"), P("i"), P("i")))(inbox, world.put(xs))
    for me in world.ranks:
        world.attempt("device_barrier status after the stores", iris_jax.check_barrier, world.shard(status, me))
        world.expect("store, device_barrier, load", world.shard(got, me), xs[(me - 1) % W], exact=True)


def tracing(world: World) -> None:
    """Device tracing in every process; rank 0 exports every rank's events (peers' read through
    CUDA IPC), aligned on the first barrier; a traced library psum on every rank."""
    import json

    import iris_jax
    from tests.gpu import test_gpu_tracing as T

    W = world.size
    # (not iris_jax.arange: placing a host array on a multi-process sharding makes JAX compare it
    # across processes with an all-gather, through NCCL, which refuses two ranks on one GPU)
    x = world.heap(np.arange(W * T.N, dtype=np.float32).reshape(W, T.N))
    iris_jax.tracing.enable(max_events=64)
    try:
        out, status = T._step(world.mesh, W)(x)
        for me in world.ranks:
            world.attempt("traced barrier status", iris_jax.check_barrier, world.shard(status, me))
            world.expect("traced read_next", world.shard(out, me), np.arange(W * T.N).reshape(W, T.N)[(me + 1) % W],
                         exact=True)
        iris_jax.barrier()  # every rank's kernels finished: any process may read every rank
        world.attempt("events of every rank", T._check_events, iris_jax.tracing.read(), W)
        if 0 in world.ranks:
            (path,) = iris_jax.tracing.export(os.path.join(world.out_dir, f"trace_w{W}.json"))
            doc = json.load(open(path))
            world.require("exported ranks", {e["pid"] for e in doc["traceEvents"] if e["ph"] == "X"} == set(range(W)))
            world.attempt("exported trace aligned on the barrier", T._check_aligned, doc, W)
        iris_jax.barrier()
        world.attempt("traced psum", T._check_traced_psum, world.mesh, W)
        iris_jax.barrier()
    finally:
        iris_jax.tracing.disable()


# -- fused ops and tile-level collectives ----------------------------------------------------------
def fused(world: World) -> None:
    """iris_jax.ops forced fused (two matmul_all_reduce back to back, all_gather_matmul,
    matmul_reduce_scatter) on shapes that are not multiples of the tiles, float32 and bfloat16."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    from iris_jax import ops

    W = world.size
    M, K, N = 200 - 200 % W, 136, 184
    for dtype_name in ("float32", "bfloat16"):
        dtype = jnp.dtype(dtype_name)
        rng = np.random.default_rng(M + K)
        a_row, b_row, a_col, b_col = ((rng.standard_normal((W,) + s) / 4).astype(dtype)
                                      for s in ((M, K), (K, N), (M, K), (K, N)))

        def run(a_row, b_row, a_col, b_col):
            return (ops.matmul_all_reduce(a_row, b_row, "i", impl="fused"),
                    ops.matmul_all_reduce(a_row * 2, b_row, "i", impl="fused"),
                    ops.all_gather_matmul(a_col, b_col, "i", impl="fused"),
                    ops.matmul_reduce_scatter(a_row, b_row, "i", impl="fused"))

        f = world.smap(run, (P(None, "i"), P("i", None), P("i", None), P(None, "i")),
                       (P(), P(), P(None, "i"), P("i")))
        outs = f(world.put(a_row, 1), world.put(b_row, 0), world.put(a_col, 0), world.put(b_col, 1))
        w = lambda a: a.astype(np.float64)
        total = sum(w(a_row[r]) @ w(b_row[r]) for r in range(W))
        rows = M // W
        tol = 2e-3 if dtype_name == "float32" else 3e-2
        for me in world.ranks:
            wants = (total, 2 * total, np.concatenate([w(a) for a in a_col]) @ w(b_col[me]),
                     total[me * rows:(me + 1) * rows])
            for name, out, want in zip(("matmul_all_reduce", "matmul_all_reduce x2", "all_gather_matmul",
                                        "matmul_reduce_scatter"), outs, wants, strict=True):
                world.checks += 1
                got = np.asarray(world.shard(out, me), np.float64)
                scale = float(np.abs(want).max())
                if not np.allclose(got, want, rtol=tol, atol=tol * scale):
                    world.failures.append(f"{name} {dtype_name} on rank {me}: largest error "
                                          f"{np.abs(got - want).max():.3g} (scale {scale:.3g})")


def tiles(world: World) -> None:
    """Every tile-level Context collective on M x N = TILE_SHAPE (partial tiles at both edges),
    tests/core/test_tile_collectives.py's kernel and expectations."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.core import tile_kernels as K
    from tests.core.test_tile_collectives import expected
    from tests.gpu.kernels import tile_collective_call

    W = world.size
    (M, N), BM, BN = TILE_SHAPE, 64, 64
    for op in (K.ATOMIC, K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER, K.ALL_GATHER_ROWS, K.ALL_GATHER_COLS,
               K.GATHER, K.ALL_TO_ALL):
        n = W * BN if op == K.ALL_TO_ALL else N
        dst_shape = (W * M, n) if op == K.ALL_GATHER_ROWS else (M, W * n) if op == K.ALL_GATHER_COLS else (M, n)
        xs = np.stack([np.arange(M * n, dtype=np.float32).reshape(M, n) * (r + 1) + r / 10 for r in range(W)])
        x = world.heap(xs)
        src = world.heap(np.full((W, M, n), np.nan, np.float32))
        dst = world.heap(np.full((W,) + dst_shape, 0.0 if op in (K.ATOMIC, K.SPINLOCK) else -7.0, np.float32))
        locks = world.heap(np.zeros((W, 4096), np.int32))
        grid = (-(-M // BM), -(-n // BN))
        call = world.smap(lambda x, s, d, lk, op=op, n=n, grid=grid: iris_jax.triton_call(
            x, s, d, lk, M, n, kernel=tile_collective_call, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
            grid=grid, OP=op, W=W, BM=BM, BN=BN, NPR=BN, num_warps=4, symmetric=(0, 1, 2, 3)), (P("i"),) * 4, P("i"))
        call(x, src, dst, locks).block_until_ready()
        iris_jax.barrier()  # every rank's tiles landed
        sums = op in (K.ATOMIC, K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER)  # in any order: rounding
        for me in world.ranks:
            world.expect(f"tile collective {op}", world.shard(dst, me), expected(op, list(xs), me, BM, BN, BN),
                         exact=not sums)


# -- Pallas kernels with iris (experimental) -------------------------------------------------------
PALLAS_ADD_PROGRAMS = 8  # programs of every rank adding into rank 0's counters
PALLAS_LOCK_ROUNDS = {"gpu": 50, "sim": 5}  # lock rounds of every rank (each simulated remote op is a callback)


def pallas(world: World) -> None:
    """iris_jax.pallas kernels across the ranks (tests/jax/pallas_kernels.py; Pallas's Triton
    backend on GPUs, interpret mode on the simulator): a ring put with flags (release add, acquire
    wait), every atomic contended by every rank's programs on every rank, adds into rank 0's
    counters with each sem (the old values distinct), a CAS lock on rank 0 around a plain remote
    read-modify-write (no lost update), and examples/06_pallas_all_reduce.py's one-shot all-reduce
    in two epochs on the same flags. Every kernel's output starts poisoned (aliased to a poisoned
    input), and heap arrays that peers write start poisoned too."""
    import jax
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax import pallas as ipl
    from tests.jax import pallas_kernels as K

    W = world.size

    def program(kernel, count, shape, dtype, poison, grid=(), symmetric=()):
        """kernel(ctx, *count inputs, out) on the mesh; its output of `shape` per rank starts as `poison`."""
        call = ipl.pallas_call(K.poisoned_output(kernel, count), out_shape=jax.ShapeDtypeStruct(shape, dtype),
                               grid=grid, symmetric=symmetric, input_output_aliases={count: 0})
        step = world.smap(call, (P("i"),) * (count + 1), P("i"))
        return lambda *inputs: step(*inputs, world.put(np.full((W,) + shape, poison, dtype)))

    def on_heap(rows, dtype, value=None):
        return world.heap(np.asarray(rows, dtype) if value is None else np.full(rows, value, dtype))

    # ring put with flags
    xs = world.inputs(K.N, "float32", seed=23)
    inbox, flags = on_heap((W, K.N), np.float32, K.POISON), on_heap((W, 4), np.int32, 0)
    out = program(K.ring_put, 3, (K.N,), np.float32, np.nan, symmetric=(0, 1))(inbox, flags, world.put(xs))
    for me in world.ranks:
        world.expect(f"ring put: out on rank {me}", world.shard(out, me), xs[(me - 1) % W] * 2, exact=True)
    iris_jax.barrier()  # every rank's kernel ended: the heaps are read below
    for me in world.ranks:
        world.expect(f"ring put: inbox of rank {me}", world.shard(inbox, me), xs[(me - 1) % W] * 2, exact=True)
        world.expect(f"ring put: flags of rank {me}", world.shard(flags, me), [1, 0, 0, 0], exact=True)

    # every atomic, contended
    counters = on_heap(np.tile(np.asarray(K.CONTENDED_START, np.int32), (W, 1)), np.int32)
    old = program(K.contended, 1, (3,), np.int32, -5, grid=(3,), symmetric=(0,))(counters)
    olds = {me: world.shard(old, me) for me in world.ranks}
    iris_jax.barrier()
    want = K.contended_expected(W)
    for me in world.ranks:
        world.expect(f"contended atomics: counters of rank {me}", world.shard(counters, me), want[me], exact=True)
        # each program's adds to the W ranks' counter 0 return W old values, each below the final count
        world.require(f"contended atomics: old values of rank {me}",
                      ((0 <= olds[me]) & (olds[me] <= W * (3 * W - 1))).all(), olds[me])

    # adds into rank 0's counters, one counter per sem
    programs, sems = PALLAS_ADD_PROGRAMS, len(K.SEMS)
    rank0 = on_heap([np.zeros(sems) if r == 0 else np.full(sems, -5) for r in range(W)], np.int32)
    old = program(K.add_into_rank0, 1, (programs * sems,), np.int32, -5, grid=(programs,), symmetric=(0,))(rank0)
    olds = {me: world.shard(old, me).reshape(programs, sems) for me in world.ranks}
    iris_jax.barrier()
    for me in world.ranks:
        world.expect(f"adds into rank 0: counters of rank {me}", world.shard(rank0, me),
                     np.full(sems, W * programs if me == 0 else -5), exact=True)
        for k, sem in enumerate(K.SEMS):
            seen = olds[me][:, k]
            world.require(f"adds into rank 0 ({sem}): distinct old values on rank {me}",
                          len(np.unique(seen)) == programs and seen.min() >= 0 and seen.max() < W * programs, seen)

    # a CAS lock around a plain read-modify-write of rank 0's counter
    rounds = PALLAS_LOCK_ROUNDS["sim" if world.runtime.backend.interprets_kernels else "gpu"]
    lock, counter = on_heap((W, 1), np.int32, 0), on_heap((W, 1), np.int32, 0)
    taken = program(K.make_cas_lock(rounds), 2, (1,), np.int32, -5, symmetric=(0, 1))(lock, counter)
    tries = {me: world.shard(taken, me) for me in world.ranks}
    iris_jax.barrier()
    for me in world.ranks:
        world.expect(f"cas lock: counter of rank {me}", world.shard(counter, me), [W * rounds if me == 0 else 0],
                     exact=True)
        world.expect(f"cas lock: lock of rank {me}", world.shard(lock, me), [0], exact=True)
        world.require(f"cas lock: rounds taken on rank {me}", int(tries[me][0]) >= rounds, tries[me])

    # the example's one-shot all-reduce, two epochs on the same flags
    example = K.example()
    n, epochs = example.N, (1, 2)
    buf, epoch_flags = on_heap((W, n), np.float32, K.POISON), on_heap((W, W), np.int32, 0)
    all_reduce = program(example.one_shot_all_reduce, 4, (n,), np.float32, np.nan, symmetric=(0, 1))
    for epoch in epochs:
        xs = world.inputs(n, "float32", seed=30 + epoch)
        out = all_reduce(buf, epoch_flags, world.put(np.full((W, 1), epoch, np.int32)), world.put(xs))
        for me in world.ranks:
            world.expect(f"one-shot all-reduce epoch {epoch} on rank {me}", world.shard(out, me),
                         xs.astype(np.float64).sum(0))
        # every rank ended this epoch before any starts the next: a rank starting it overwrites its
        # slot of buf, which a slower peer may still be reading (the example does not guard that)
        iris_jax.barrier()
    for me in world.ranks:  # (read after the last epoch: a faster peer's next epoch raises them)
        world.expect(f"one-shot all-reduce: flags of rank {me}", world.shard(epoch_flags, me),
                     np.full(W, epochs[-1]), exact=True)


# -- a peer that never arrives (its own run: the collective's trap ends the CUDA context) -----------
def timeouts(world: World) -> None:
    """The last rank never calls: a device barrier with timeout_s=3 fails naming it (PeerTimeoutError
    from JAX's read of its status), then an all_reduce with timeout_s=3 fails on every other rank with
    PeerTimeoutError naming it (on GPUs raised by iris_jax.block_until_ready from the fault record
    the kernel left). No rank hangs."""
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W = world.size
    missing = W - 1
    x = world.put(np.arange(W * 37, dtype=np.float32).reshape(W, 37))
    skip = lambda call: lambda v: lax.cond(lax.axis_index("i") == missing, lambda u: call(u, True), call, v)

    barrier = world.smap(skip(lambda u, absent=False: (jnp.full((1,), -1, jnp.int32), u) if absent
                              else iris_jax.device_barrier(u, timeout_s=3)), P("i"), (P("i"), P("i")),
                         check_vma=False)
    start = time.monotonic()
    status, _ = barrier(x)
    for me in world.ranks:
        try:  # JAX's own read: a barrier that gave up fails its program (the fault gate)
            np.asarray(world.shard(status, me))
            raised = None
        except Exception as e:  # noqa: BLE001 - a JaxRuntimeError carrying the named error
            raised = str(e)
        seconds = time.monotonic() - start
        if me == missing:
            world.require("the absent rank's barrier status", raised is None, raised)
        else:
            world.require("device_barrier names the absent rank", raised is not None and "PeerTimeoutError" in raised
                          and f"waiting for rank {missing}" in raised, f"{raised!r} after {seconds:.1f} s")
            world.require("device_barrier timed out promptly", seconds < 30, f"{seconds:.1f} s")
        world.say(f"rank {me}: device_barrier without rank {missing}: {seconds:.1f} s, {raised!r}")
    try:
        iris_jax.check_faults()  # takes the barrier's records, which would fail the next program's gate
    except iris_jax.PeerTimeoutError:
        pass

    reduce = world.smap(skip(lambda u, absent=False: u if absent else iris_jax.all_reduce(u, "i", timeout_s=3)),
                        P("i"), P("i"), check_vma=False).lower(x).compile()  # compiled before any turn
    trapping = world.runtime.on_fault == "trap"  # (exit, the default: the kernels end and every rank calls at once)
    with _one_trap_at_a_time(world) if trapping else contextlib.nullcontext():
        start = time.monotonic()
        try:  # iris's block_until_ready: a kernel that gave up and exited (on_fault="exit") raises its fault
            iris_jax.block_until_ready(reduce(x))
            raised = None
        except Exception as e:  # noqa: BLE001 - PeerTimeoutError (chained to the CUDA error with on_fault="trap")
            raised = f"{type(e).__name__}: {e}"
        seconds = time.monotonic() - start
    if world.ranks == [missing]:
        world.require("the absent rank's own call", raised is None, raised)
    else:  # (on the simulator, one process holds the absent rank and the others: its call fails too)
        world.require("all_reduce fails without the absent rank", raised is not None, f"returned after {seconds:.1f} s")
        if not trapping:  # (one at a time, the first waits for a rank that waits its turn)
            named = f"waiting for rank {missing}" in (raised or "") or "PeerFailedError" in (raised or "")
            world.require("all_reduce names the absent rank (or a rank that gave up on it first)", named, raised)
        world.require("all_reduce failed promptly", seconds < 30, f"{seconds:.1f} s")
    world.say(f"all_reduce without rank {missing}: {seconds:.1f} s, {(raised or 'returned')[:300]!r}")


TURN_WAIT_S = 60  # for the previous process's failed call (a few seconds each)


@contextlib.contextmanager
def _one_trap_at_a_time(world: World):
    """Processes sharing one GPU make their failing call one after another (process p after p - 1).

    Traps of several processes' kernels at once on one time-sliced GPU left some of them in
    block_until_ready with no error and no output from the kernel (at 4 and 8 ranks); one
    process per GPU, or one trap at a time, reports every one. Elsewhere this does nothing."""
    store = world.runtime.store
    if not world.shared_gpu:
        yield
        return
    key = lambda p: f"scenarios/timeouts/turn/{p}"  # noqa: E731 - (one timeouts run per set of processes)
    if world.process > 0:
        store.get(key(world.process - 1), TURN_WAIT_S)
    try:
        yield
    finally:
        store.set(key(world.process), b"1")


def heap_guard(world: World) -> None:
    """Refused accesses (an array off the heap, a rank outside the world): tests/gpu/heap_guard.py."""
    from tests.gpu.heap_guard import heap_guard as scenario

    scenario(world)



def transforms(world: World) -> None:
    """Every iris collective under jit, grad, jvp and vmap (issue 18's matrix on GPUs). The reference
    runs the same body with lax's collectives over a vmapped axis named "i" on this process's own
    device (lax cannot reach the other ranks here), under the same transformation."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W = world.size
    ring = [(i, (i + 1) % W) for i in range(W)]
    ops = {
        "psum": (iris_jax.psum, lax.psum), "pmean": (iris_jax.pmean, lax.pmean),
        # lax cannot differentiate pmax/pmin: their reference reduces a gather (ties share, as in iris)
        "pmax": (iris_jax.pmax, lambda v, a: jnp.max(lax.all_gather(v, a), axis=0)),
        "pmin": (iris_jax.pmin, lambda v, a: jnp.min(lax.all_gather(v, a), axis=0)),
        "all_gather": (lambda v, a: iris_jax.all_gather(v, a, axis=1, tiled=True),
                       lambda v, a: lax.all_gather(v, a, axis=1, tiled=True)),
        "psum_scatter": (lambda v, a: iris_jax.psum_scatter(v, a, tiled=True),
                         lambda v, a: lax.psum_scatter(v, a, tiled=True)),
        "all_to_all": (lambda v, a: iris_jax.all_to_all(v, a, 0, 0, tiled=True),
                       lambda v, a: lax.all_to_all(v, a, 0, 0, tiled=True)),
        "ppermute": (lambda v, a: iris_jax.ppermute(v, a, ring), lambda v, a: lax.ppermute(v, a, ring)),
        "pbroadcast": (lambda v, a: iris_jax.pbroadcast(v, a, W - 1),
                       lambda v, a: lax.all_gather(v, a)[W - 1]),  # lax.pbroadcast does not batch arrays
    }
    rng = np.random.default_rng(11)
    blocks = (rng.permutation(W * 2 * W * 3 * 2).reshape(W, 2 * W, 3, 2) / (W * W * 12) + 0.5).astype(np.float32)
    x, x4 = world.put(blocks[..., 0]), world.put(blocks)
    local = jnp.asarray(blocks)

    def body(op):
        def f(v):
            y = op(v, "i")
            return (jnp.sum(jnp.sin(y) * jnp.cos(y)) + jnp.sum(y))[None]
        return f

    smap = lambda f: jax.shard_map(f, mesh=world.mesh, in_specs=P("i"), out_specs=P("i"))  # noqa: E731
    # replace_lax_collectives, not jit: the varying output of an invariant result is a pvary that
    # shard_map adds outside the iris op, and its transpose (a psum) would otherwise run on XLA
    # (NCCL, which refuses ranks sharing a GPU)
    jit = iris_jax.replace_lax_collectives
    for name, (iris_op, lax_op) in ops.items():
        sharded, ref = smap(body(iris_op)), jax.vmap(body(lax_op), axis_name="i")
        programs = {  # transformation: (iris on the mesh, its input, the reference on all blocks)
            "jit": (jit(sharded), x, lambda X: ref(X[..., 0])),
            "grad": (jit(jax.grad(lambda v: sharded(v).sum())), x,
                     lambda X: jax.grad(lambda u: ref(u).sum())(X[..., 0])),
            "jvp": (jit(lambda v: jax.jvp(sharded, (v,), (jnp.cos(v),))[1]), x,
                    lambda X: jax.jvp(ref, (X[..., 0],), (jnp.cos(X[..., 0]),))[1]),
            "vmap": (jit(jax.vmap(sharded, in_axes=2, out_axes=1)), x4,
                     lambda X: jax.vmap(ref, in_axes=3, out_axes=1)(X)),
        }
        for transform, (program, arg, reference) in programs.items():
            got, want = program(arg), np.asarray(jax.jit(reference)(local))
            for me in world.ranks:
                world.expect(f"{name} under {transform} on rank {me}", world.shard(got, me).reshape(-1),
                             want[me].reshape(-1), "float32")

def ragged(world: World) -> None:
    """ragged_all_to_all against numpy (and, on GPUs of their own, against lax's on XLA: NCCL
    refuses ranks that share a GPU): float32 and bfloat16, one and two slices per member, zero
    sizes, gaps; the operand in several windows; the gradient against numpy's."""
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.jax.test_ragged_all_to_all import exchange, expected

    G = world.size
    with_xla = jax.devices()[0].platform == "gpu" and not world.shared_gpu
    for dtype, slices, R, chunk in (("float32", 1, 1000, 0), ("bfloat16", 2, 257, 0), ("float32", 2, 1024, 64 << 10)):
        rng = np.random.default_rng(G * 100 + slices)
        N = M = G * slices * 40 + 7
        io, ss, oo, rs = exchange(G, slices, N, M, rng, most=20)
        operand = rng.standard_normal((G, N, R)).astype(jnp.dtype(dtype))
        output = np.full((G, M, R), -7, jnp.dtype(dtype))
        args = [world.put(a) for a in (operand, output, io, ss, oo, rs)]
        config = iris_jax.CollectiveConfig(chunk_bytes=chunk) if chunk else None
        on_iris = world.smap(lambda *a: iris_jax.ragged_all_to_all(*a, axis_name="i", config=config), P("i"), P("i"))
        on_xla = world.smap(lambda *a: lax.ragged_all_to_all(*a, axis_name="i"), P("i"), P("i"))
        got, want = on_iris(*args), expected(operand, output, io, ss, oo)
        xla = on_xla(*args) if with_xla else got
        what = f"ragged_all_to_all {dtype} slices={slices} rows={R} chunk={chunk}"
        for me in world.ranks:
            world.expect(f"{what} on rank {me}", world.shard(got, me), want[me], dtype, exact=True)
            world.expect(f"{what} against XLA on rank {me}", world.shard(got, me), world.shard(xla, me), dtype,
                         exact=True)

    def loss(ragged):
        def per_rank(x, io, ss, oo, rs, w):
            buffer = lax.pcast(jnp.zeros(x.shape, x.dtype), "i", to="varying")
            return jnp.sum(jnp.sin(ragged(x, buffer, io, ss, oo, rs, axis_name="i")) * w)[None]
        summed = jax.shard_map(per_rank, mesh=world.mesh, in_specs=P("i"), out_specs=P("i"))
        return jax.jit(jax.grad(lambda *a: summed(*a).sum()))

    rng = np.random.default_rng(7)
    N = G * 30
    vectors = exchange(G, 1, N, N, rng, most=20)
    rng_inputs = rng.standard_normal((2, G, N, 64)).astype(np.float32)
    args = [world.put(a) for a in (rng_inputs[0], *vectors, rng_inputs[1])]
    got = loss(iris_jax.ragged_all_to_all)(*args)
    x, w = rng_inputs
    io, ss, oo, _ = vectors
    ct = np.cos(expected(x, np.zeros_like(x), io, ss, oo)) * w  # d sum(sin(out) * w) / d out
    want = np.zeros_like(x)  # ... sent back the way the rows came
    for j in range(G):
        for k in range(G):
            n = ss[j, k]
            want[j, io[j, k]:io[j, k] + n] = ct[k, oo[j, k]:oo[j, k] + n]
    for me in world.ranks:
        world.expect(f"ragged_all_to_all gradient on rank {me}", world.shard(got, me), want[me], "float32")


def moe(world: World) -> None:
    """examples/09_moe_expert_parallel.py's layer: loss and gradients on iris against XLA's (ranks
    sharing a GPU, which NCCL refuses: against the same step with the exchange written with
    all_gather, iris_jax.reference, on iris)."""
    import importlib.util
    import sys

    import jax
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_jax import reference

    examples = os.path.join(os.path.dirname(__file__), "..", "..", "examples")
    sys.path.insert(0, examples)  # its _common
    spec = importlib.util.spec_from_file_location("moe_example", os.path.join(examples, "09_moe_expert_parallel.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # (its _common.setup() changes nothing where JAX runs already)
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.id)), ("ep",))
    G, T, D, F, local, top_k = world.size, 256, 256, 512, 2, 2
    rng = np.random.default_rng(3)
    params = {"router": rng.standard_normal((D, local * G)) / np.sqrt(D),
              "w1": rng.standard_normal((local * G, D, F)) / np.sqrt(D),
              "w2": rng.standard_normal((local * G, F, D)) / np.sqrt(F)}
    params = {k: jax.make_array_from_callback(v.shape, NamedSharding(mesh, example.SPECS[k]),
                                              lambda idx, v=v: v.astype(np.float32)[idx]) for k, v in params.items()}
    x, y = (jax.make_array_from_callback((G * T, D), NamedSharding(mesh, P("ep")),
                                         lambda idx, a=a: a[idx]) for a in rng.standard_normal((2, G * T, D))
            .astype(np.float32))
    def step(exchange):
        return jax.shard_map(jax.value_and_grad(lambda *a: example.loss(*a, top_k=top_k, ragged_all_to_all=exchange)),
                             mesh=mesh, in_specs=(example.SPECS, P("ep"), P("ep")), out_specs=(P(), example.SPECS))

    if jax.devices()[0].platform == "gpu" and not world.shared_gpu:
        loss_xla, g_xla = jax.jit(step(lax.ragged_all_to_all))(params, x, y)
    else:
        loss_xla, g_xla = iris_jax.replace_lax_collectives(step(reference.ragged_all_to_all))(params, x, y)
    (loss_iris, g_iris) = iris_jax.replace_lax_collectives(step(lax.ragged_all_to_all))(params, x, y)
    world.expect("moe loss", float(loss_iris), float(loss_xla), "float32")
    for name in params:
        for shard in g_iris[name].addressable_shards:
            (ref,) = [s for s in g_xla[name].addressable_shards if s.device == shard.device]
            world.expect(f"moe grad {name}", np.asarray(shard.data), np.asarray(ref.data), "float32")


def _partitions(W: int) -> list[tuple]:
    """axis_index_groups to run at world W (one partition per world: each is a new set of kernels
    to compile, see tier): one group in reverse at 2 ranks, crossed pairs at 4, strided halves from 8."""
    if W == 2:
        return [((1, 0),)]
    if W == 4:
        return [((0, 3), (2, 1))]
    return [(tuple(range(0, W, 2)), tuple(range(1, W, 2)))]


def _grouped_reference(name: str, xs, r: int, groups):
    """What rank r holds after collective `name` over `groups` (rows of xs: every rank's input)."""
    (group,) = [g for g in groups if r in g]
    mine, G = xs[list(group)], len(group)
    p, block = group.index(r), xs.shape[1] // G
    if name in ("psum", "pmax", "pmin"):
        return {"psum": mine.sum(0), "pmax": mine.max(0), "pmin": mine.min(0)}[name]
    if name == "all_gather":
        return mine
    if name == "psum_scatter":
        return mine[:, p * block:(p + 1) * block].sum(0)
    return np.concatenate([row[p * block:(p + 1) * block] for row in mine])  # all_to_all


# every dtype lax takes (iris_jax.collectives.dtypes), each kind of carrier: words, widened bytes, float32 sums
EVERY_DTYPE = ("bool", "int4", "int8", "uint8", "int16", "uint16", "uint32", "float8_e4m3fn", "float8_e5m2",
               "float16", "bfloat16", "complex64")
# a float sum's tolerance: one rounding of the dtype (relative to the largest magnitude)
ROUNDING = {"float8_e4m3fn": 2.0**-3, "float8_e5m2": 2.0**-2, "float16": 2.0**-10, "bfloat16": 2.0**-7,
            "complex64": 1e-6}


def _dtype_values(rng, dtype, shape) -> np.ndarray:
    """Values whose integer sums over 8 ranks stay in range (int4: -1 or 0), normal floats."""
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(bool)
    if np.issubdtype(dtype, np.complexfloating):
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if dtype.kind in "iu" or dtype.name in ("int4", "uint4"):
        low, high = (-1, 1) if dtype.name == "int4" else (-8, 8) if dtype.kind == "i" else (0, 16)
        return rng.integers(low, high, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def dtypes(world: World) -> None:
    """Every dtype lax takes (EVERY_DTYPE) through psum, pmax, all_gather, psum_scatter, all_to_all and
    ppermute, against numpy: data movement and integer reductions bit for bit, maxima exact, float sums
    within one rounding of the exact sum (16-bit and 8-bit floats are summed in float32)."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax

    W = world.size
    n = 16 * W
    block = n // W
    perm = [(i, (i + 1) % W) for i in range(W)]
    for k, name in enumerate(EVERY_DTYPE):
        dtype = jnp.dtype(name)
        xs = _dtype_values(np.random.default_rng(100 + k), dtype, (W, n))
        calls = {"all_gather": (lambda v: iris_jax.all_gather(v, "i"), P("i")),
                 "all_to_all": (lambda v: iris_jax.all_to_all(v, "i", 0, 0, tiled=True), P("i")),
                 "ppermute": (lambda v: iris_jax.ppermute(v, "i", perm), P("i")),
                 "psum": (lambda v: iris_jax.psum(v, "i"), P())}
        if name != "complex64":
            calls["pmax"] = (lambda v: iris_jax.pmax(v, "i"), P())
        if name != "bool":
            calls["psum_scatter"] = (lambda v: iris_jax.psum_scatter(v, "i", tiled=True), P("i"))
        f = world.smap(lambda v: tuple(fn(v) for fn, _ in calls.values()), P("i"),
                       tuple(spec for _, spec in calls.values()))
        outs = dict(zip(calls, f(world.put(xs)), strict=True))
        total = xs.astype(np.int32).sum(0) if name == "bool" else xs.astype(
            np.complex128 if name == "complex64" else np.int64 if dtype.kind in "iub" or name == "int4" else
            np.float64).sum(0)
        for me in world.ranks:
            moved = {"all_gather": xs, "ppermute": xs[(me - 1) % W],
                     "all_to_all": np.concatenate([row[me * block:(me + 1) * block] for row in xs])}
            for op, want in moved.items():
                got = world.shard(outs[op], me)
                world.require(f"{op} of {name} on rank {me}: bytes", got.dtype == want.dtype and np.array_equal(
                    got.view(np.uint8), np.ascontiguousarray(want).view(np.uint8)))
            if "pmax" in outs:
                world.require(f"pmax of {name} on rank {me}", np.array_equal(world.shard(outs["pmax"], me),
                                                                             xs.max(0)))
            for op in ("psum", "psum_scatter"):
                if op not in outs:
                    continue
                got = world.shard(outs[op], me)
                want = total if op == "psum" else total[me * block:(me + 1) * block]
                if name in ROUNDING:
                    scale = ROUNDING[name] * max(1.0, float(np.abs(want).max()))
                    world.require(f"{op} of {name} on rank {me}", np.allclose(
                        got.astype(np.complex128 if name == "complex64" else np.float64), want, rtol=0, atol=scale))
                else:  # integers wrap as lax's: the exact sum, narrowed
                    world.require(f"{op} of {name} on rank {me}", np.array_equal(got, want.astype(got.dtype)))


def axis_index_groups(world: World) -> None:
    """The collectives that take lax's axis_index_groups, over partitions of the ranks (each group a
    sub-group the kernel runs over), against numpy: psum (its groups need check_vma=False, so every
    call here runs without it), pmax, pmin, all_gather, psum_scatter, all_to_all; at 2 ranks every
    pulled all-reduce variant for psum, above it one-shot. float32 at 4099 elements per rank (a
    multiple of no group size: the split collectives take the first multiple), and bfloat16 at 37
    at 2 ranks."""
    from jax.sharding import PartitionSpec as P

    import iris_jax

    sizes = [(4099, "float32")] + ([(37, "bfloat16")] if tier(world) == 0 else [])
    for groups in _partitions(world.size):
        G = len(groups[0])
        gk = {"axis_index_groups": groups}
        calls = [(f"psum({variant})", lambda v, variant=variant: iris_jax.psum(v, "i", variant=variant, **gk))
                 for variant in (("one_shot", "two_shot", "ring", "spinlock") if tier(world) == 0 else ("one_shot",))]
        calls += [("pmax", lambda v: iris_jax.pmax(v, "i", **gk)), ("pmin", lambda v: iris_jax.pmin(v, "i", **gk)),
                  ("all_gather", lambda v: iris_jax.all_gather(v, "i", **gk))]
        for n, dtype in sizes:
            even = n // G * G
            split = [("psum_scatter", lambda v: iris_jax.psum_scatter(v[:even], "i", tiled=True, **gk)),
                     ("all_to_all", lambda v: iris_jax.all_to_all(v[:even], "i", 0, 0, tiled=True, **gk))]
            xs = world.inputs(n, dtype, seed=n * 13 + G)
            f = world.smap(lambda v, batch=calls + split: tuple(fn(v) for _, fn in batch), P("i"),
                           tuple(P("i") for _ in calls + split), check_vma=False)
            outs = f(world.put(xs))
            wide = xs.astype(np.float64)
            for (name, _), out in zip(calls + split, outs, strict=True):
                base = name.split("(")[0]
                for me in world.ranks:
                    want = _grouped_reference(base, wide[:, :even] if base in ("psum_scatter", "all_to_all") else wide,
                                              me, groups)
                    world.expect(f"{name} over {groups} n={n} {dtype} on rank {me}", world.shard(out, me), want, dtype)


def tp_fsdp(world: World) -> None:
    """examples/08's transformer block (tp by hand over "tp" in a partially manual shard_map,
    "dp" left to XLA) as dp=2 x tp=2 from 4 ranks (tp only below): its output and the gradient
    of its input, every tp collective an iris kernel, against the block on this process's own
    device (lax over a vmapped "tp" of one member: the whole model). The weights are replicated
    over dp and only the input is differentiated, so that XLA needs no dp collective, which
    NCCL would refuse between ranks sharing a GPU (the program is checked to have none)."""
    import importlib.util
    import re
    import sys

    import jax
    from jax.sharding import AxisType, Mesh, NamedSharding

    import iris_jax

    examples = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
    sys.path.insert(0, examples)
    spec = importlib.util.spec_from_file_location("tp_fsdp_example", os.path.join(examples, "08_tp_fsdp_transformer.py"))
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    dp = 2 if world.size >= 4 and world.size % 2 == 0 else 1
    devices = sorted(jax.devices(), key=lambda d: d.id)  # mesh position == iris rank
    mesh = Mesh(np.array(devices).reshape(dp, world.size // dp), ("dp", "tp"), axis_types=(AxisType.Auto,) * 2)
    B, S, D, heads, F = 4, 16, 64, 4, 128
    rng = np.random.default_rng(23)
    whole = {"ln1": 1 + 0.1 * rng.standard_normal(D), "ln2": 1 + 0.1 * rng.standard_normal(D),
             "wqkv": rng.standard_normal((D, 3, heads, D // heads)) / np.sqrt(D),
             "wo": rng.standard_normal((heads, D // heads, D)) / np.sqrt(D),
             "w1": rng.standard_normal((D, F)) / np.sqrt(D), "w2": rng.standard_normal((F, D)) / np.sqrt(F)}
    whole = {k: v.astype(np.float32) for k, v in whole.items()}
    x_np, ct_np = (rng.standard_normal((B, S, D)).astype(np.float32) for _ in range(2))

    def put(a, spec):
        return jax.make_array_from_callback(a.shape, NamedSharding(mesh, spec), lambda idx: a[idx])

    params = {k: put(v, example.TP_SPECS[k]) for k, v in whole.items()}  # replicated over dp
    x, ct = put(x_np, example.BATCH), put(ct_np, example.BATCH)
    block = jax.shard_map(example.block_body, mesh=mesh, in_specs=(example.TP_SPECS, example.STREAM_SPEC),
                          out_specs=example.STREAM_SPEC, axis_names={"tp"})

    def forward_and_input_gradient(params, x, ct):
        y, vjp = jax.vjp(lambda v: block(params, v), x)
        return y, vjp(ct)[0]

    # float32 matmuls in full precision on both sides (on GPUs XLA's default is TF32, whose
    # rounding differs between the sharded block and the whole one by ~3e-4)
    with jax.default_matmul_precision("highest"):
        program = iris_jax.replace_lax_collectives(forward_and_input_gradient)
        lowered = program.lower(params, x, ct)
        text = lowered.as_text()
        launched = text.count("triton_kernel_call") + text.count("iris_cpu_kernel")  # (as domains_mp counts them)
        rows = iris_jax.explain(forward_and_input_gradient, params, x, ct)
        world.require("every tp collective on iris", rows and all(r.runs_on == "iris" for r in rows),
                      "\n".join(map(str, rows)))
        world.require("iris kernels in the program", launched > 0)
        compiled = lowered.compile()
        xla = re.findall(r"\b(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(",
                         compiled.as_text())
        world.require("no XLA collective (NCCL refuses ranks sharing a GPU)", not xla, xla)
        if xla:  # (every process compiled the same program: all return here)
            return
        y, dx = compiled(params, x, ct)

        def reference(params, x, ct):  # one tp member holding every head and hidden unit
            body = jax.vmap(example.block_body, axis_name="tp")
            y, vjp = jax.vjp(lambda v: body(jax.tree.map(lambda p: p[None], params), v[None])[0], x)
            return y, vjp(ct)[0]

        local = jax.local_devices()[0]
        want_y, want_dx = (np.asarray(a) for a in jax.jit(reference)(*jax.device_put((whole, x_np, ct_np), local)))
        for name, got, want in (("output", y, want_y), ("input gradient", dx, want_dx)):
            for shard in got.addressable_shards:
                world.expect(f"tp_fsdp {name} on rank {world.runtime.rank_of(shard.device)}", np.asarray(shard.data),
                             want[shard.index], "float32")


def heap_growth(world: World) -> None:
    """The heap grows (VMM heaps, the default with one process per GPU, when their upper bound
    exceeds what they mapped at init: 1 GiB): an array larger than what is free of the mapped
    bytes maps more on every rank at once; an array placed in the grown range then goes through a
    psum, against numpy, and an array placed before keeps its offset and values. A heap mapped
    up to its bound (cudaMalloc heaps always, VMM heaps of mp_script's default 768 MiB): an array
    past the bound raises HeapExhaustedError on every rank and changes nothing."""
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax

    before = iris_jax.memory_stats()
    if world.runtime.heap_allocator == "malloc":
        world.require("a cudaMalloc heap maps its whole size", before["bytes_mapped"] == before["bytes_limit"], before)
    if before["bytes_mapped"] == before["bytes_limit"]:
        try:
            iris_jax.empty((world.size * (before["bytes_limit"] // 4),), jnp.float32, sharding=world.rows)
            world.require("an array past the heap's bound raises HeapExhaustedError", False, "it did not")
        except iris_jax.HeapExhaustedError as e:
            world.require("the error names what holds the heap", "upper bound" in str(e), str(e)[:300])
        world.require("nothing changed", iris_jax.memory_stats() == before, (before, iris_jax.memory_stats()))
        return
    kept = world.inputs(SMALL, "float32", 51)
    first = world.heap(kept)
    offset = iris_jax.heap_offset(first)
    free = before["bytes_mapped"] - before["bytes_in_use"]
    filler = iris_jax.empty((world.size * (free // 4 + 4096),), jnp.float32, sharding=world.rows)
    grown = iris_jax.memory_stats()
    world.require("the heap grew once", grown["bytes_mapped"] > before["bytes_mapped"]
                  and grown["num_growths"] == before["num_growths"] + 1, (before, grown))
    xs = world.inputs(MID, "float32", 52)
    x = world.heap(xs)
    world.require("an array in the grown range", iris_jax.heap_offset(x) >= before["bytes_mapped"],
                  (iris_jax.heap_offset(x), before["bytes_mapped"]))
    out = world.smap(lambda v: iris_jax.psum(v, "i"), P("i"), P("i"))(x)
    for r in world.ranks:
        world.expect(f"psum over the grown range, rank {r}", world.shard(out, r), xs.sum(0), "float32")
        world.expect(f"the earlier array, rank {r}", world.shard(first, r), kept[r], exact=True)
    world.require("the earlier array kept its offset", iris_jax.heap_offset(first) == offset)
    del filler


SCENARIOS = {
    "kernels": (kernels, {}),
    "atomics": (atomics, {}),
    "tuple_hint": (tuple_hint, {}),
    "device_barrier": (device_barrier, {}),
    "collectives": (all_reduce_and_collectives, {}),
    "pushed": (pushed, {"IRIS_COLLECTIVE_PUSH_FROM": "0", "IRIS_COLLECTIVE_STREAM_UNTIL": "0",
                        "IRIS_COLLECTIVE_STREAM_FROM": str(1 << 62)}),
    "streamed": (streamed, {"IRIS_COLLECTIVE_STREAM_FROM": "0"}),
    "chunked": (chunked, {"IRIS_COLLECTIVE_CHUNK_BYTES": str(64 << 10)}),
    "zero_copy": (zero_copy, {"IRIS_COLLECTIVE_STREAM_FROM": str(1 << 62)}),  # pulled, so read in place
    "heap_guard": (heap_guard, {}),
    "transforms": (transforms, {}),
    "ragged": (ragged, {}),
    "moe": (moe, {}),
    "axis_index_groups": (axis_index_groups, {}),
    "dtypes": (dtypes, {}),
    "tp_fsdp": (tp_fsdp, {}),  # its own test (tests/gpu/test_gpu_partially_manual.py), at 4 ranks
    "fused": (fused, {}),
    "tiles": (tiles, {}),
    "heap_growth": (heap_growth, {}),
    "pallas": (pallas, {}),
    "tracing": (tracing, {}),  # last but timeouts: enabling tracing clears JAX's caches
    "timeouts": (timeouts, {}),
}
ENDS_IN_FAILED_KERNELS = {"timeouts"}  # run last and alone: on GPUs its trap ends the process's CUDA context
OWN_TEST = {"tp_fsdp"}  # not in the shared suite's runs (their time is spent): a test of its own
MAIN = [name for name in SCENARIOS if name not in ENDS_IN_FAILED_KERNELS | OWN_TEST]
# dtypes: compiling its kernels for every dtype at 8 ranks outlasts the suite's second part (2026-12-05)
UP_TO_TIER = {"atomics": 1, "tuple_hint": 0, "transforms": 0, "zero_copy": 1, "pushed": 1, "streamed": 1, "chunked": 1,
              "pallas": 1, "dtypes": 1}  # others: all


def applies(name: str, world_size: int) -> bool:
    """Whether scenario `name` runs at `world_size` (see tier)."""
    return _tier(world_size) <= UP_TO_TIER.get(name, 2)
