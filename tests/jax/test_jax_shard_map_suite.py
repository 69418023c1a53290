"""JAX's own shard_map tests that call a collective (its tests/shard_map_test.py), run on the
simulator with lax's collectives swapped for iris's: `jax.lax.NAME = iris_jax.NAME` for each
collective iris provides under lax's name (psum, pmean, pmax, pmin, all_gather, psum_scatter,
all_to_all, ppermute, pshuffle, pswapaxes, pbroadcast, ragged_all_to_all: `jax_suite.SWAPPED`).
JAX's file imports `from jax import lax` and calls `lax.psum` (or `jax.lax.psum`), both looked up
on the jax.lax module when the test runs, which is where the swap is made.

JAX's test files are not copied here: set IRIS_JAX_TESTS to the tests/ folder of a JAX source
tree of the installed version (tests/jax/jax_suite.py, docs/testing.md); without it these skip.

Selected: the tests of JAX's file whose method calls one of the swapped collectives
(`lax.psum(...)`, `jax.lax.all_gather(...)`, ...; found in each method's source). Not selected:
the rest, which run no collective iris provides (shard_map alone, lax.axis_index /
lax.axis_size, which send nothing, lax.psend / precv, the systematic tests, whose functions call
no collective, and the psum that shard_map inserts itself when transposing, which is lax's
primitive, not a call of `lax.psum`).

What passes (docs/testing.md): every selected test, on both stacks. jax 0.10.2 (JAX's tests at
jax-v0.10.2): 56 selected, 54 pass, 2 skip; the newest stack (jax 0.12.0.1; JAX's tests of its
main branch, 0.11.1.dev, the newest the mirror holds): 65 selected, 63 pass, 2 skip. The two
skips are JAX's own (`test_pbroadcast_*`: "Skipped unless running on devices with tags: gpu").

Passed over, and only these checks (the rest of each test, its values included, runs): the checks
that grep lax's own names where iris's `iris_collective` equation or kernel call stands instead
(`LAX_OP_NAMES`, `LAX_PRIMITIVES`):

- test_fanin_psum_transposes_to_fanout, test_psum_with_implicit_fanout_self_transposes,
  test_rewrite_scan: `assertEqual(str(eqn.primitive), 'pvary' / 'psum_invariant')` on equations
  of a jaxpr (iris's rewrite binds its primitive for lax's collectives and the pvary before them);
- test_all_gather_with_vma_in_types, test_pmax_vma_in_types: `assertIn("pvary[axes=...",
  str(jaxpr))` (there: `iris_collective[collective=pvary ...]`);
- newer JAX only: test_all_reduce_rgv3, _rgv3_multiple_meshes, test_all_gather_rgv3,
  test_all_to_all_rgv3, test_reduce_scatter_rgv3_* (3): the lowered module's replica groups of
  XLA's collective ops (`replica_group_mesh_axes`, its `axis_ref`, the mesh it cites).
"""

from __future__ import annotations

import pytest

from tests.jax import jax_suite

FILE = "shard_map_test.py"
# what lax's jaxpr holds and iris's does not: iris's rewrite turns lax's collectives, and the
# pvary (pcast to varying) that lax's put in front of them, into its `iris_collective` equations
LAX_OP_NAMES = (
    "pvary[",  # assertIn("pvary[axes=('x',)", str(jaxpr))
    "replica_group_mesh_axes",  # the replica groups of XLA's collective ops in the lowered module
    "#stablehlo.axis_ref<",  # ... their axes (the _rgv3 tests of JAX after 0.11)
    r"mesh = (@mesh|#sdy\.mesh)",  # ... and the mesh they cite (assertRegex of the _rgv3 tests)
)
LAX_PRIMITIVES = ("pvary", "psum_invariant")  # assertEqual(str(eqn.primitive), "pvary")
# after these tests a 64 MiB heap had 63.5 MiB in use (the workspaces of the partitions of the
# ranks that they run over): twice that leaves room (each of JAX's files gets a runtime of its
# own, jax_suite.patch_case)
HEAP = 128 << 20

MODULE = jax_suite.load(FILE, "jax_shard_map_test")
CASES = ("ShardMapTest", "SdyIntegrationTest", "CustomPartitionerTest", "ShardMapSystematicTest",
         "SmapSystematicTest")


TESTS = jax_suite.selected(MODULE, CASES, world=8, heap=HEAP, lax_op_names=LAX_OP_NAMES,
                           lax_primitives=LAX_PRIMITIVES) if MODULE else {}


@pytest.mark.skipif(MODULE is None, reason=jax_suite.missing_reason(FILE))
@pytest.mark.parametrize("name", sorted(TESTS) or ["(JAX's tests not found)"])
def test_jax_shard_map_test(name, monkeypatch):
    """One of JAX's shard_map tests, with iris's collectives in lax's place."""
    jax_suite.run(TESTS[name], monkeypatch)
