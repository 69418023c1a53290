"""Run by test_domains_launched.py as `IRIS_DOMAIN_SIZE=2 python -m iris_core.sim -n 4 launched_domains.py`.

Four processes of one CPU device each, joined by `jax.distributed.initialize()`, split into two
domains of two ranks; over a ("node", "gpu") mesh whose "node" axis crosses them, iris's
collectives over both axes (iris inside a domain, XLA/gloo across) equal lax's; each process
prints `process P: domains OK`.
"""

import faulthandler
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

BOTH = ("node", "gpu")


def every_collective(lib, config=None):
    kw = {} if config is None else {"config": config}
    return lambda x: (lib.psum(x, BOTH, **kw), lib.pmean(x, BOTH[::-1], **kw),
                      lib.all_gather(x, BOTH, axis=1, tiled=True, **kw),
                      lib.psum_scatter(x, BOTH, scatter_dimension=0, tiled=True, **kw))


def main():
    faulthandler.dump_traceback_later(150, exit=True)
    import jax

    jax.distributed.initialize()
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    me = jax.process_index()
    rt = iris_jax.init(heap_size=16 << 20)
    assert rt.mode == "sim-launched" and rt.domains == ((0, 1), (2, 3)), rt.domains
    mesh = Mesh(np.array(sorted(jax.devices(), key=lambda d: d.id)).reshape(2, 2), BOTH)
    sharding = NamedSharding(mesh, P(BOTH))
    full = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32)
    x = jax.make_array_from_callback(full.shape, sharding, lambda index: jnp.asarray(full[index]))

    def run(f):
        return jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P(BOTH), out_specs=P(BOTH)))

    want = run(every_collective(lax))(x)
    for config in (None, iris_jax.CollectiveConfig(scatter_hierarchy_from=0)):
        program = run(every_collective(iris_jax, config))
        assert "iris_cpu_kernel" in program.lower(x).as_text(), "no iris kernel"
        for g, w in zip(program(x), want):
            np.testing.assert_allclose(np.asarray(g.addressable_shards[0].data),
                                       np.asarray(w.addressable_shards[0].data), rtol=1e-5, atol=1e-5)
    iris_jax.barrier()
    iris_jax.shutdown()
    print(f"process {me}: domains OK", flush=True)


if __name__ == "__main__":
    main()
