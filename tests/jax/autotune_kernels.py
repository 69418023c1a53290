"""Plain @triton.jit kernels of tests/jax/test_autotune.py (the test wraps them in
autotune / heuristics); here so that a simulated rank's worker imports them cheaply."""

import triton
import triton.language as tl

from iris_core.device import Context


@triton.jit
def add(x_ptr, y_ptr, n, out_ptr, block_ptr, BLOCK_SIZE: tl.constexpr):
    """out = x + y; block[0] = the BLOCK_SIZE it ran with."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + tl.load(y_ptr + offs, mask=m), mask=m)
    if tl.program_id(0) == 0:
        tl.store(block_ptr, BLOCK_SIZE)


@triton.jit
def scale(x_ptr, n, out_ptr, BLOCK_SIZE: tl.constexpr, FACTOR: tl.constexpr):
    """out = x * FACTOR, in one program of BLOCK_SIZE >= n."""
    offs = tl.arange(0, BLOCK_SIZE)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * FACTOR, mask=m)


@triton.jit
def sum_into(x_ptr, n, acc_ptr, out_ptr, BLOCK_SIZE: tl.constexpr):
    """out[0] += sum(x), one atomic add per program (acc is the input out may be aliased to)."""
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    tl.atomic_add(out_ptr, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0)))


@triton.jit
def sum_into_aliased(x_ptr, n, acc_ptr, BLOCK_SIZE: tl.constexpr):
    """sum_into in jax-triton 0.4's convention: an output aliased to an input has no parameter of
    its own (acc_ptr is the output)."""
    sum_into(x_ptr, n, acc_ptr, acc_ptr, BLOCK_SIZE)


@triton.jit
def sum_into_with_context(context_ptr, x_ptr, n, acc_ptr, out_ptr, BLOCK_SIZE: tl.constexpr):
    """sum_into as an iris kernel (the context comes first; unused)."""
    sum_into(x_ptr, n, acc_ptr, out_ptr, BLOCK_SIZE)


@triton.jit
def matmul(
    a_ptr,
    b_ptr,
    M,
    N,
    K,
    c_ptr,
    BLOCK_SIZE_M: tl.constexpr,
    BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr,
    K_EXACTLY_DIVISIBLE_BY_BLOCK: tl.constexpr,
):
    """c = a @ b for row-major a (M, K), b (K, N), c (M, N): jax-triton's test kernel, without grouping."""
    pid_m = tl.program_id(0) // tl.cdiv(N, BLOCK_SIZE_N)
    pid_n = tl.program_id(0) % tl.cdiv(N, BLOCK_SIZE_N)
    offs_m = pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M)
    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + offs_m[:, None] * K + offs_k[None, :]
    b_ptrs = b_ptr + offs_k[:, None] * N + offs_n[None, :]
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k_remaining in range(K, 0, -BLOCK_SIZE_K):
        if K_EXACTLY_DIVISIBLE_BY_BLOCK:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_remaining, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_remaining, other=0.0)
        acc += tl.dot(a, b)
        a_ptrs += BLOCK_SIZE_K
        b_ptrs += BLOCK_SIZE_K * N
    c_ptrs = c_ptr + offs_m[:, None] * N + offs_n[None, :]
    tl.store(c_ptrs, acc, mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def rank_and_block(context_ptr, x_ptr, n, out_ptr, info_ptr, W: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """iris kernel: out = x + rank; info = [rank, BLOCK_SIZE]."""
    ctx = Context.initialize(context_ptr, W)
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) + ctx.rank, mask=m)
    if tl.program_id(0) == 0:
        tl.store(info_ptr, ctx.rank)
        tl.store(info_ptr + 1, BLOCK_SIZE)
