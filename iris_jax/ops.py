"""GEMM fused with communication, for tensor-parallel layers inside `jax.shard_map`.

    y = iris_jax.ops.matmul_all_reduce(a, b, "tp")          # == lax.psum(a @ b, "tp")
    y = iris_jax.ops.all_gather_matmul(a, b, "tp")          # == all_gather(a, "tp", tiled) @ b
    y = iris_jax.ops.matmul_reduce_scatter(a, b, "tp")      # == psum_scatter(a @ b, "tp", tiled)
    c = iris_jax.ops.matmul(a, b)                           # the persistent GEMM core alone

Each fused op is one persistent Triton kernel (iris_core.gemm.fused) that moves data
tile by tile while the remaining tiles are still computed. matmul_all_reduce and
matmul_reduce_scatter: most programs compute C tiles into the heap and flag them, the
others (`FusedSettings.reduce_programs`, 16 of 132 on H200) pull the members' tiles over
the link and reduce them. all_gather_matmul: a few programs push A's row tiles to the peers,
the others multiply them as they arrive.
Inputs: float32, bfloat16 or float16 (both operands the same dtype), accumulation in
float32, result in the input dtype (as `jnp.dot`). Every op is differentiable
(`jax.custom_vjp`; the backward pass uses the fused ops where they fit, otherwise
`jnp.dot` and iris collectives).

`impl`: "fused" (the iris kernel), "xla" (jnp.dot + the lax collective, i.e. what XLA
does unfused) or "auto". On GPUs `auto` runs an op fused when (`_auto_fused`)

* the problem is small, at most 2^34 FLOPs per rank (M = 1024, N = K = 4096 on 2 GPUs):
  XLA launches its NCCL collective from the host, which the fused kernel does not; or
* the GEMM covers the communication: at least 4096 FLOPs per byte that a rank receives
  over the link (bf16 on 2 GPUs: K per rank >= 4096 for matmul_all_reduce, >= 2048 for
  matmul_reduce_scatter, N >= 4096 for all_gather_matmul), with a product of at least 2^24
  elements per rank (~4 rounds of tiles, so the last one, which nothing overlaps, is short).

The thresholds follow benchmarks/fused.py's measurements on 2 x H200: the shapes the rule
runs fused were faster fused than through XLA; the ones it leaves to XLA were bound by the
link (the few reducing programs pull below its rate) or by a last round of tiles that nothing
overlaps. The simulator has no speed to choose by; there `auto` runs the fused kernels, so
that code built on the simulator exercises them.

Settings: `config` (an iris_jax.CollectiveConfig, as the collectives take: `timeout_s`,
`fused_reduce_programs`, `fused_poll_ns`, `gemm_config`; default `default_config()`, so a
`use_config` block's), `timeout_s=` for the timeout alone.

Workspace: the kernels exchange tiles through the fused part of their partition's workspace
(iris_jax._runtime.workspace: one per partition of the ranks into groups, so calls over different
axes of a mesh never share flags or buffers; 2 x IRIS_FUSED_WORKSPACE_BYTES, default 128 MiB
on GPUs and 512 KiB on the simulator, plus flags). Problems larger than it run as several
kernels over row chunks.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from iris_core import flag_protocol
from iris_core.errors import IrisError
from iris_core.gemm import fused as F
from iris_core.gemm import gemm as Gm
from iris_core.launch import GemmConfig
from iris_jax import _runtime as runtime_lib
from iris_jax import collectives as C
from iris_jax._runtime.workspace import workspaces
from iris_jax.calls.triton_call import triton_call, vary, varying_axes
from iris_jax.collectives.lowering import group_size
from iris_jax.compat import lax_parallel
from iris_jax.config import CollectiveConfig, default_config

SUPPORTED_DTYPES = (jnp.float32, jnp.bfloat16, jnp.float16)
IMPLS = ("auto", "fused", "xla")
# auto on GPUs (see the docstring and _auto_fused)
AUTO_SMALL_FLOPS = 2 ** 34  # per rank: M = 1024, N = K = 4096 on 2 GPUs
AUTO_MIN_INTENSITY = 4096  # FLOPs per byte a rank receives over the link
AUTO_MIN_PRODUCT = 2 ** 24  # elements of the product each rank computes


class FusedSettings:
    """How the fused kernels launch on this runtime: grid, programs per role, poll period and
    GEMM tile configuration (their workspace: iris_jax._runtime.workspace); the defaults are the backend's."""

    def __init__(self, rt):
        self.backend = rt.backend
        # the grid of every fused kernel: all programs co-resident (<= SMs); fixed, so every
        # program's epoch advances once per call
        self.programs = self.backend.fused_programs(rt.devices)
        self.comm_programs = self.backend.fused_comm_programs  # all_gather_matmul's pushing programs

    def reduce_programs(self, config: CollectiveConfig) -> int:
        """matmul_all_reduce / matmul_reduce_scatter: programs that pull and reduce while the
        others compute (config.fused_reduce_programs, IRIS_FUSED_REDUCE_PROGRAMS; else the
        backend's)."""
        count = config.fused_reduce_programs
        if count is None:
            count = self.backend.fused_reduce_programs
        if count >= self.programs:
            raise IrisError(f"fused_reduce_programs={count} (IRIS_FUSED_REDUCE_PROGRAMS): must be below this "
                            f"runtime's {self.programs} fused programs")
        return count

    def poll_ns(self, config: CollectiveConfig) -> int:
        """How long a waiting program sleeps between two reads of a flag, in ns: the reducing
        programs poll beside the computing ones, and the period made no measurable difference
        on H200 (config.fused_poll_ns, IRIS_FUSED_POLL_NS; else the backend's)."""
        return self.backend.fused_poll_ns if config.fused_poll_ns is None else config.fused_poll_ns

    def gemm(self, dtype, config: CollectiveConfig) -> GemmConfig:
        """The GEMM core's settings for `dtype`: the backend's; on GPUs, config.gemm_config
        (IRIS_GEMM_CONFIG) overrides the 16-bit tile (for tuning: benchmarks/tune_gemm.py)."""
        return self.backend.gemm_config(dtype, config.gemm_config)


def settings() -> FusedSettings:
    """The fused ops' launch settings on the current runtime (grid, programs per role, poll
    period, GEMM tiles).

    Returns:
      The runtime's `FusedSettings` (created on first use).
    """
    return runtime_lib.runtime().service("fused_ops", FusedSettings)


# -- helpers --------------------------------------------------------------------------------
def _check(a, b, what):
    if a.ndim != 2 or b.ndim != 2:
        raise ValueError(f"iris_jax.ops.{what}: a and b must be 2-D, got {a.shape} and {b.shape}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"iris_jax.ops.{what}: contraction mismatch {a.shape} @ {b.shape}")
    if a.dtype != b.dtype:
        raise TypeError(f"iris_jax.ops.{what}: a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if a.dtype not in [jnp.dtype(d) for d in SUPPORTED_DTYPES]:
        raise TypeError(f"iris_jax.ops.{what}: unsupported dtype {a.dtype}; supported: float32, bfloat16, float16")


def _auto_fused(flops: int, link_bytes: int, product: int) -> bool:
    """`auto`'s choice on GPUs for a call doing `flops` per rank, receiving `link_bytes` per
    rank and computing `product` elements of the GEMM per rank (the module docstring)."""
    covered = flops >= AUTO_MIN_INTENSITY * link_bytes and product >= AUTO_MIN_PRODUCT
    return flops <= AUTO_SMALL_FLOPS or covered


def _impl(impl, what, flops, link_bytes, product):
    if impl not in IMPLS:
        raise ValueError(f"iris_jax.ops.{what}: unknown impl {impl!r}; choose one of {IMPLS}")
    if impl == "auto":
        if not runtime_lib.runtime().backend.speed_guides_auto:
            return "fused"
        return "fused" if _auto_fused(flops, link_bytes, product) else "xla"
    return impl


def _axes(axis_name) -> tuple[str, ...]:
    """`axis_name` as a tuple of mesh axes of the current shard_map."""
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    mesh = jax.sharding.get_abstract_mesh()
    names = tuple(mesh.axis_names) if mesh is not None and not mesh.empty else ()
    for a in axes:
        if a not in names:
            raise NameError(f"unbound axis name: {a!r}; iris ops run inside jax.shard_map over a mesh "
                            f"with that axis (mesh axes here: {names})")
    return axes


def _check_vma() -> bool:
    from jax._src import config

    return bool(config._check_vma.value)


def _empty(shape, dtype, varying):
    """What a fused op returns for zero-size operands (no kernel), typed like its output."""
    return vary(jnp.zeros(shape, dtype), tuple(sorted(varying)))


def _set_vma(x, target):
    """`x` with exactly the varying axes `target` (psum over extra ones, pvary missing ones)."""
    if not _check_vma():
        return x
    vma = varying_axes(x)
    extra = tuple(sorted(vma - set(target)))
    if extra:
        x = C.psum(x, extra)
    return vary(x, tuple(sorted(set(target))))


def _dot(a, b):
    return jnp.dot(a, b, preferred_element_type=jnp.float32).astype(a.dtype)


def _config(config, timeout_s) -> CollectiveConfig:
    """The config of a fused op's call: `config` (else the default, use_config's inside its
    block), with `timeout_s` when given."""
    config = config or default_config()
    return config if timeout_s is None else config.replace(timeout_s=timeout_s)


def _waits(fs, config) -> dict:
    """The kernels' poll_ns and timeout_ns (the flag protocol's waits)."""
    return dict(poll_ns=fs.poll_ns(config), timeout_ns=flag_protocol.timeout_ns(config.timeout_s))


def _chunks(total, step):
    return [(s, min(total, s + step)) for s in range(0, total, step)]


# -- plain GEMM -------------------------------------------------------------------------------
def matmul(a, b, *, config: CollectiveConfig | None = None):
    """`a @ b` with the persistent GEMM core (float32 accumulation, result in a's dtype).

    Args:
      a: [M, K], float32, bfloat16 or float16.
      b: [K, N], of `a`'s dtype.
      config: its `gemm_config` (default `default_config()`).

    Returns:
      The [M, N] product.

    Raises:
      ValueError: the operands are not matrices with matching K.
      TypeError: their dtypes differ or are not supported.
    """
    _check(a, b, "matmul")
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return jnp.zeros((M, N), a.dtype)
    fs = settings()
    gemm = fs.gemm(a.dtype, config or default_config())
    tiles = math.ceil(M / gemm.BM) * math.ceil(N / gemm.BN)
    return triton_call(a, b, kernel=Gm.matmul_kernel, out_shape=jax.ShapeDtypeStruct((M, N), a.dtype),
                       grid=(min(tiles, fs.programs),), **Gm.matmul_constants(M=M, N=N, K=K, gemm=gemm),
                       **gemm.options())


# -- matmul + all-reduce / reduce-scatter ------------------------------------------------------
def _launch_reduce(a, b, axes, scatter: bool, what, config):
    """Kernel launches (row chunks) of matmul_reduce_kernel. a: (NB*M) x K, NB = G if scatter."""
    rt = runtime_lib.runtime()
    fs = settings()
    ws = workspaces(rt)
    G = group_size(axes)
    gemm = fs.gemm(a.dtype, config)
    BM, BN = gemm.BM, gemm.BN
    K, N = b.shape
    NB = G if scatter else 1
    M = a.shape[0] // NB
    tiles_n = math.ceil(N / BN)
    # every rank keeps all tiles it computes (NB row blocks) for its peers to pull, and a flag
    # per tile and member; the smallest workspace class that holds them all (else the largest, in chunks)
    row_tile_bytes = NB * tiles_n * BM * BN * a.dtype.itemsize
    layout = ws.fitting("fused", row_tile_bytes * math.ceil(M / BM))
    row_tiles = min(layout.data_bytes // row_tile_bytes, layout.flag_count // (NB * tiles_n * G))
    if row_tiles < 1:
        raise IrisError(f"iris_jax.ops.{what}: N={N} is too wide for the fused workspace "
                        f"({layout.data_bytes} bytes); raise IRIS_FUSED_WORKSPACE_BYTES or use impl='xla'")
    step = row_tiles * BM
    vma = varying_axes(a) | varying_axes(b)
    out_varying = tuple(sorted(vma | set(axes))) if scatter else tuple(sorted(vma - set(axes)))
    blocks = a.reshape(NB, M, K)
    outs = []
    for r0, r1 in _chunks(M, step):
        part = blocks[:, r0:r1].reshape(NB * (r1 - r0), K) if (r0, r1) != (0, M) else a
        tiles = NB * math.ceil((r1 - r0) / BM) * tiles_n
        # one round of tiles: every program computes (and reduces its own tile); more: some
        # programs reduce while the others compute
        gemm_programs = fs.programs if tiles <= fs.programs else fs.programs - fs.reduce_programs(config)
        outs.append(triton_call(
            part, b, kernel=F.matmul_reduce_kernel, out_shape=jax.ShapeDtypeStruct((r1 - r0, N), a.dtype),
            grid=(fs.programs,), group_axes=axes, workspace=ws.key("fused", layout), out_varying=out_varying,
            **F.reduce_constants(M=r1 - r0, N=N, K=K, scatter=scatter, G=G, world=rt.world_size, gemm=gemm,
                                 gemm_programs=gemm_programs, layout=layout, **_waits(fs, config), what=what),
            **gemm.options()))
    return outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=0)


def _mar_fwd_impl(a, b, axes, impl, config):
    if impl == "xla":
        return lax_parallel.psum(_dot(a, b), axes)
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return _empty((M, N), a.dtype, (varying_axes(a) | varying_axes(b)) - set(axes))
    return _launch_reduce(a, b, axes, False, "matmul_all_reduce", config)


def matmul_all_reduce(a, b, axis_name, *, impl: str = "auto", timeout_s: float | None = None,
                      config: CollectiveConfig | None = None):
    """`lax.psum(a @ b, axis_name)` in one kernel, inside `shard_map`.

    A row-parallel linear layer: each rank holds a column block of the activations and a row
    block of the weight; the result is the same on every member.

    Args:
      a: [M, K_local], float32, bfloat16 or float16.
      b: [K_local, N], of `a`'s dtype.
      axis_name: the mesh axis (or tuple of axes) to reduce over.
      impl: "fused" (the iris kernel), "xla" (`jnp.dot` + `lax.psum`) or "auto" (see the
        module docstring).
      timeout_s: how long to wait for a peer (default: the config's).
      config: the timeout and the fused_* launch settings (default: `default_config()`).

    Returns:
      The [M, N] sum, in `a`'s dtype.

    Raises:
      ValueError: unsupported shapes or `impl`.
      TypeError: the dtypes differ or are not supported.
    """
    axes = _axes(axis_name)
    config = _config(config, timeout_s)
    _check(a, b, "matmul_all_reduce")
    (M, K), N, G = a.shape, b.shape[1], group_size(axes)
    chosen = _impl(impl, "matmul_all_reduce", 2 * M * K * N, (G - 1) * M * N * a.dtype.itemsize, M * N)

    @jax.custom_vjp
    def f(a, b):
        return _mar_fwd_impl(a, b, axes, chosen, config)

    def fwd(a, b):
        return f(a, b), (a, b)

    def bwd(res, ct):
        a, b = res
        # psum's transpose: with varying-axes checks a cast to varying, else another psum
        g = vary(ct, axes) if _check_vma() else C.psum(ct, axes)
        da = _dot(g, b.T)
        db = _dot(a.T, g)
        return _set_vma(da, varying_axes(a)), _set_vma(db, varying_axes(b))

    f.defvjp(fwd, bwd)
    return f(a, b)


def _mrs_fwd_impl(a, b, axes, scatter_dimension, impl, config):
    G = group_size(axes)
    if impl == "xla":
        return lax_parallel.psum_scatter(_dot(a, b), axes, scatter_dimension=scatter_dimension, tiled=True)
    if scatter_dimension == 1:  # C^T = b^T a^T, scattered by rows, transposed back
        return _mrs_fwd_impl(b.T, a.T, axes, 0, impl, config).T
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return _empty((M // G, N), a.dtype, varying_axes(a) | varying_axes(b) | set(axes))
    return _launch_reduce(a, b, axes, True, "matmul_reduce_scatter", config)


def matmul_reduce_scatter(a, b, axis_name, scatter_dimension: int = 0, *, impl: str = "auto",
                          timeout_s: float | None = None, config: CollectiveConfig | None = None):
    """`lax.psum_scatter(a @ b, axis_name, scatter_dimension=..., tiled=True)` in one kernel.

    Member i keeps block i (rows if scatter_dimension == 0, columns if 1) of the sum.

    Args:
      a: [M, K_local], float32, bfloat16 or float16.
      b: [K_local, N], of `a`'s dtype.
      axis_name: the mesh axis (or tuple of axes) to reduce over.
      scatter_dimension: 0 (rows) or 1 (columns) of the product; its size divides by the group's.
      impl: "fused", "xla" or "auto" (as `matmul_all_reduce`'s).
      timeout_s: how long to wait for a peer (default: the config's).
      config: as `matmul_all_reduce`'s.

    Returns:
      This member's block of the sum, in `a`'s dtype.

    Raises:
      ValueError: unsupported shapes or `impl`, or a dimension the group does not divide.
      TypeError: the dtypes differ or are not supported.
    """
    axes = _axes(axis_name)
    config = _config(config, timeout_s)
    _check(a, b, "matmul_reduce_scatter")
    G = group_size(axes)
    d = scatter_dimension % 2
    size = (a.shape[0], b.shape[1])[d]
    if size % G:
        raise ValueError(f"matmul_reduce_scatter: dimension {d} of the product has size {size}, "
                         f"not divisible by the axis size {G}")
    (M, K), N = a.shape, b.shape[1]
    chosen = _impl(impl, "matmul_reduce_scatter", 2 * M * K * N, (G - 1) * M * N // G * a.dtype.itemsize, M * N)

    @jax.custom_vjp
    def f(a, b):
        return _mrs_fwd_impl(a, b, axes, d, chosen, config)

    def fwd(a, b):
        return f(a, b), (a, b)

    def bwd(res, ct):
        a, b = res
        full = C.all_gather(ct, axes, axis=d, tiled=True)  # d(a @ b)
        if d == 0:
            da = all_gather_matmul(ct, b.T, axes, impl=chosen, config=config)
        else:
            da = _dot(full, b.T)
        db = _dot(a.T, full)
        return _set_vma(da, varying_axes(a)), _set_vma(db, varying_axes(b))

    f.defvjp(fwd, bwd)
    return f(a, b)


# -- all-gather + matmul -------------------------------------------------------------------------
def _launch_gather(a, b, axes, config):
    rt = runtime_lib.runtime()
    fs = settings()
    ws = workspaces(rt)
    G = group_size(axes)
    gemm = fs.gemm(a.dtype, config)
    BM = gemm.BM
    M, K = a.shape
    N = b.shape[1]
    row_tile_bytes = G * BM * K * a.dtype.itemsize
    layout = ws.fitting("fused", row_tile_bytes * math.ceil(M / BM))  # as in _launch_reduce
    row_tiles = min(layout.data_bytes // row_tile_bytes, layout.flag_count // G)
    if row_tiles < 1:
        raise IrisError(f"iris_jax.ops.all_gather_matmul: K={K} is too large for the fused workspace "
                        f"({layout.data_bytes} bytes); raise IRIS_FUSED_WORKSPACE_BYTES or use impl='xla'")
    step = row_tiles * BM
    out_varying = tuple(sorted(varying_axes(a) | varying_axes(b) | set(axes)))
    outs = []
    for r0, r1 in _chunks(M, step):
        part = a[r0:r1] if (r0, r1) != (0, M) else a
        out = triton_call(
            part, b, kernel=F.all_gather_matmul_kernel,
            out_shape=jax.ShapeDtypeStruct((G * (r1 - r0), N), a.dtype), grid=(fs.programs,), group_axes=axes,
            workspace=ws.key("fused", layout), out_varying=out_varying,
            **F.gather_constants(M=r1 - r0, N=N, K=K, G=G, world=rt.world_size, gemm=gemm,
                                 comm_programs=fs.comm_programs, layout=layout, **_waits(fs, config)),
            **gemm.options())
        outs.append(out.reshape(G, r1 - r0, N))
    out = outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)
    return out.reshape(G * M, N)


def _agm_fwd_impl(a, b, axes, gather_axis, impl, config):
    G = group_size(axes)
    if impl == "xla":
        return _dot(lax_parallel.all_gather(a, axes, axis=gather_axis, tiled=True), b)
    if gather_axis == 1:  # gathering the contraction dimension: unfused (iris all-gather, then GEMM)
        return _dot(C.all_gather(a, axes, axis=1, tiled=True), b)
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0 or K == 0:
        return _empty((G * M, N), a.dtype, varying_axes(a) | varying_axes(b) | set(axes))
    return _launch_gather(a, b, axes, config)


def all_gather_matmul(a, b, axis_name, gather_axis: int = 0, *, impl: str = "auto",
                      timeout_s: float | None = None, config: CollectiveConfig | None = None):
    """`lax.all_gather(a, axis_name, axis=gather_axis, tiled=True) @ b` in one kernel.

    A column-parallel linear layer: `a` sharded by rows, `b` this rank's columns. With
    gather_axis=0 the gather is fused into the GEMM; gather_axis=1 (a's columns, the
    contraction dimension) runs unfused: iris all_gather, then the GEMM.

    Args:
      a: [M_local, K] (gather_axis=0) or [M, K_local] (gather_axis=1).
      b: [K, N_local], of `a`'s dtype.
      axis_name: the mesh axis (or tuple of axes) to gather over.
      gather_axis: 0 (rows of `a`) or 1 (its columns).
      impl: "fused", "xla" or "auto" (as `matmul_all_reduce`'s).
      timeout_s: how long to wait for a peer (default: the config's).
      config: as `matmul_all_reduce`'s.

    Returns:
      The [M, N_local] product, in `a`'s dtype.

    Raises:
      ValueError: unsupported shapes or `impl`.
      TypeError: the dtypes differ or are not supported.
    """
    axes = _axes(axis_name)
    config = _config(config, timeout_s)
    G = group_size(axes)
    ga = gather_axis % 2
    if ga == 1:
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] * G != b.shape[0]:
            raise ValueError(f"all_gather_matmul(gather_axis=1): a {a.shape} gathered to "
                             f"{(a.shape[0], a.shape[1] * G)} does not match b {b.shape}")
        _check(jnp.zeros((1, b.shape[0]), a.dtype), b, "all_gather_matmul")
    else:
        _check(a, b, "all_gather_matmul")
    (M, K), N = a.shape, b.shape[1]  # per rank: a's rows M, b's columns N
    chosen = _impl(impl, "all_gather_matmul", 2 * G * M * K * N, (G - 1) * M * K * a.dtype.itemsize, G * M * N)

    @jax.custom_vjp
    def f(a, b):
        return _agm_fwd_impl(a, b, axes, ga, chosen, config)

    def fwd(a, b):
        return f(a, b), (a, b)

    def bwd(res, ct):
        a, b = res
        if ga == 0:
            da = matmul_reduce_scatter(ct, b.T, axes, 0, impl=chosen, config=config)
        else:
            da = C.psum_scatter(_dot(ct, b.T), axes, scatter_dimension=1, tiled=True)
        gathered = C.all_gather(a, axes, axis=ga, tiled=True)
        db = _dot(gathered.T, ct)
        return _set_vma(da, varying_axes(a)), _set_vma(db, varying_axes(b))

    f.defvjp(fwd, bwd)
    return f(a, b)


__all__ = ["all_gather_matmul", "matmul", "matmul_all_reduce", "matmul_reduce_scatter", "settings",
           "FusedSettings"]
