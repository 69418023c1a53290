"""Import jax_triton on any machine, without breaking plain Triton launches in this process.

jax_triton 0.3.1 refuses to import unless JAX's CUDA plugin is installed ("jax-triton
requires JAX to be installed with GPU support"), although iris needs it on CPU-only machines
only for its lowering rules (the simulator runs kernels itself, iris_jax.cpu_lowering).
Without the plugin we give `jax._src.lib.gpu_triton` stand-ins that fail when a GPU launch
is attempted, saying what to install (`pip install "iris-jax[gpu]"`).

jax_triton also sets TRITON_CACHE_DIR="" on import; any later ordinary Triton launch then
fails with "Could not create or locate cache dir". We put back the previous value (or unset
it, so Triton uses its default).

Its kernel compiles then go through iris_jax.kernel_cache (kept on disk between processes).
"""

import os

_GPU_NAMES = ("TritonKernelCall", "TritonAutotunedKernelCall", "TritonKernel", "create_array_parameter",
              "create_scalar_parameter", "get_compute_capability", "get_arch_details", "get_custom_call",
              "get_serialized_metadata")


def _no_gpu_plugin(*args, **kwargs):
    raise RuntimeError("launching a Triton kernel on a GPU needs JAX's CUDA plugin, which is not installed: "
                       'pip install "iris-jax[gpu]" (on CPU-only machines iris runs on its simulator without it)')


def gpu_plugin_present() -> bool:
    from jax._src.lib import gpu_triton

    return getattr(gpu_triton, "_cuda_triton", None) is not None or getattr(gpu_triton, "_hip_triton", None) is not None


def import_jax_triton():
    from jax._src.lib import gpu_triton

    if not gpu_plugin_present():
        for name in _GPU_NAMES:
            if not hasattr(gpu_triton, name):
                setattr(gpu_triton, name, _no_gpu_plugin)
    before = os.environ.get("TRITON_CACHE_DIR")
    import jax_triton

    if before is None:
        if os.environ.get("TRITON_CACHE_DIR") == "":
            del os.environ["TRITON_CACHE_DIR"]
    else:
        os.environ["TRITON_CACHE_DIR"] = before
    from iris_jax import kernel_cache

    kernel_cache.install()
    return jax_triton
