"""The data paths compile to 16-byte accesses for sm_90 (no GPU needed; PTX inspected).

Alignment hints are easy to lose: Triton drops `tl.multiple_of` / `tl.max_contiguous` given on a
function's argument, and a pointer translated to a peer or made from an integer (a workspace)
knows nothing of its alignment. On 2 x H200 that cost the fused kernels 4-5x (2-byte remote
stores; benchmarks/RESULTS.md run 15). Pointer arguments get 16-byte divisibility, as
jax-triton declares them.
"""

import re

import pytest
import triton
import triton.language as tl

from iris_core.collectives import kernels as C
from iris_core.collectives.workspace import MAX_PROGRAMS, WorkspaceLayout
from iris_core.device import Context
from iris_core.kernels import fused as F


def _ptx(fn, signature, constexprs, **options) -> str:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: signature.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
    source = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def _accesses(ptx: str) -> set:
    """The kinds of global loads and stores in `ptx` (and its sleeps)."""
    return set(re.findall(r"(?:ld|st)(?:\.acquire\.sys)?\.global[a-z0-9.]*|nanosleep\.u32", ptx))


@pytest.mark.parametrize("kind,variant,push,stream", [
    (C.ALL_REDUCE, C.ONE_SHOT, False, False), (C.ALL_REDUCE, C.TWO_SHOT, False, False),
    (C.ALL_GATHER, C.ONE_SHOT, False, False), (C.PPERMUTE, C.ONE_SHOT, False, False),
    (C.ALL_REDUCE, C.ONE_SHOT, True, False), (C.ALL_GATHER, C.ONE_SHOT, True, False),
    (C.PPERMUTE, C.ONE_SHOT, True, False), (C.ALL_REDUCE, C.ONE_SHOT, True, True), (C.ALL_TO_ALL, C.ONE_SHOT, True, True)])
def test_collective_kernel_moves_data_in_16_byte_vectors(kind, variant, push, stream):
    pytest.importorskip("triton.backends.nvidia")
    layout = WorkspaceLayout(2, 1 << 20)
    consts = dict(KIND=kind, OP=C.SUM, VARIANT=variant, G=2, WORLD=2, XB=2 if kind == C.ALL_TO_ALL else 1,
                  OB=2 if kind in (C.ALL_GATHER, C.ALL_TO_ALL) else 1,
                  SOURCES=(1, 0), ACC=tl.float32, BLOCK=2048, CHUNK=(1 << 20) // 8, DATA=layout.data,
                  DATA2=layout.data2, DATA_BYTES=layout.data_bytes, MAX_PROGRAMS=MAX_PROGRAMS, TIMEOUT_NS=10**9,
                  WHAT="test", ZERO_COPY=not push, HEAP_BYTES=1 << 30, VEC=4, PUSH=push, STREAM=stream,
                  STREAM_AT=layout.stream, STREAM_BYTES=layout.stream_capacity, SENDERS=4)
    signature = {"context_ptr": "*i32", "group_ptr": "*i32", "x_ptr": "*fp32", "m": "i32", "out_ptr": "*fp32"}
    accesses = _accesses(_ptx(C.collective_kernel, signature, consts, num_warps=8))
    assert "st.global.v4.b32" in accesses and "ld.global.v4.b32" in accesses, accesses
    if not stream:  # only flags and epochs (64-bit) are scalar (streamed: also the int32 tile counts)
        assert "st.global.b32" not in accesses, accesses
    # flag waits acquire (an unused `tl.atomic_add(flag, 0, sem="acquire")` compiled to nothing);
    # streamed calls wait on int32 tile flags
    assert f"ld.acquire.sys.global.b{32 if stream else 64}" in accesses, accesses


@pytest.mark.parametrize("kernel", ["matmul_reduce", "all_gather_matmul"])
def test_fused_kernels_move_tiles_in_16_byte_vectors(kernel):
    pytest.importorskip("triton.backends.nvidia")
    M = N = K = 256
    consts = dict(M=M, N=N, K=K, stride_am=K, stride_ak=1, stride_bk=N, stride_bn=1, G=2, WORLD=2, BM=64, BN=64,
                  BK=32, GROUP_M=8, PREC="tf32", WS_OFFSET=1 << 20, FLAGS=0, DATA=1 << 16, DATA_BYTES=1 << 24,
                  POLL_NS=500, TIMEOUT_NS=10**9, WHAT="test")
    if kernel == "matmul_reduce":
        fn, consts = F.matmul_reduce_kernel, dict(consts, SCATTER=0, GEMM_PROGRAMS=12)
    else:
        fn, consts = F.all_gather_matmul_kernel, dict(consts, BKC=64, COMM=2)
    signature = {"context_ptr": "*i32", "group_ptr": "*i32", "a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
    ptx = _ptx(fn, signature, consts, num_warps=4, num_stages=2)
    accesses = _accesses(ptx)
    assert not {a for a in accesses if a.endswith(".b16")}, accesses  # no 2-byte loads or stores
    assert "st.global.v4.b32" in accesses, accesses
    assert "ld.acquire.sys.global.b32" in accesses, accesses  # the flag waits
    assert "nanosleep.u32" in accesses, accesses  # ... sleep between reads (POLL_NS)
    # no printing: an extern call (vprintf) makes ptxas serialize every wgmma of the kernel
    assert "vprintf" not in ptx


@triton.jit
def _hinted_put(context_ptr, buf_ptr, x_ptr, W: tl.constexpr, ROWS: tl.constexpr, COLS: tl.constexpr,
                HINT: tl.constexpr):
    """Stores a ROWS x COLS tile (1-D when ROWS is 0) into the next rank's buf, with HINT given
    through a constexpr parameter (a Python tuple arrives wrapped: constexpr((16,)))."""
    ctx = Context.initialize(context_ptr, W)
    if ROWS == 0:
        offs = tl.arange(0, COLS)
    else:
        offs = tl.arange(0, ROWS)[:, None] * COLS + tl.arange(0, COLS)[None, :]
    ctx.store(buf_ptr + offs, tl.load(x_ptr + offs), to_rank=(ctx.rank + 1) % W, hint=HINT)


@pytest.mark.parametrize("rows,hint,same_as", [(0, (16,), 16), (8, (1, 16), None), (0, 16, None)])
def test_tuple_hints_through_a_constexpr_parameter_compile_and_vectorize(rows, hint, same_as):
    """hint=(16,) as a kernel's constexpr argument compiles for sm_90 (it failed in tl.multiple_of on
    GPUs, 2026-12-01), stores in 16-byte vectors, and compiles as the int hint does."""
    pytest.importorskip("triton.backends.nvidia")
    signature = {"context_ptr": "*i32", "buf_ptr": "*fp32", "x_ptr": "*fp32"}
    consts = dict(W=2, ROWS=rows, COLS=1024 // max(rows, 1))  # 8 elements a thread
    ptx = _ptx(_hinted_put, signature, dict(consts, HINT=hint), num_warps=4)
    assert "st.global.v4.b32" in _accesses(ptx), _accesses(ptx)
    if same_as is not None:
        assert ptx == _ptx(_hinted_put, signature, dict(consts, HINT=same_as), num_warps=4)
