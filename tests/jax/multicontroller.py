"""Run by test_multicontroller.py as `python -m iris_core.sim -n W tests/jax/multicontroller.py`.

A script written for one process per GPU, in tests/gpu/mp_script.py's shape: `jax.distributed.initialize()`
(no arguments: the launcher's environment names the run), a mesh over every process's device, global arrays
from `jax.make_array_from_callback`, then scenarios through tests/gpu/scenarios.py's runner, each printing
`process P: scenario NAME OK|FAIL ...`, and `process P: OK` at the end. Sizes fit the simulator; values are
checked against numpy, and lax's collectives (gloo across the processes) run beside iris's in one program.
"""

import faulthandler
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

N = 37  # fewer than a tile; some ranks' split blocks hold nothing
LIMIT_S = 150  # seconds before dumping every stack and exiting (before the launcher's timeout)


def heap_arrays(world) -> None:
    """Heap arrays over a multi-process sharding: every constructor, symmetric, each shard its block."""
    import jax
    import jax.numpy as jnp

    import iris_jax

    W, me = world.size, world.ranks[0]
    mine = slice(me * N, (me + 1) * N)
    key = jax.random.key(7)
    made = {
        "zeros": (iris_jax.zeros((W * N,), jnp.float32, sharding=world.rows), np.zeros(W * N)),
        "full": (iris_jax.full((W * N,), 2.5, jnp.float32, sharding=world.rows), np.full(W * N, 2.5)),
        "arange": (iris_jax.arange(W * N, dtype=jnp.int32, sharding=world.rows), np.arange(W * N)),
        "rand": (iris_jax.rand(key, (W * N,), sharding=world.rows),
                 np.asarray(jax.random.uniform(key, (W * N,), jnp.float32))),
        "to_heap": (world.heap(np.arange(W * N, dtype=np.float32).reshape(W, N) * 3),
                    np.arange(W * N, dtype=np.float32) * 3),
    }
    for name, (array, want) in made.items():
        world.require(f"{name} is symmetric", iris_jax.is_symmetric(array))
        world.require(f"{name} sharding", array.sharding == world.rows, array.sharding)
        world.expect(f"{name} shard", world.shard(array, me), want[mine], exact=True)


def kernels(world) -> None:
    """Remote stores around the ring, then local reads and remote loads (tests/jax/kernels.py), two
    programs per kernel."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.jax.kernels import read_local, ring_load, ring_store

    W, block = world.size, 32
    xs = world.inputs(N, "float32", seed=N)
    buf = iris_jax.full((W * N,), -7.0, jnp.float32, sharding=world.rows)
    iris_jax.barrier()  # every process's buf is poisoned before any rank stores into it
    out_t = jax.ShapeDtypeStruct((N,), jnp.float32)
    grid = (-(-N // block),)
    out = world.smap(lambda b, x: iris_jax.triton_call(
        b, x, N, kernel=ring_store, out_shape=out_t, grid=grid, W=W, BLOCK=block, HINT=None, symmetric=(0,)),
        (P("i"), P("i")), P("i"))(buf, world.put(xs))
    for me in world.ranks:
        world.expect("ring_store out", world.shard(out, me), xs[me] * 2 + me, exact=True)
    iris_jax.barrier()  # every rank stored before any reads
    got = world.smap(lambda b: iris_jax.triton_call(
        b, N, kernel=read_local, out_shape=out_t, grid=grid, BLOCK=block), P("i"), P("i"))(buf)
    for me in world.ranks:
        world.expect("ring_store landed", world.shard(got, me), xs[(me - 1) % W], exact=True)
    got = world.smap(lambda b: iris_jax.triton_call(
        b, N, kernel=ring_load, out_shape=out_t, grid=grid, W=W, BLOCK=block, symmetric=(0,)), P("i"), P("i"))(buf)
    for me in world.ranks:
        world.expect("ring_load", world.shard(got, me), xs[me], exact=True)


def collectives(world) -> None:
    """Every all-reduce variant and every other collective, each beside its lax twin in one program:
    both against numpy, and iris against lax."""
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.cases import collective_cases, numpy_reference
    from tests.gpu.scenarios import VARIANTS

    calls = [(f"all_reduce({variant})", lambda v, variant=variant: iris_jax.all_reduce(v, "i", variant=variant),
              lambda v: lax.psum(v, "i"), P(), lambda xs, me: xs.sum(0)) for variant in VARIANTS]
    calls.append(("psum", lambda v: iris_jax.psum(v, "i"), lambda v: lax.psum(v, "i"), P(), lambda xs, me: xs.sum(0)))
    calls += [(name, fn, lax_fn, spec, lambda xs, me, name=name: numpy_reference(name, xs, me))
              for name, fn, lax_fn, spec in collective_cases(N, world.size)]
    xs = world.inputs(N, "float32", seed=11)
    specs = tuple(spec for _, _, _, spec, _ in calls)
    f = world.smap(lambda v: (tuple(fn(v) for _, fn, _, _, _ in calls), tuple(ref(v) for _, _, ref, _, _ in calls)),
                   P("i"), (specs, specs))
    iris_outs, lax_outs = f(world.put(xs))
    wide = xs.astype(np.float64)
    for (name, *_, expected), out, ref in zip(calls, iris_outs, lax_outs, strict=True):
        for me in world.ranks:
            world.expect(f"{name} (iris) on rank {me}", world.shard(out, me), expected(wide, me))
            world.expect(f"{name} (lax) on rank {me}", world.shard(ref, me), expected(wide, me))
            world.expect(f"{name}: iris as lax on rank {me}", world.shard(out, me), world.shard(ref, me))


def device_barriers(world) -> None:
    """tests/gpu/scenarios.py's device_barrier, with 5 rounds back to back instead of 100."""
    from tests.gpu import scenarios

    scenarios.device_barrier(world, rounds=5)


SCENARIOS = {"heap_arrays": heap_arrays, "ring_kernels": kernels, "collectives_beside_lax": collectives,
             "device_barriers": device_barriers}
GPU_SCENARIOS = ["pallas", "dtypes"]  # tests/gpu/scenarios.py's own, run as on GPUs after these


def main():
    faulthandler.dump_traceback_later(LIMIT_S, exit=True)  # a hang shows where, before the launcher's limit
    import jax

    jax.distributed.initialize()
    import iris_jax
    from tests.gpu import scenarios

    me = jax.process_index()
    print(f"process {me}: distributed up, {jax.local_devices()} of {jax.device_count()}", flush=True)
    rt = iris_jax.init(heap_size=16 << 20)
    assert rt.mode == "sim-launched" and rt.world_size == jax.process_count() > 1, rt
    assert not set(SCENARIOS) & set(scenarios.SCENARIOS)
    scenarios.SCENARIOS.update({name: (fn, {}) for name, fn in SCENARIOS.items()})  # the GPU runs' runner runs them
    world = scenarios.World(".")
    print(f"process {me}: rank {world.ranks}, heaps mapped {rt}", flush=True)
    passed = [scenarios.run(world, name) for name in [*SCENARIOS, *GPU_SCENARIOS]]
    iris_jax.barrier()
    iris_jax.shutdown()
    print(f"process {me}: {'OK' if all(passed) else 'FAILED'}", flush=True)
    sys.exit(0 if all(passed) else 1)


if __name__ == "__main__":
    main()
