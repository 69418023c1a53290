"""iris_jax: symmetric-heap multi-GPU programming from JAX (GPUs, or the CPU simulator)."""

import os as _os

from jax._src import source_info_util as _source_info_util

import iris_core as _iris_core
from iris_jax import compat as _compat

_compat.jax_triton()  # imported here so that it works on any machine (see iris_jax.compat)
# iris's frames are library code, as JAX's are: JAX's messages and locations (and the
# simulator's call records) name the user's line instead
for _path in (_os.path.dirname(_iris_core.__file__), _os.path.dirname(__file__)):
    _source_info_util.register_exclusion(_path + _os.sep)

from iris_core.device import Context, DeviceContext  # noqa: E402
from iris_core.errors import (  # noqa: E402
    CrossDomainError,
    HeapExhaustedError,
    IrisError,
    NotOnHeapError,
    PeerFailedError,
    PeerTimeoutError,
    RaceError,
    RaceWarning,
    RankDivergenceWarning,
    RankMismatchError,
)
from iris_jax import ops, tracing  # noqa: E402
from iris_jax._runtime import Runtime, init, is_initialized, memory_stats, runtime, shutdown  # noqa: E402
from iris_jax._runtime.arrays import (  # noqa: E402
    arange,
    empty,
    empty_like,
    full,
    full_like,
    heap_offset,
    is_symmetric,
    ones,
    ones_like,
    rand,
    randn,
    to_heap,
    zeros,
    zeros_like,
)
from iris_jax.calls import cpu_lowering as _cpu_lowering  # noqa: E402
from iris_jax.calls import gpu_lowering as _gpu_lowering  # noqa: E402
from iris_jax.calls import program_order as _program_order  # noqa: E402
from iris_jax.calls.triton_call import triton_call  # noqa: E402
from iris_jax.collectives import (  # noqa: E402
    all_gather,
    all_reduce,
    all_to_all,
    broadcast,
    pbroadcast,
    pmax,
    pmean,
    pmin,
    ppermute,
    pshuffle,
    psum,
    psum_scatter,
    pswapaxes,
    ragged_all_to_all,
)
from iris_jax.collectives.rewrite import Placement, UnsupportedCollectiveError, explain, replace_lax_collectives  # noqa: E402
from iris_jax.config import CollectiveConfig, default_config, use_config  # noqa: E402
from iris_jax.sync import (  # noqa: E402
    barrier,
    block_until_ready,
    check_barrier,
    check_faults,
    check_heap_errors,
    device_barrier,
)

_cpu_lowering.register()
_program_order.register()
_gpu_lowering.register()

__all__ = [
    # runtime and heap arrays
    "Runtime", "init", "is_initialized", "memory_stats", "runtime", "shutdown",
    "arange", "empty", "empty_like", "full", "full_like", "heap_offset", "is_symmetric", "ones", "ones_like",
    "rand", "randn", "to_heap", "zeros", "zeros_like",
    # kernels and synchronization
    "Context", "DeviceContext", "triton_call", "barrier", "block_until_ready", "check_barrier", "check_faults",
    "check_heap_errors", "device_barrier",
    # collectives, fused ops, tracing
    "all_gather", "all_reduce", "all_to_all", "broadcast", "pbroadcast", "pmax", "pmean", "pmin", "ppermute",
    "pshuffle", "psum", "psum_scatter", "pswapaxes", "ragged_all_to_all",
    "CollectiveConfig", "default_config", "use_config", "replace_lax_collectives", "explain", "Placement",
    "ops", "tracing",
    # errors
    "CrossDomainError", "HeapExhaustedError", "IrisError", "NotOnHeapError", "PeerFailedError", "PeerTimeoutError",
    "RaceError", "RaceWarning", "RankDivergenceWarning", "RankMismatchError", "UnsupportedCollectiveError",
]
