"""@triton.autotune / @triton.heuristics kernels through jax_triton.triton_call on the CPU simulator.

The CPU path takes the first config that survives pruning (iris_jax.calls.autotune); each kernel
reports the BLOCK_SIZE it ran with, so the tests check the choice as well as the values.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import triton
from jax.core import ShapedArray
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from triton.runtime.errors import AutotunerError

import iris_jax
from iris_jax import compat
from iris_jax.compat import jax_triton as import_jax_triton
from tests.jax import autotune_kernels as kernels
from tests.jax.helpers import smap, use_runtime

jax_triton = import_jax_triton()
N = 37  # not a multiple of any block
CONFIGS = [
    triton.Config({"BLOCK_SIZE": 16}, num_warps=1, num_stages=1),
    triton.Config({"BLOCK_SIZE": 32}, num_warps=2, num_stages=3),
    triton.Config({"BLOCK_SIZE": 64}, num_warps=4, num_stages=2),
]


@pytest.fixture(scope="module", autouse=True)
def runtime():
    return use_runtime(2)


def inputs(n=N, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)


def add(kernel, x, y, **metaparams):
    """(x + y, [the BLOCK_SIZE the kernel ran with]) via jax_triton.triton_call."""
    out_shape = (jax.ShapeDtypeStruct(x.shape, x.dtype), jax.ShapeDtypeStruct((1,), jnp.int32))
    return jax_triton.triton_call(
        x,
        y,
        x.shape[0],
        kernel=kernel,
        out_shape=out_shape,
        grid=lambda meta: (triton.cdiv(x.shape[0], meta["BLOCK_SIZE"]),),
        **metaparams,
    )


def check_add(kernel, expected_block, **metaparams):
    x, y = inputs()
    out, block = jax.jit(lambda x, y: add(kernel, x, y, **metaparams))(x, y)
    np.testing.assert_array_equal(np.asarray(out), x + y)
    assert int(block[0]) == expected_block


@pytest.mark.parametrize("metaparams,block", [({}, 16), ({"BLOCK_SIZE": 32}, 32)], ids=["first", "explicit"])
def test_autotune_takes_first_config_that_agrees(metaparams, block):
    # a config that sets a metaparameter the caller passed otherwise is dropped, as in jax-triton
    check_add(triton.autotune(CONFIGS, key=["n"])(kernels.add), block, **metaparams)


def test_prune_configs_by_early_config_prune():
    seen = {}

    def prune(configs, named_args):
        seen.update(named_args)
        return [c for c in configs if c.kwargs["BLOCK_SIZE"] >= named_args["n"] // 2]

    check_add(triton.autotune(CONFIGS, key=["n"], prune_configs_by={"early_config_prune": prune})(kernels.add), 32)
    assert seen["n"] == N
    assert isinstance(seen["x_ptr"], ShapedArray) and seen["x_ptr"].shape == (N,)
    assert isinstance(seen["out_ptr"], ShapedArray) and seen["block_ptr"].shape == (1,)


def test_prune_configs_by_perf_model():
    def predicted_time(x_ptr, n, BLOCK_SIZE, num_warps, num_stages, **_):  # Triton's arguments: args, config
        assert x_ptr.shape == (n,) and num_warps * num_stages > 0
        return n / BLOCK_SIZE  # larger blocks predicted faster

    tuned = triton.autotune(CONFIGS, key=["n"], prune_configs_by={"perf_model": predicted_time, "top_k": 2})
    check_add(tuned(kernels.add), 64)


def test_heuristics_derive_constexprs():
    # a later heuristic sees an earlier one's value, as in jax-triton
    kernel = triton.heuristics(
        {"BLOCK_SIZE": lambda args: triton.next_power_of_2(args["n"]), "FACTOR": lambda args: args["BLOCK_SIZE"] // 16}
    )(kernels.scale)
    x, _ = inputs()
    f = jax.jit(lambda x: jax_triton.triton_call(x, x.shape[0], kernel=kernel, out_shape=x, grid=(1,)))
    np.testing.assert_array_equal(np.asarray(f(x)), x * 4)


def matmul(kernel, a, b, **metaparams):
    (m, k), (_, n) = a.shape, b.shape
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_SIZE_M"]) * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)
    return jax_triton.triton_call(
        a, b, m, n, k, kernel=kernel, out_shape=jax.ShapeDtypeStruct((m, n), a.dtype), grid=grid, **metaparams
    )


def divisible_recorder():
    """The K_EXACTLY_DIVISIBLE_BY_BLOCK heuristic of jax-triton's test, and the values it returned."""
    returned = []

    def heuristic(args):
        returned.append(args["K"] % args["BLOCK_SIZE_K"] == 0)
        return returned[-1]

    return {"K_EXACTLY_DIVISIBLE_BY_BLOCK": heuristic}, returned


def check_matmul(kernel, m, n, k, **metaparams):
    rng = np.random.default_rng(k)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    out = jax.jit(lambda a, b: matmul(kernel, a, b, **metaparams))(a, b)
    np.testing.assert_allclose(np.asarray(out), a @ b, rtol=1e-5, atol=1e-5)


def test_autotune_over_heuristics_matmul():
    heuristics, returned = divisible_recorder()
    configs = [triton.Config({"BLOCK_SIZE_K": 16}, num_warps=1), triton.Config({"BLOCK_SIZE_K": 32}, num_warps=1)]
    kernel = triton.autotune(configs, key=["M", "N", "K"])(triton.heuristics(heuristics)(kernels.matmul))
    check_matmul(kernel, 16, 16, 32, BLOCK_SIZE_M=16, BLOCK_SIZE_N=16)
    check_matmul(kernel, 16, 16, 24, BLOCK_SIZE_M=16, BLOCK_SIZE_N=16)
    assert returned == [True, False]  # once per call, for the chosen config (BLOCK_SIZE_K=16)
    assert configs[0].kwargs == {"BLOCK_SIZE_K": 16}  # the heuristics' values are not written into the configs


def test_heuristics_over_autotune_over_heuristics_matmul():
    if compat.JAX_TRITON_VERSION >= (0, 4):
        # jax-triton 0.4's own triton_call reads the kernel's parameters off the outermost wrapper,
        # which an autotuner under heuristics lacks: it refuses the kernel before any lowering
        kernel = triton.heuristics({"BLOCK_SIZE_M": lambda a: 16})(triton.autotune(
            [triton.Config({"BLOCK_SIZE_K": 8})], key=["K"])(kernels.matmul))
        with pytest.raises(AttributeError, match="params"):
            check_matmul(kernel, 12, 20, 24, BLOCK_SIZE_N=16)
        return
    inner, returned = divisible_recorder()
    configs = [triton.Config({"BLOCK_SIZE_K": 8}), triton.Config({"BLOCK_SIZE_K": 16})]
    tile = lambda dim: lambda args: min(16, triton.next_power_of_2(args[dim]))
    tuned = triton.autotune(configs, key=["K"], prune_configs_by={"early_config_prune": lambda cs, _: cs[1:]})
    kernel = triton.heuristics({"BLOCK_SIZE_M": tile("M"), "BLOCK_SIZE_N": tile("N")})(
        tuned(triton.heuristics(inner)(kernels.matmul))
    )
    check_matmul(kernel, 12, 20, 24)  # tiles 16 x 16: a grid of 2
    assert returned == [False]  # 24 % 16


@pytest.mark.parametrize("reset", [None, "out_ptr", "acc_ptr"])
@pytest.mark.parametrize("call", ["jax_triton", "iris_jax"])
def test_reset_to_zero_zeroes_the_atomic_output(call, reset):
    # out is aliased to acc, which holds 100: zeroed, the kernel's atomic adds give sum(x)
    plain, triton_call = {
        "jax_triton": (kernels.sum_into, jax_triton.triton_call),
        "iris_jax": (kernels.sum_into_with_context, iris_jax.triton_call),
    }[call]
    aliases = {1: 0}
    if call == "jax_triton" and compat.JAX_TRITON_VERSION >= (0, 4):
        # no parameter for the aliased output, and aliases count the scalars among the inputs
        plain, reset, aliases = kernels.sum_into_aliased, "acc_ptr" if reset else None, {2: 0}
    kernel = triton.autotune(CONFIGS[:2], key=["n"], reset_to_zero=[reset] if reset else None)(plain)
    grid = lambda meta: (triton.cdiv(N, meta["BLOCK_SIZE"]),)
    f = jax.jit(
        lambda x, acc: triton_call(x, N, acc, kernel=kernel, out_shape=acc, input_output_aliases=aliases, grid=grid)
    )
    x, _ = inputs()
    out = np.asarray(f(x, jnp.full((1,), 100.0, jnp.float32)))
    np.testing.assert_allclose(out[0], x.sum() + (0.0 if reset else 100.0), rtol=1e-5)


# (triton 3.9 refuses a name that is not a parameter itself, in its words)
@pytest.mark.parametrize("reset,match", [("acc_ptr", "read-only"), ("total", "not a parameter|not kernel arguments")])
def test_reset_to_zero_of_something_else_says_what_to_pass(reset, match):
    x, _ = inputs()
    acc = jnp.zeros((1,), jnp.float32)
    with pytest.raises(ValueError, match=match):  # (triton 3.9 checks the names when the autotuner is made)
        kernel = triton.autotune(CONFIGS[:1], key=["n"], reset_to_zero=[reset])(kernels.sum_into)
        jax_triton.triton_call(x, N, acc, kernel=kernel, out_shape=acc, grid=(3,))


def test_config_pre_hook_is_refused_as_on_gpu():
    configs = [triton.Config({"BLOCK_SIZE": 16}, pre_hook=lambda nargs: None)]
    x, y = inputs()
    with pytest.raises(NotImplementedError, match="pre_hook.*zeroed_outputs"):
        add(triton.autotune(configs, key=["n"])(kernels.add), x, y)


def test_autotuner_pre_hook_wraps_benchmarks_only():
    calls = []  # nothing is benchmarked on CPU (nor by jax-triton with it), so it is not called
    check_add(triton.autotune(CONFIGS, key=["n"], pre_hook=lambda *a, **k: calls.append(a))(kernels.add), 16)
    assert calls == []


def test_no_config_agrees():
    x, y = inputs()
    with pytest.raises(AutotunerError, match="no config of kernel add agrees"):
        add(triton.autotune(CONFIGS, key=["n"])(kernels.add), x, y, BLOCK_SIZE=8)


@pytest.mark.parametrize("call", ["jax_triton", "iris_jax"])
def test_every_rank_runs_the_same_config(call, W=2):
    # 2 ranks: 4 pass too, but starting their worker processes costs 10-20 s on 2 cores
    use_runtime(W)
    mesh = jax.make_mesh((W,), ("i",), devices=jax.devices()[:W])
    # the choice depends on the per-rank shape only: 37 elements per rank keep 32 and 64, take 32
    prune = {"early_config_prune": lambda cs, args: [c for c in cs if c.kwargs["BLOCK_SIZE"] >= args["n"] // 2]}
    x = np.random.default_rng(W).standard_normal(W * N).astype(np.float32)
    x_sharded = jax.device_put(x, NamedSharding(mesh, P("i")))
    if call == "jax_triton":
        kernel = triton.autotune(CONFIGS, key=["n"], prune_configs_by=prune)(kernels.add)
        out, block = smap(mesh, lambda x: add(kernel, x, x), P("i"), (P("i"), P("i")))(x_sharded)
        np.testing.assert_array_equal(np.asarray(out), x + x)
        np.testing.assert_array_equal(np.asarray(block), np.full(W, 32))
    else:
        kernel = triton.autotune(CONFIGS, key=["n"], prune_configs_by=prune)(kernels.rank_and_block)
        out_shape = (jax.ShapeDtypeStruct((N,), jnp.float32), jax.ShapeDtypeStruct((2,), jnp.int32))
        f = lambda x: iris_jax.triton_call(
            x, N, kernel=kernel, out_shape=out_shape, W=W, grid=lambda meta: (triton.cdiv(N, meta["BLOCK_SIZE"]),)
        )
        out, info = smap(mesh, f, P("i"), (P("i"), P("i")))(x_sharded)
        np.testing.assert_array_equal(
            np.asarray(out).reshape(W, N), x.reshape(W, N) + np.arange(W, dtype=np.float32)[:, None]
        )
        np.testing.assert_array_equal(np.asarray(info).reshape(W, 2), np.stack([np.arange(W), np.full(W, 32)], 1))
