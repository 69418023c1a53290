"""iris_jax.ops (GEMM fused with communication) on real GPUs against jnp.dot + the lax
collective, one process with every GPU (pytest -m gpu): the fused kernels forced
(impl="fused"), a shape that is not a multiple of the tiles and a benchmark shape, float32
and bfloat16, two calls back to back in one jit."""

import numpy as np
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]  # one GPU: test_gpu_shared.py stands in


@pytest.mark.parametrize("dtype_name", ["float32", "bfloat16"])
@pytest.mark.parametrize("M,K,N", [(1000, 520, 777), (4096, 2048, 4096)])
def test_fused_ops_match_xla(mesh, M, K, N, dtype_name):
    import jax
    import jax.numpy as jnp
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from iris_jax import ops

    W = mesh.size
    dtype = jnp.dtype(dtype_name)
    M -= M % W  # reduce-scatter splits the rows
    keys = jax.random.split(jax.random.key(M + K), 4)
    put = lambda x, spec: jax.device_put(x.astype(dtype), NamedSharding(mesh, spec))
    a_row = put(jax.random.normal(keys[0], (M, W * K)), P(None, "i"))   # [M, K] per rank
    b_row = put(jax.random.normal(keys[1], (W * K, N)), P("i", None))   # [K, N] per rank
    a_col = put(jax.random.normal(keys[2], (W * M, K)), P("i", None))   # [M, K] per rank
    b_col = put(jax.random.normal(keys[3], (K, W * N)), P(None, "i"))   # [K, N] per rank

    def fused(a_row, b_row, a_col, b_col):
        return (ops.matmul_all_reduce(a_row, b_row, "i", impl="fused"),
                ops.matmul_all_reduce(a_row * 2, b_row, "i", impl="fused"),
                ops.all_gather_matmul(a_col, b_col, "i", impl="fused"),
                ops.matmul_reduce_scatter(a_row, b_row, "i", impl="fused"))

    def unfused(a_row, b_row, a_col, b_col):
        dot = lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32).astype(dtype)
        return (lax.psum(dot(a_row, b_row), "i"), lax.psum(dot(a_row * 2, b_row), "i"),
                dot(lax.all_gather(a_col, "i", tiled=True), b_col),
                lax.psum_scatter(dot(a_row, b_row), "i", tiled=True))

    in_specs = (P(None, "i"), P("i", None), P("i", None), P(None, "i"))
    out_specs = (P(), P(), P(None, "i"), P("i"))
    run = lambda f: jax.jit(jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs))(
        a_row, b_row, a_col, b_col)
    tol = 2e-3 if dtype == jnp.float32 else 3e-2
    for name, got, want in zip(("matmul_all_reduce", "matmul_all_reduce x2", "all_gather_matmul",
                                "matmul_reduce_scatter"), run(fused), run(unfused), strict=True):
        got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale, err_msg=name)
