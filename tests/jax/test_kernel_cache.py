"""iris_jax.calls.kernel_cache: GPU kernel compiles kept on disk (compiled here for sm_90; no GPU needed)."""

import os

import triton
import triton.language as tl

from iris_jax.calls import kernel_cache


@triton.jit
def _scale(x_ptr, out_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr = 128, NEGATE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n) * FACTOR
    if NEGATE:
        v = -v
    tl.store(out_ptr + offs, v, mask=offs < n)


@triton.jit
def _scale_other(x_ptr, out_ptr, n, FACTOR: tl.constexpr, BLOCK: tl.constexpr = 128, NEGATE: tl.constexpr = False):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + FACTOR, mask=offs < n)


_OPTIONS = {"num_warps": 4, "num_stages": 3, "num_ctas": 1, "enable_fp_fusion": True, "debug": False}


def _compile(cache, fn=_scale, **metaparams):
    return kernel_cache.compile_kernel(
        cache, fn, ["*fp32", "*fp32", "i32"], [(2, "i32", 1000)], options=_OPTIONS, compute_capability=90,
        metaparams={"FACTOR": 2, "BLOCK": 128, "NEGATE": False, **metaparams})


def test_a_second_process_loads_what_the_first_compiled(tmp_path):
    first = kernel_cache.KernelCache(str(tmp_path))
    compiled, attrs = _compile(first)
    assert (first.compiled, first.loaded) == (1, 0)
    assert ".visible .entry _scale" in compiled.asm and "tt.func" in compiled.ttir
    # what iris's GPU lowering reads: pointers 16-byte aligned, scalars not
    assert attrs == {(0,): [["tt.divisibility", 16]], (1,): [["tt.divisibility", 16]], (2,): []}
    assert _compile(first)[0] is compiled and first.compiled == 1  # memory
    second = kernel_cache.KernelCache(str(tmp_path))  # a new process: same directory, empty memory
    again, _ = _compile(second)
    assert (second.compiled, second.loaded) == (0, 1)
    assert again == compiled


def test_every_input_of_the_ptx_is_in_the_key(tmp_path):
    cache = kernel_cache.KernelCache(str(tmp_path))
    base = _compile(cache)[0]
    variants = [_compile(cache, BLOCK=256)[0], _compile(cache, NEGATE=True)[0], _compile(cache, FACTOR=3)[0],
                _compile(cache, fn=_scale_other)[0]]
    assert cache.compiled == 5 and len({v.asm for v in [base, *variants]}) == 5
    # constexprs by name (Triton's own source key joins their values without names)
    keys = {kernel_cache.kernel_key(_scale, {"n": "i32"}, constants, {}, _OPTIONS, 90)
            for constants in ({"BLOCK": 1}, {"NEGATE": 1})}
    assert len(keys) == 2
    assert kernel_cache.kernel_key(_scale, {}, {"F": object()}, {}, _OPTIONS, 90) is None  # no stable text
    # every option and the target are in the key
    assert kernel_cache.kernel_key(_scale, {}, {}, {}, {**_OPTIONS, "num_warps": 8}, 90) != \
        kernel_cache.kernel_key(_scale, {}, {}, {}, _OPTIONS, 90) != kernel_cache.kernel_key(_scale, {}, {}, {}, _OPTIONS, 80)


def test_a_scalar_equal_to_one_is_compiled_in(tmp_path):
    cache = kernel_cache.KernelCache(str(tmp_path))
    one, attrs = kernel_cache.compile_kernel(
        cache, _scale, ["*fp32", "*fp32", "i32"], [(2, "i32", 1)], options=_OPTIONS, compute_capability=90,
        metaparams={"FACTOR": 2})
    other = _compile(cache)[0]
    assert ".param .u32 _scale_param_2" in other.asm
    assert ".param .u32" not in one.asm  # n is the constant 1: no parameter
    assert kernel_cache.is_one(1) and not kernel_cache.is_one(True) and not kernel_cache.is_one(1.0)


def test_an_unreadable_entry_is_compiled_again(tmp_path):
    cache = kernel_cache.KernelCache(str(tmp_path))
    compiled = _compile(cache)[0]
    for root, _, files in os.walk(tmp_path):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"damaged")
    fresh = kernel_cache.KernelCache(str(tmp_path))
    assert _compile(fresh)[0] == compiled and (fresh.compiled, fresh.loaded) == (1, 0)
    reread = kernel_cache.KernelCache(str(tmp_path))
    assert _compile(reread)[0] == compiled and reread.loaded == 1


def test_an_unwritable_directory_only_costs_compiles(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = kernel_cache.KernelCache(str(blocker / "below"))  # a directory under a file: cannot exist
    assert _compile(cache)[0].asm and cache.compiled == 1


def test_the_setting(monkeypatch, tmp_path):
    monkeypatch.setenv("IRIS_KERNEL_CACHE_DIR", str(tmp_path))
    assert kernel_cache.cache_dir() == str(tmp_path)
    monkeypatch.setenv("IRIS_KERNEL_CACHE_DIR", "")
    assert kernel_cache.cache_dir() is None
    monkeypatch.delenv("IRIS_KERNEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernel_cache.cache_dir() == os.path.join(str(tmp_path), "iris-jax", "kernels")


def test_the_process_cache_follows_the_setting(monkeypatch, tmp_path):
    monkeypatch.setattr(kernel_cache, "_state", {})
    monkeypatch.setenv("IRIS_KERNEL_CACHE_DIR", str(tmp_path))
    assert kernel_cache.cache().directory == str(tmp_path) and kernel_cache.cache() is kernel_cache.cache()
    monkeypatch.setattr(kernel_cache, "_state", {})
    monkeypatch.setenv("IRIS_KERNEL_CACHE_DIR", "")
    assert kernel_cache.cache().directory is None  # in memory only
