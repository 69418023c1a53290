"""Program order of the simulator's kernel calls (issue 57, point 8).

XLA:CPU runs independent operations as soon as their inputs are ready, on several threads where
many are ready at once; one GPU stream runs them in program order. Kernel calls in a nested jit,
a scan body or after a loop were not chained to the caller's (cpu_lowering chained calls of one
MLIR block only), so two collectives of different groups could run in different orders on
different ranks and wait for each other: the 3D-parallel tutorial (pipeline ppermute rings x
tensor all-reduces x data parallel, bf16) stopped with PeerTimeoutError. The program here has
that shape: in a scan over steps, many independent matmuls (a wide ready queue), then ppermutes
over "pipe" and "data" and psums over "tensor", some in nested jits, a pmean over "data" after
the loop (iris_jax.calls.program_order).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import iris_jax
from tests.jax.helpers import use_runtime

RING = [(0, 1), (1, 0)]
D, K, STEPS = 256, 24, 2


def _step(module):
    @jax.jit
    def tensor_sum(h):  # a library's jitted layer
        return module.psum(h, "tensor")

    @jax.jit
    def pipe_ring(h):
        return module.ppermute(h, "pipe", RING)

    def step(w, x):
        def body(c, _):
            hs = [jnp.tanh(c @ (w * (k + 1))) for k in range(K)]  # independent: many ready at once
            outs = [tensor_sum(hs[0]), pipe_ring(hs[1]), module.ppermute(hs[2], "data", RING),
                    module.psum(hs[3], "tensor"), tensor_sum(hs[4]), module.ppermute(hs[5], "pipe", RING)]
            return (sum(outs) + sum(hs[6:])) / K, None

        h, _ = lax.scan(body, x, None, length=2)
        g = module.pmean(h, "data")  # after the loop
        return w + jnp.mean(g) * 1e-3, module.psum(jnp.sum(h.astype(jnp.float32))[None], ("pipe", "tensor"))

    mesh = jax.make_mesh((2, 2, 2), ("pipe", "tensor", "data"), devices=jax.devices()[:8])
    f = jax.jit(jax.shard_map(step, mesh=mesh, in_specs=(P(), P("data")), out_specs=(P(), P("data")),
                              check_vma=False))
    return f, mesh


def _inputs(mesh):
    rng = np.random.default_rng(0)
    w = jax.device_put(jnp.asarray(rng.standard_normal((D, D)) / 16, jnp.bfloat16), NamedSharding(mesh, P()))
    x = jax.device_put(jnp.asarray(rng.standard_normal((4, D)), jnp.bfloat16), NamedSharding(mesh, P("data")))
    return w, x


def _kernel_calls(text: str):
    """The iris kernel custom calls of a lowered module, each with its operand list."""
    return re.findall(r"stablehlo\.custom_call @iris_cpu_kernel_\d+\(([^)]*)\)", text)


@pytest.mark.parametrize("mode", ["host", "kernels"])
def test_calls_chained_across_nested_jit_and_loops(mode):
    use_runtime(8, sim_collectives=mode)
    f, mesh = _step(iris_jax)
    text = f.lower(*_inputs(mesh)).as_text()
    # nested jits that run kernels are lowered inline: every kernel call is in main's body
    main = next(f for f in re.split(r"\n  func\.func ", text) if f.startswith("public @main"))
    assert len(_kernel_calls(main)) == len(_kernel_calls(text)) == 8
    # the first call of the loop body starts the chain; every later one takes the previous
    # call's result (or the loop's) as its last operand: 4 operands (partition id, context and
    # group tables, input), 5 once chained
    counts = [len(c.split(",")) for c in _kernel_calls(text)]
    assert counts == [4] + [5] * 7, counts


@pytest.mark.parametrize("mode", ["host", "kernels"])
def test_independent_rings_and_all_reduces_run_in_one_order(mode):
    """Hung (PeerTimeoutError) before the calls were ordered across blocks."""
    use_runtime(8, sim_collectives=mode)
    f_iris, mesh = _step(iris_jax)
    f_lax, _ = _step(lax)
    w, x = _inputs(mesh)
    w_lax = w
    with iris_jax.use_config(iris_jax.CollectiveConfig(timeout_s=20.0)):
        for _ in range(STEPS):
            w, loss = f_iris(w, x)
            w_lax, loss_lax = f_lax(w_lax, x)
            np.testing.assert_allclose(np.asarray(loss), np.asarray(loss_lax), rtol=2e-2)
    np.testing.assert_allclose(np.asarray(w, np.float32), np.asarray(w_lax, np.float32), rtol=2e-2, atol=1e-2)
