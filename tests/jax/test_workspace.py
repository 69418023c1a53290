"""Workspaces sized to the call (iris_jax._runtime.workspace): size classes, every grouping of
a 3-D mesh with the GPUs' default sizes in a 1 GiB heap (issue 51's probe), and many
compilations over changing meshes and groupings with bounded workspace use."""

import itertools
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_jax._runtime import backends
from iris_jax._runtime.workspace import MIN_CLASS_BYTES, GroupWorkspaces, workspaces
from tests.jax.helpers import smap, use_runtime

MiB = 1 << 20
GPU_SIZES = {"IRIS_WORKSPACE_BYTES": str(16 * MiB), "IRIS_STREAM_BYTES": str(64 * MiB),
             "IRIS_FUSED_WORKSPACE_BYTES": str(128 * MiB)}


def _pool(monkeypatch, settings=GPU_SIZES, world_size=8):
    for name in ("IRIS_WORKSPACE_BYTES", "IRIS_STREAM_BYTES", "IRIS_FUSED_WORKSPACE_BYTES"):
        monkeypatch.delenv(name, raising=False)
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    rt = SimpleNamespace(backend=backends.GpuSingleProcess(), world_size=world_size, heap_size=1 << 30)
    return GroupWorkspaces(rt)


def test_size_classes_are_quarters_of_the_largest(monkeypatch):
    pool = _pool(monkeypatch)
    sizes = [(c.data_bytes, c.stream_capacity) for c in pool.classes("collective")]
    assert sizes == [(16 * MiB, 64 * MiB), (4 * MiB, 16 * MiB), (MiB, 4 * MiB), (256 << 10, MiB),
                     (MIN_CLASS_BYTES, 256 << 10)]
    assert [c.data_bytes for c in pool.classes("fused")] == [128 * MiB >> 2 * k for k in range(6)]
    assert pool.fitting("collective", 100).data_bytes == MIN_CLASS_BYTES
    assert pool.fitting("collective", 300 << 10, streamed=True).stream_capacity == MiB
    assert pool.fitting("collective", 2 * MiB).data_bytes == 4 * MiB
    assert pool.fitting("collective", 1 << 30) == pool.layout  # larger than any: the largest (chunked)
    for part in ("collective", "fused"):
        for layout in pool.classes(part):
            assert pool.layout_of(pool.key(part, layout)) == layout
    assert pool.key("collective", pool.layout) == "collective"  # the largest keeps the part's name
    # a largest class below the smallest: the only class (IRIS_WORKSPACE_BYTES=8192, the tests' chunking)
    assert len(_pool(monkeypatch, {"IRIS_WORKSPACE_BYTES": "8192"}).classes("collective")) == 1


@pytest.fixture
def gpu_sizes(monkeypatch):
    """A runtime over 8 simulated ranks with the GPUs' default sizes and a 1 GiB heap."""
    iris_jax.shutdown()
    for name, value in GPU_SIZES.items():
        monkeypatch.setenv(name, value)
    yield iris_jax.init(heap_size=1 << 30)
    iris_jax.shutdown()


def test_every_grouping_of_a_3d_mesh_fits_with_the_gpu_defaults(gpu_sizes, rng):
    """Issue 51's probe: psum, all_gather and psum_scatter over each of the 7 groupings of a
    2 x 2 x 2 mesh, then matmul_reduce_scatter over two; values equal lax's, and the workspaces
    hold at most 2 x what one partition's took before (its 195 MiB collective workspace)."""
    names = ("x", "y", "z")
    mesh = jax.make_mesh((2, 2, 2), names)
    x = jax.device_put(rng.standard_normal(8 * 64).astype(np.float32), NamedSharding(mesh, P(names)))
    spec = (P(names),) * 3
    for k in (1, 2, 3):
        for axes in itertools.combinations(names, k):
            def body(v, ax=axes, use=iris_jax):
                return use.psum(v, ax), use.all_gather(v, ax, tiled=True), use.psum_scatter(v, ax, tiled=True)

            got = smap(mesh, body, P(names), spec)(x)
            want = smap(mesh, lambda v, ax=axes: body(v, ax, lax), P(names), spec)(x)
            for g, w in zip(got, want):
                np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    for axes in (("x",), ("y", "z")):
        G = 2 if axes == ("x",) else 4
        a = jax.device_put(rng.standard_normal((8 * G, 256)).astype(np.float32), NamedSharding(mesh, P(None, names)))
        b = jax.device_put(rng.standard_normal((256, 32)).astype(np.float32), NamedSharding(mesh, P(names, None)))
        specs = ((P(None, names), P(names, None)), P(names))
        got = smap(mesh, lambda u, v, ax=axes: iris_jax.ops.matmul_reduce_scatter(u, v, ax, impl="fused"), *specs)
        want = smap(mesh, lambda u, v, ax=axes: lax.psum_scatter(jnp.dot(u, v), ax, tiled=True), *specs)
        np.testing.assert_allclose(np.asarray(got(a, b)), np.asarray(want(a, b)), rtol=1e-4, atol=1e-4)
    stats = iris_jax.memory_stats()
    one_partition_before = workspaces().layout.total_bytes
    assert stats["num_workspaces"] == 9, stats
    assert stats["workspaces_bytes_in_use"] <= 2 * one_partition_before, stats
    assert stats["workspaces_bytes_in_use"] == workspaces().nbytes


def test_many_compilations_over_changing_meshes_keep_workspaces_bounded(rng):
    """Compilations over a cycle of meshes, device orders, groupings and sizes (a long program's
    retraces): the workspaces stop growing once every (partition, class) was seen, however many
    compilations follow. Every 16th runs and is checked against lax."""
    use_runtime(4)
    devices = jax.devices()[:4]
    meshes = [jax.make_mesh((4,), ("i",), devices=devices),
              jax.make_mesh((4,), ("i",), devices=devices[::-1]),
              jax.make_mesh((2, 2), ("x", "y"), devices=devices),
              jax.make_mesh((2, 2), ("x", "y"), devices=[devices[i] for i in (0, 2, 1, 3)])]
    groupings = [(m, a, None) for m in meshes for a in m.axis_names]
    groupings += [(meshes[2], ("x", "y"), None), (meshes[0], "i", ((0, 2), (1, 3)))]
    sizes = [64, 96, 20_000, 40_000]  # two size classes (the small and the largest), new shapes each
    used = []
    for n, ((mesh, axes, groups), size) in enumerate(itertools.product(groupings * 4, sizes)):
        spec = P(mesh.axis_names)
        x = jax.device_put(rng.standard_normal(4 * (size + n)).astype(np.float32), NamedSharding(mesh, spec))
        f = smap(mesh, lambda v, ax=axes, g=groups: iris_jax.psum(v, ax, axis_index_groups=g), spec, spec,
                 check_vma=False)  # (lax's psum over axis_index_groups needs it)
        compiled = f.lower(x).compile()
        if n % 16 == 0:
            ref = smap(mesh, lambda v, ax=axes, g=groups: lax.psum(v, ax, axis_index_groups=g), spec, spec,
                       check_vma=False)
            np.testing.assert_allclose(np.asarray(compiled(x)), np.asarray(ref(x)), rtol=1e-5, atol=1e-5)
        used.append(iris_jax.memory_stats()["workspaces_bytes_in_use"])
    cycle = len(groupings) * len(sizes)
    assert len(used) == 4 * cycle
    assert used[-1] == used[cycle - 1], used  # nothing new after the first cycle
    assert max(used) == used[-1]


def test_explain_names_the_workspace_each_call_uses(rng):
    """explain() names each iris call's workspace (part and size class), and they are the ones
    its compiled program uses: a small call the smallest class, a large one the largest, and
    collectives that share a launch (the psums here: one equation's pytree, and one
    independent of it) the class of that launch."""
    from iris_jax.collectives import lowering

    use_runtime(4)
    mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
    small, large = 256, 1 << 16  # floats per rank: 1 KiB, and the simulator's largest buffer

    def body(a, b, use=lax):
        return use.psum(a, "i"), use.all_gather(b, "i", tiled=True), use.psum((a, a), "i")

    x = jax.device_put(rng.standard_normal(4 * small).astype(np.float32), NamedSharding(mesh, P("i")))
    y = jax.device_put(rng.standard_normal(4 * large).astype(np.float32), NamedSharding(mesh, P("i")))
    program = jax.shard_map(body, mesh=mesh, in_specs=(P("i"), P("i")), out_specs=(P("i"), P("i"), (P("i"),) * 2))
    rows = iris_jax.explain(program, x, y)
    assert [(r.op, r.runs_on) for r in rows] == [("psum", "iris"), ("all_gather", "iris"), ("psum", "iris"),
                                                 ("psum", "iris")]
    assert rows[0].workspace == f"collective {MIN_CLASS_BYTES >> 10} KiB"
    assert rows[1].workspace.endswith("(largest)")
    assert rows[0].workspace == rows[2].workspace == rows[3].workspace  # one launch
    assert all(f"[workspace {r.workspace}]" in str(r) for r in rows)

    replaced = iris_jax.replace_lax_collectives(program)
    with lowering.recording() as launched:
        compiled = replaced.lower(x, y).compile()
    assert [(la.what, lowering.workspace_name(la.workspace)) for la in launched] == [
        ("all_reduce(sum)", rows[0].workspace), ("all_gather", rows[1].workspace)]
    partition = ((0, 1, 2, 3),)
    held = [(w.part, w.size) for w in workspaces().allocated() if w.groups == partition]
    for la in launched:  # allocated as the lowering named them
        assert (la.workspace.split("/")[0], workspaces().layout_of(la.workspace).data_bytes) in held
    for got, want in zip(jax.tree.leaves(compiled(x, y)), jax.tree.leaves(jax.jit(program)(x, y))):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
