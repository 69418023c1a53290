"""Persistent GEMM core: tile ordering, one C tile's K loop, and a plain persistent kernel.

Every kernel of this package computes C tiles with `tile_gemm` (fp32 accumulation, any
strides, M/N edges handled by wrapping the row/column indices and masking the store, K
edges by masking the loads unless EVEN_K). `tile_coords` is the usual grouped ordering
(GROUP_M row tiles at a time) so consecutive tiles of one program share A/B in L2.
"""

import triton
import triton.language as tl

from iris_core.compat import interpreting
from iris_core.launch import GemmConfig, kernel_constants

# Triton's interpreter computes tl.dot on bfloat16 blocks wrongly (Triton 3.6): under it the
# operands are widened to float32 first (exact: the products are accumulated in float32 anyway)
UPCAST_DOT: tl.constexpr = tl.constexpr(interpreting())


@triton.jit
def tile_coords(t, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of linear tile `t` in grouped order."""
    width = GROUP_M * tiles_n
    group = t // width
    first_m = group * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    pid_m = first_m + (t % width) % size_m
    pid_n = (t % width) // size_m
    return pid_m, pid_n


@triton.jit
def aligned_rows(base, offsets, ROW_BYTES: tl.constexpr, COLS: tl.constexpr):
    """base + offsets, a row-major [rows, COLS] tile from a 16-byte aligned base with a row
    stride of ROW_BYTES, declared as such when ROW_BYTES is a multiple of 16 (rows start on
    16-byte boundaries), so that loads and stores become 16-byte vectors. Pointers made from
    an integer (a workspace) lose this knowledge: 2-byte accesses otherwise (PTX checked).
    (The hint must sit where the pointers are computed: Triton drops it on an argument.)"""
    ptrs = base + offsets
    if ROW_BYTES % 16 == 0:
        ptrs = tl.max_contiguous(tl.multiple_of(ptrs, [16, 16]), [1, COLS])
    return ptrs


@triton.jit
def tile_gemm(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
              PREC: tl.constexpr, A_CG: tl.constexpr):
    """fp32 [BM, BN] = A[pid_m rows, :] @ B[:, pid_n cols]. Rows >= M / columns >= N read
    wrapped (valid) data and must be masked by the caller's store. A_CG: load A through L2
    only (A written by peers into a buffer that is reused across calls)."""
    rm = (pid_m * BM + tl.arange(0, BM)) % M
    rn = (pid_n * BN + tl.arange(0, BN)) % N
    rm = tl.max_contiguous(tl.multiple_of(rm, BM), BM)
    rn = tl.max_contiguous(tl.multiple_of(rn, BN), BN)
    rk = tl.arange(0, BK)
    if stride_ak == 1:  # A may live in a workspace (all_gather_matmul): say its rows are aligned
        a_ptrs = aligned_rows(a_ptr, rm[:, None] * stride_am + rk[None, :],
                              stride_am * (a_ptr.dtype.element_ty.primitive_bitwidth // 8), BK)
    else:
        a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BK)):
        if EVEN_K:
            if A_CG:
                a = tl.load(a_ptrs, cache_modifier=".cg")
            else:
                a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            kmask = rk < K - k * BK
            if A_CG:
                a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0, cache_modifier=".cg")
            else:
                a = tl.load(a_ptrs, mask=kmask[None, :], other=0.0)
            b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0)
        if UPCAST_DOT:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PREC)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, value, pid_m, pid_n, M, N, stride_cm, stride_cn, BM: tl.constexpr, BN: tl.constexpr):
    """Masked store of a [BM, BN] tile at (pid_m, pid_n) of C (M x N)."""
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, value, mask=mask)


@triton.jit
def matmul_kernel(context_ptr, a_ptr, b_ptr, c_ptr,
                  M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                  stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr,
                  stride_bn: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                  GROUP_M: tl.constexpr, PREC: tl.constexpr):
    """C (M x N, row-major) = A @ B; persistent: program p computes tiles p, p + P, ...
    (`context_ptr` is unused: iris launches pass it to every kernel)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    for t in range(pid, tiles_m * tiles_n, programs):
        pid_m, pid_n = tile_coords(t, tiles_m, tiles_n, GROUP_M)
        acc = tile_gemm(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BM, BN, BK, K % BK == 0, PREC, False)
        store_tile(c_ptr, acc.to(c_ptr.dtype.element_ty), pid_m, pid_n, M, N, N, 1, BM, BN)


def matmul_constants(*, M: int, N: int, K: int, gemm: GemmConfig) -> dict:
    """matmul_kernel's constexprs for row-major A (M x K) and B (K x N): what iris_jax.ops.matmul
    launches and benchmarks/kernel_ptx.py compiles."""
    return kernel_constants(matmul_kernel, M=M, N=N, K=K, stride_am=K, stride_ak=1, stride_bk=N, stride_bn=1,
                            **gemm.constants())
