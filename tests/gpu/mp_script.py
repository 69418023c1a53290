"""One process per GPU: run by test_gpu_multiprocess.py as `python mp_script.py PROCESS_ID PORT`."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    import faulthandler

    faulthandler.dump_traceback_later(150, exit=True)  # a hang shows where, before the test's limit
    import jax

    process_id, port = int(sys.argv[1]), sys.argv[2]
    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process_id,
                               local_device_ids=[process_id])
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.kernels import hammer, ping_pong
    from tests.jax.kernels import read_local, ring_store

    print(f"process {process_id}: distributed up, {jax.devices()}", flush=True)
    rt = iris_jax.init(heap_size=1 << 28)
    print(f"process {process_id}: heaps mapped {rt}", flush=True)
    assert rt.mode == "gpu-multi-process", rt.mode
    W = rt.world_size
    mesh = jax.make_mesh((W,), ("i",))
    sh = NamedSharding(mesh, P("i"))

    def smap(f, n_in):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P("i"),) * n_in, out_specs=P("i")))

    def local_values(a):
        return np.asarray(a.addressable_shards[0].data)

    n = 4097
    buf = iris_jax.full((W * n,), -7.0, jnp.float32, sharding=sh)
    assert iris_jax.is_symmetric(buf)
    x = jax.make_array_from_callback((W * n,), sh, lambda idx: np.arange(W * n, dtype=np.float32)[idx])
    out_t = jax.ShapeDtypeStruct((n,), jnp.float32)
    print(f"process {process_id}: arrays ready", flush=True)
    store = smap(lambda b, x: iris_jax.triton_call(b, x, n, kernel=ring_store, out_shape=out_t, grid=(5,), W=W,
                                                    BLOCK=1024, HINT=16, symmetric=(0,)), 2)
    store = store.lower(buf, x).compile()
    print(f"process {process_id}: compiled", flush=True)
    out = store(buf, x).block_until_ready()
    print(f"process {process_id}: first kernel done", flush=True)
    me = process_id
    mine = np.arange(W * n, dtype=np.float32).reshape(W, n)
    np.testing.assert_allclose(local_values(out), mine[me] * 2 + me)
    iris_jax.barrier()
    got = smap(lambda b: iris_jax.triton_call(b, n, kernel=read_local, out_shape=out_t, grid=(5,), BLOCK=1024), 1)(buf)
    np.testing.assert_array_equal(local_values(got), mine[(me - 1) % W])

    counter = iris_jax.zeros((W * 64,), jnp.int32, sharding=sh)
    smap(lambda c: iris_jax.triton_call(c, kernel=hammer, out_shape=jax.ShapeDtypeStruct((132,), jnp.int32),
                                         grid=(132,), ITERS=100, W=W, symmetric=(0,)), 1)(counter).block_until_ready()
    iris_jax.barrier()
    total = smap(lambda b: iris_jax.triton_call(b, 64, kernel=read_local, out_shape=jax.ShapeDtypeStruct((64,), jnp.int32),
                                                 grid=(1,), BLOCK=64), 1)(counter)
    if me == 0:
        assert int(local_values(total)[0]) == W * 132 * 100, local_values(total)[0]

    flags = iris_jax.zeros((W * 128,), jnp.int32, sharding=sh)
    data = iris_jax.zeros((W * 128,), jnp.int32, sharding=sh)
    res = smap(lambda f, d: iris_jax.triton_call(f, d, kernel=ping_pong, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                                                  grid=(1,), ROUNDS=101, W=W, symmetric=(0, 1)), 2)(flags, data)
    assert int(local_values(res)[0]) == (100 if me == 0 else 101), local_values(res)  # rank 1 receives last
    iris_jax.barrier()
    print(f"process {process_id}: kernels OK", flush=True)
    _collectives(mesh, sh, W)
    iris_jax.barrier()
    print(f"process {me}: OK")
    iris_jax.shutdown()


def _collectives(mesh, sh, W, sizes=(37, (1 << 22) + 6)):
    """Every collective and all-reduce variant against the lax op, across the two processes."""
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from tests.gpu.cases import collective_cases

    def compare(name, iris_fn, lax_fn, x, out_spec):
        run = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=out_spec))(x)
        got, want = run(iris_fn), run(lax_fn)
        for g, w in zip(got.addressable_shards, want.addressable_shards, strict=True):
            np.testing.assert_allclose(np.asarray(g.data, np.float32), np.asarray(w.data, np.float32), rtol=2e-5,
                                       atol=2e-5, err_msg=name)

    for n in sizes:
        x = jax.make_array_from_callback((W * n,), sh, lambda idx: np.random.default_rng(n).standard_normal(
            W * n).astype(np.float32)[idx])
        for variant in ("auto", "one_shot", "two_shot", "ring", "atomic", "spinlock"):
            compare(f"all_reduce {variant} n={n}", lambda v: iris_jax.all_reduce(v, "i", variant=variant),
                    lambda v: lax.psum(v, "i"), x, P())
        for name, iris_fn, lax_fn, spec in collective_cases(n, W):
            compare(f"{name} n={n}", iris_fn, lax_fn, x, spec)
    print(f"process {jax.process_index()}: collectives OK", flush=True)


if __name__ == "__main__":
    main()
