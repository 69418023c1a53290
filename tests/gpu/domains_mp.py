"""One process per GPU with domains (issue 22): `python3 tests/gpu/domains_mp.py RANK WORLD PORT`, one
process per GPU, optionally under IRIS_DOMAIN_SIZE (or, without arguments, under the simulator's
`python -m iris_core.sim -n 2`, where every heap stays mapped). Checks the runtime's domains (by host by default,
one per process with IRIS_DOMAIN_SIZE=1), that a peer outside the domain is not mapped (its base is 0),
iris psum over the mesh axis against lax (NCCL), and that a kernel over a spanning group is refused.
Prints `process P: domains OK`."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))


def main():
    import jax

    if len(sys.argv) > 1:
        rank, world, port = (int(a) for a in sys.argv[1:4])
        jax.distributed.initialize(f"127.0.0.1:{port}", world, rank, local_device_ids=[rank])
    else:  # launched by the simulator
        jax.distributed.initialize()
        rank, world = jax.process_index(), jax.process_count()
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from iris_core.collectives import kernels as K
    from iris_jax.collectives import lowering

    rt = iris_jax.init(heap_size=64 << 20)
    split = os.environ.get("IRIS_DOMAIN_SIZE") == "1"
    print(f"process {rank}: {rt} domains {rt.domains} bases {rt.heap.heap_bases}", flush=True)
    assert rt.domains == (tuple((r,) for r in range(world)) if split else (tuple(range(world)),)), rt.domains
    if rt.mode == "gpu-multi-process":  # only the peers of its domain are mapped
        assert all((b == 0) == (split and r != rank) for r, b in enumerate(rt.heap.heap_bases)), rt.heap.heap_bases
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.id)), ("i",))
    full = np.arange(world * 4096, dtype=np.float32)
    x = jax.make_array_from_callback(full.shape, NamedSharding(mesh, P("i")), lambda index: jnp.asarray(full[index]))

    def run(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))

    iris_psum = run(lambda v: iris_jax.psum(v, "i"))
    text = iris_psum.lower(x).as_text()
    kernels = text.count("triton_kernel_call") + text.count("iris_cpu_kernel")
    assert (kernels == 0) == split, kernels
    got, want = iris_psum(x), run(lambda v: lax.psum(v, "i"))(x)
    np.testing.assert_allclose(np.asarray(got.addressable_shards[0].data), np.asarray(want.addressable_shards[0].data))
    if split:
        try:
            run(lambda v: lowering.launch(K.ALL_REDUCE, v.reshape(1, -1), ("i",), 1, iris_jax.CollectiveConfig())
                .reshape(v.shape)).lower(x)
            raise AssertionError("a kernel over two domains was lowered")
        except iris_jax.CrossDomainError as e:
            print(f"process {rank}: refused: {str(e)[:90]}...", flush=True)
    iris_jax.barrier()
    iris_jax.shutdown()
    print(f"process {rank}: domains OK", flush=True)


if __name__ == "__main__":
    main()
