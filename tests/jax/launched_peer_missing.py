"""Run by test_runtime.py as `python -m iris_core.sim -n 2 launched_peer_missing.py MODE`.

Rank 1 exits at once without initializing iris; rank 0 then needs every peer's heap,
either through `iris_jax.init()` (MODE=init) or through a jitted kernel call that creates
the runtime lazily (MODE=lazy). Rank 0 must fail with PeerTimeoutError once
IRIS_RENDEZVOUS_TIMEOUT seconds have passed, instead of hanging.
"""

import os
import sys

if int(os.environ["IRIS_SIM_RANK"]) != 0:
    sys.exit(0)  # this peer never initializes

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import iris_jax  # noqa: E402
from tests.jax.kernels import write_rank  # noqa: E402

print("rank 0 initializing", flush=True)
if sys.argv[1] == "init":
    iris_jax.init()
else:
    assert not iris_jax.is_initialized()
    jax.jit(lambda: iris_jax.triton_call(kernel=write_rank, out_shape=jax.ShapeDtypeStruct((1,), jnp.int32),
                                         grid=(1,), W=2))()
print("rank 0 initialized: unexpected", flush=True)
