"""The heap's workspaces over every grouping of a 3-D mesh (issue 51's probe), on the simulator.

8 simulated ranks on a 2 x 2 x 2 mesh (x, y, z) with the GPUs' default sizes (IRIS_HEAP_SIZE
1 GiB, IRIS_WORKSPACE_BYTES 16 MiB, IRIS_STREAM_BYTES 64 MiB, IRIS_FUSED_WORKSPACE_BYTES
128 MiB): psum, all_gather and psum_scatter over each of the 7 non-empty subsets of the axes,
then matmul_reduce_scatter over two of them; every value checked against lax. Prints the heap's
memory_stats after each step and a table (RESULTS.md records it). --small: 2 x 2 x 1 ranks on
the simulator's default sizes, the same steps.

--compilations N: then N compilations of psum over changing meshes (device orders, shapes),
groupings (axes, axis tuples, axis_index_groups) and sizes (new shapes each time; every 50th
run and checked against lax), printing the workspaces' bytes after each cycle of them.

    python benchmarks/workspace_probe.py [--elements N] [--compilations N] [--small]
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import small  # noqa: E402

GPU_DEFAULTS = {"IRIS_HEAP_SIZE": str(1 << 30), "IRIS_WORKSPACE_BYTES": str(16 << 20),
                "IRIS_STREAM_BYTES": str(64 << 20), "IRIS_FUSED_WORKSPACE_BYTES": str(128 << 20)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elements", type=int, default=64, help="float32 elements per rank of each collective")
    parser.add_argument("--compilations", type=int, default=0, help="then this many compilations (see above)")
    small.add_flag(parser, "2 x 2 x 1 ranks, the simulator's default sizes")
    args = parser.parse_args()
    shape = (2, 2, 1) if args.small else (2, 2, 2)
    if not args.small:
        os.environ.update(GPU_DEFAULTS)
    small.use_simulator(shape[0] * shape[1] * shape[2])

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import PartitionSpec as P

    import iris_jax

    names = ("x", "y", "z")
    mesh = jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Explicit,) * 3)
    rng = np.random.default_rng(0)
    n = args.elements * 8  # divisible by every group size
    x = jax.device_put(rng.standard_normal((8 * n,)).astype(np.float32),
                       jax.sharding.NamedSharding(mesh, P(names)))
    rows = []

    def record(step: str, seconds: float) -> None:
        stats = iris_jax.memory_stats()
        rows.append((step, stats["workspaces_bytes_in_use"], stats["num_workspaces"], stats["bytes_in_use"],
                     stats["bytes_mapped"], seconds))

    subsets = [s for k in (1, 2, 3) for s in itertools.combinations(names, k)]
    for axes in subsets:
        def body(v, ax=axes, use=iris_jax):
            return (use.psum(v, ax), use.all_gather(v, ax, tiled=True), use.psum_scatter(v, ax, tiled=True))

        def ref(v, ax=axes):
            return (lax.psum(v, ax), lax.all_gather(v, ax, tiled=True), lax.psum_scatter(v, ax, tiled=True))

        spec = (P(names), P(names), P(names))
        start = time.perf_counter()
        got = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P(names), out_specs=spec))(x)
        want = jax.jit(jax.shard_map(ref, mesh=mesh, in_specs=P(names), out_specs=spec))(x)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
        record("psum, all_gather, psum_scatter over " + "".join(axes), time.perf_counter() - start)

    K, N = 32, 32
    for axes in (("x",), ("y", "z")):
        G = int(np.prod([mesh.shape[a] for a in axes]))
        a = jax.device_put(rng.standard_normal((8 * G, 8 * K)).astype(np.float32),
                           jax.sharding.NamedSharding(mesh, P(None, names)))
        b = jax.device_put(rng.standard_normal((8 * K, N)).astype(np.float32),
                           jax.sharding.NamedSharding(mesh, P(names, None)))

        def fused(u, v, ax=axes):
            return iris_jax.ops.matmul_reduce_scatter(u, v, ax, impl="fused")

        def fused_ref(u, v, ax=axes):
            return lax.psum_scatter(jnp.dot(u, v), ax, scatter_dimension=0, tiled=True)

        specs = dict(mesh=mesh, in_specs=(P(None, names), P(names, None)), out_specs=P(names))
        start = time.perf_counter()
        got = jax.jit(jax.shard_map(fused, **specs))(a, b)
        want = jax.jit(jax.shard_map(fused_ref, **specs))(a, b)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)
        record("matmul_reduce_scatter over " + "".join(axes), time.perf_counter() - start)

    from iris_jax._runtime.workspace import workspaces

    print("| step | workspaces (bytes) | workspaces | heap in use | heap mapped | s |")
    print("|---|---|---|---|---|---|")
    for step, ws, count, used, mapped, seconds in rows:
        print(f"| {step} | {ws:,} | {count} | {used:,} | {mapped:,} | {seconds:.1f} |")
    pool = workspaces()
    print(f"one partition's largest classes: collective {pool.layout.total_bytes:,} bytes, fused "
          f"{pool.fused_layout.total_bytes:,} bytes; stats: {iris_jax.memory_stats()}")
    if args.compilations:
        compilations(args.compilations, mesh, rng)


def compilations(count: int, mesh, rng) -> None:
    """`count` compilations over a cycle of meshes, groupings and sizes; the workspaces per cycle."""
    import jax
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax

    devices = list(mesh.devices.flat)
    n_dev = len(devices)
    meshes = [jax.make_mesh((n_dev,), ("i",), devices=devices), jax.make_mesh((n_dev,), ("i",), devices=devices[::-1]),
              jax.make_mesh((2, n_dev // 2), ("a", "b"), devices=devices),
              jax.make_mesh((n_dev // 2, 2), ("a", "b"), devices=devices[::-1])]
    groupings = [(m, axes, None) for m in meshes for axes in [*m.axis_names, m.axis_names]]
    half = n_dev // 2
    groupings += [(meshes[0], "i", (tuple(range(half)), tuple(range(half, n_dev)))),
                  (meshes[0], "i", (tuple(range(0, n_dev, 2)), tuple(range(1, n_dev, 2))))]
    cases = [(g, size) for g in groupings for size in (64, 20_000)]
    print(f"\n{count} compilations, a cycle of {len(cases)} (meshes x groupings x sizes):")
    print("| compilations | workspaces (bytes) | workspaces | s |")
    print("|---|---|---|---|")
    start = time.perf_counter()
    for n in range(count):
        (m, axes, groups), size = cases[n % len(cases)]
        spec = P(m.axis_names)
        x = jax.device_put(rng.standard_normal(n_dev * (size + n)).astype(np.float32), NamedSharding(m, spec))

        def body(v, ax=axes, g=groups, use=iris_jax):
            return use.psum(v, ax, axis_index_groups=g)

        smap = dict(mesh=m, in_specs=spec, out_specs=spec, check_vma=False)  # (lax's grouped psum needs it)
        compiled = jax.jit(jax.shard_map(body, **smap)).lower(x).compile()
        if n % 50 == 0:
            want = jax.jit(jax.shard_map(lambda v, ax=axes, g=groups: body(v, ax, g, lax), **smap))(x)
            np.testing.assert_allclose(np.asarray(compiled(x)), np.asarray(want), rtol=1e-5, atol=1e-5)
        if (n + 1) % len(cases) == 0 or n + 1 == count:
            stats = iris_jax.memory_stats()
            print(f"| {n + 1} | {stats['workspaces_bytes_in_use']:,} | {stats['num_workspaces']} | "
                  f"{time.perf_counter() - start:.0f} |", flush=True)


if __name__ == "__main__":
    main()
