"""The kernel call path: a Triton kernel as a JAX primitive, from `triton_call` to its launch.

`triton_call` (triton_call.py) binds the primitive; operands.py builds the rows every launch
receives (the device's context, its group's row); gpu_lowering.py compiles and launches on GPUs
(kernel_cache.py keeps compiled kernels between processes), cpu_lowering.py and
cpu_execution.py run the same kernels on the simulator (_ffi.py: XLA:CPU's custom-call target);
autotune.py resolves `@triton.autotune` / `@triton.heuristics` kernels for both.

Layer: above iris_jax._runtime, below iris_jax.sync, iris_jax.collectives and iris_jax.ops.
"""
