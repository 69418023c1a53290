"""How this machine's JAX picks a Pallas GPU lowering (for tests/gpu/test_gpu_pallas.py's Mosaic GPU case).

    python benchmarks/pallas_probe.py

Prints the JAX version, whether Mosaic GPU's pallas_call registration imports, the registered
backend lowering rules, the CompilerParams classes of both GPU backends, and the source of
pallas_call's GPU lowering. Needs no GPU (`--small`, what CI runs, is the same run).
"""

import inspect

import jax
from jax._src.pallas import core as pallas_core
from jax._src.pallas import pallas_call

print("jax", jax.__version__)
try:
    import jax._src.pallas.mosaic_gpu.pallas_call_registration  # noqa: F401

    print("mosaic_gpu registration: imported")
except ImportError as e:
    print("mosaic_gpu registration:", repr(e))
try:  # (a probe: what a JAX lacks is part of the answer)
    from jax.experimental.pallas import mosaic_gpu as plmgpu
    from jax.experimental.pallas import triton as pltriton
except ImportError as e:
    print("pallas GPU backends:", repr(e))
else:
    print("rules:", {k.__module__ + "." + k.__qualname__: v for k, v in
                     getattr(pallas_core, "_backend_lowering_rules", {}).items()})
    print("mosaic CompilerParams:", plmgpu.CompilerParams.__module__, plmgpu.CompilerParams.__mro__)
    print("triton CompilerParams:", pltriton.CompilerParams.__module__)
source = inspect.getsource(pallas_call)
start = source.find("def gpu_lowering")
print(source[start:start + 2500] if start >= 0 else "(no gpu_lowering)")
