"""The simulator's collectives on the host give the collective kernels' values, bit for bit.

init(sim_collectives="host") (the default) runs a collective whose ranks are all in this process
as a meeting of the device threads combined with numpy (iris_core.sim.host_collectives); "kernels"
runs the collective kernels under Triton's interpreter, as GPUs run them. Every op and dtype the
kernels take, on groups of 2, 3 and 8 ranks, over a tuple of axes out of the mesh's order and over
axis_index_groups, one-shot and two-shot, with NaN, infinities and signed zeros among the floats:
each mode's results are compared byte by byte. (test_collectives.py checks both modes against lax.)
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from iris_core.errors import CStepWarning
from iris_jax.calls import host_meeting
from tests.jax.helpers import use_runtime

DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16, jnp.int32, jnp.uint8, jnp.int16)
N = 24  # elements per rank: divisible by every group size here
HEAP = 64 << 20


def _inputs(rng, ranks: int, dtype) -> np.ndarray:
    dtype = jnp.dtype(dtype)
    if jnp.issubdtype(dtype, jnp.integer):  # sums that wrap too
        info = jnp.iinfo(dtype)
        return rng.integers(info.min, int(info.max) + 1, (ranks, N)).astype(dtype)
    values = (rng.standard_normal((ranks, N)) * 100).astype(np.float32)
    values[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    values[1, :4] = [1.0, np.nan, np.inf, 0.0]
    return values.astype(dtype)


def _program(axes, config, groups=None):
    """Every collective of `axes` on one operand, as one jitted shard_map body's outputs."""
    def body(v):
        size = v.shape[0]
        outs = [iris_jax.psum(v, axes, axis_index_groups=groups, config=config),
                iris_jax.all_gather(v, axes, axis_index_groups=groups, tiled=True, config=config)]
        if groups is None:
            outs += [iris_jax.psum_scatter(v, axes, tiled=True, config=config),
                     iris_jax.all_to_all(v, axes, 0, 0, tiled=True, config=config)]
        if isinstance(axes, str):  # (jax 0.12 refuses a ppermute over axes out of the mesh's order)
            G = jax.lax.axis_size(axes)
            outs.append(iris_jax.ppermute(v, axes, [(i, (i + 1) % G) for i in range(G - 1)], config=config))
        if not jnp.issubdtype(v.dtype, jnp.unsignedinteger) or v.dtype.itemsize > 1:
            outs += [iris_jax.pmax(v, axes, axis_index_groups=groups, config=config),
                     iris_jax.pmin(v, axes, axis_index_groups=groups, config=config)]
        return [o.reshape(1, -1) if o.size != size else o.reshape(1, size) for o in outs]
    return body


CASES = {  # name: (mesh shape, mesh axes, the collectives' axes, axis_index_groups, all-reduce variant)
    "2 ranks": ((2,), ("i",), "i", None, "one_shot"),
    "3 ranks, two-shot": ((3,), ("i",), "i", None, "two_shot"),
    "8 ranks": ((8,), ("i",), "i", None, "one_shot"),
    "2x4 over (b, a)": ((2, 4), ("a", "b"), ("b", "a"), None, "two_shot"),
    "8 ranks in groups of 4": ((8,), ("i",), "i", ((0, 2, 4, 6), (1, 3, 5, 7)), "one_shot"),
}


def _results(mode: str, case: str) -> dict:
    shape, names, axes, groups, variant = CASES[case]
    host_meeting.enabled = mode != "host, Python meeting"  # (lowering reads it: every program is made here)
    mode = mode.split(",")[0]
    use_runtime(8, HEAP, sim_collectives=mode)
    mesh = jax.make_mesh(shape, names, devices=jax.devices()[:int(np.prod(shape))])
    config = iris_jax.CollectiveConfig(variant=variant)
    ranks = int(np.prod(shape))
    results = {}
    for dtype in DTYPES:
        x = jax.device_put(_inputs(np.random.default_rng(0), ranks, dtype).reshape(ranks * N),
                           NamedSharding(mesh, P(names)))
        body = _program(axes, config, groups)
        run = jax.jit(jax.shard_map(lambda v: body(v), mesh=mesh, in_specs=P(names), out_specs=P(names),  # noqa: B023
                                    check_vma=False))
        for i, out in enumerate(run(x)):
            results[jnp.dtype(dtype).name, i] = np.asarray(out).view(np.uint8)
    return results


@pytest.mark.parametrize("case", list(CASES))
def test_host_collectives_equal_the_kernels_bit_for_bit(case, monkeypatch):
    """Met in C (the default) and in Python (where no C compiler is found), against the kernels."""
    monkeypatch.setattr(host_meeting, "enabled", True)
    kernels = _results("kernels", case)
    for mode in ("host", "host, Python meeting"):
        sites = len(host_meeting._sites)
        host = _results(mode, case)
        assert (len(host_meeting._sites) > sites) == (mode == "host"), f"{mode}: the C meeting ran or did not"
        assert host.keys() == kernels.keys()
        differ = [key for key in host if not np.array_equal(host[key], kernels[key])]
        assert not differ, f"{case}: {mode} and kernels differ in {differ}"


def test_calls_shared_out_equal_the_python_meeting(monkeypatch):
    """Calls of a megabyte or more per member are shared out in C (every member does its part:
    host_meeting.c, SHARED_BYTES): their values equal the Python meeting's byte by byte, with
    slices that do not divide evenly among the members (the Python meeting equals the kernels:
    the test above)."""
    ranks, n = 8, (1 << 18) + 24  # float32: 1 MiB and 96 bytes per rank
    results = {}
    for meeting in ("C", "Python"):
        monkeypatch.setattr(host_meeting, "enabled", meeting == "C")
        sites = len(host_meeting._sites)
        use_runtime(8, HEAP)
        mesh = jax.make_mesh((ranks,), ("i",), devices=jax.devices()[:ranks])
        for dtype in (jnp.float32, jnp.bfloat16, jnp.int32):
            values = np.random.default_rng(1).standard_normal((ranks, n)) * 1000
            x = jax.device_put(values.astype(dtype).reshape(-1), NamedSharding(mesh, P("i")))
            body = _program("i", iris_jax.CollectiveConfig())
            run = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"), check_vma=False))
            for i, out in enumerate(run(x)):
                results[meeting, jnp.dtype(dtype).name, i] = np.asarray(out).view(np.uint8)
        assert (len(host_meeting._sites) > sites) == (meeting == "C")
    differ = [key[1:] for key in results if key[0] == "C" and not np.array_equal(results[key], results[("Python",
                                                                                                       *key[1:])])]
    assert not differ, f"the C meeting's shared calls differ from the Python meeting's in {differ}"
    total = np.asarray(jnp.asarray(np.random.default_rng(1).standard_normal((ranks, n)) * 1000, jnp.float32))
    np.testing.assert_array_equal(results["C", "float32", 0].view(np.float32).reshape(ranks, n)[3],
                                  functools.reduce(np.add, total))  # member order, in float32


def test_without_a_c_compiler_the_python_meeting_runs(monkeypatch, tmp_path):
    """No C compiler (CC names none): building the meeting warns, and the Python meeting runs the
    calls, with lax's values."""
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setenv("IRIS_KERNEL_CACHE_DIR", str(tmp_path))  # (nothing built before to load)
    host_meeting._library.cache_clear()
    try:
        with pytest.warns(CStepWarning, match=r"meeting place \(\S+host_meeting\.c\) did not build: .*; "
                                              r"the Python meeting \(iris_jax.calls.host_meeting\) takes its place"):
            assert host_meeting._library() is None
        sites = len(host_meeting._sites)
        use_runtime(4, HEAP)
        mesh = jax.make_mesh((4,), ("i",), devices=jax.devices()[:4])
        x = jax.device_put(np.arange(4 * N, dtype=np.float32), NamedSharding(mesh, P("i")))
        run = jax.jit(jax.shard_map(lambda v: iris_jax.psum(v, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i")))
        np.testing.assert_array_equal(np.asarray(run(x)).reshape(4, N)[2], np.arange(4 * N).reshape(4, N).sum(0))
        assert len(host_meeting._sites) == sites  # (no C site lowered)
    finally:
        host_meeting._library.cache_clear()
