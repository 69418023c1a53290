"""The data paths compile to 16-byte accesses, and the flags to release signals and acquire
waits, for sm_90 (no GPU needed; PTX inspected).

Alignment hints are easy to lose: Triton drops `tl.multiple_of` / `tl.max_contiguous` given on a
function's argument, and a pointer translated to a peer or made from an integer (a workspace)
knows nothing of its alignment; the fused kernels then move tiles in 2-byte remote stores, several
times slower. Pointer arguments get 16-byte divisibility, as jax-triton declares them.
"""

import re

import pytest
import triton
import triton.language as tl

from iris_core.collectives import kernels as C
from iris_core.collectives.workspace import FusedLayout, WorkspaceLayout
from iris_core.device import Context
from iris_core.gemm import fused as F
from iris_core.launch import GemmConfig


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


def _atomics(ptx: str) -> set:
    """The kinds of atomics in `ptx`, with their semantics and scope; a `red` (the form without a
    result, which Triton 3.9 emits where the old value is unused) counts as the `atom` it replaces."""
    return {"atom." + op for op in re.findall(r"\b(?:atom|red)\.([a-z0-9._]+)", ptx)}


def _fences(ptx: str) -> set:
    """Memory fences in `ptx` (not `fence.sync.aligned`, which orders a GEMM's wgmma)."""
    return set(re.findall(r"\bmembar\.[a-z]+|\bfence\.(?:acq_rel|sc|acquire|release)[a-z0-9.]*", ptx))


def _collective_ptx(kind, variant, push=False, stream=False, zero_copy=False) -> str:
    layout = WorkspaceLayout(2, 1 << 20)
    consts = C.launch_constants(KIND=kind, OP=C.SUM, VARIANT=variant, G=2, WORLD=2,
                                XB=2 if kind in (C.REDUCE_SCATTER, C.ALL_TO_ALL) else 1,
                                OB=2 if kind in (C.ALL_GATHER, C.ALL_TO_ALL) else 1,
                                SOURCES=(1, 0), ACC=tl.float32, BLOCK=2048, CHUNK=(1 << 20) // 8,
                                REGIONS=layout.regions, TIMEOUT_NS=10**9, WHAT="test", ZERO_COPY=zero_copy,
                                HEAP_BYTES=1 << 30, VEC=4, PUSH=push, STREAM=stream, SENDERS=4)
    signature = {"context_ptr": "*i32", "group_ptr": "*i32", "x_ptr": "*fp32", "m": "i32", "out_ptr": "*fp32"}
    return _ptx(C.collective_kernel, signature, consts, num_warps=8)


def _fused_ptx(kernel: str) -> str:
    M = N = K = 256
    gemm = GemmConfig(BM=64, BN=64, BK=32, GROUP_M=8, PREC="tf32", num_warps=4, num_stages=2)
    common = dict(M=M, N=N, K=K, G=2, world=2, gemm=gemm, layout=FusedLayout(1 << 24, 1 << 12, 2), poll_ns=500,
                  timeout_ns=10**9, what="test")
    if kernel == "matmul_reduce":
        fn, consts = F.matmul_reduce_kernel, F.reduce_constants(scatter=False, gemm_programs=12, **common)
    else:
        fn, consts = F.all_gather_matmul_kernel, F.gather_constants(comm_programs=2, **common)
    signature = {"context_ptr": "*i32", "group_ptr": "*i32", "a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
    return _ptx(fn, signature, consts, **gemm.options())


@pytest.mark.parametrize("kind,variant,push,stream", [
    (C.ALL_REDUCE, C.ONE_SHOT, False, False), (C.ALL_REDUCE, C.TWO_SHOT, False, False),
    (C.ALL_GATHER, C.ONE_SHOT, False, False), (C.PPERMUTE, C.ONE_SHOT, False, False),
    (C.ALL_REDUCE, C.ONE_SHOT, True, False), (C.ALL_GATHER, C.ONE_SHOT, True, False),
    (C.PPERMUTE, C.ONE_SHOT, True, False), (C.ALL_REDUCE, C.ONE_SHOT, True, True), (C.ALL_TO_ALL, C.ONE_SHOT, True, True)])
def test_collective_kernel_moves_data_in_16_byte_vectors(kind, variant, push, stream):
    pytest.importorskip("triton.backends.nvidia")
    accesses = _accesses(_collective_ptx(kind, variant, push, stream, zero_copy=not push))
    assert "st.global.v4.b32" in accesses and "ld.global.v4.b32" in accesses, accesses
    if not stream:  # only flags and epochs (64-bit) are scalar (streamed: also the int32 tile counts)
        assert "st.global.b32" not in accesses, accesses
    # flag waits acquire (an unused `tl.atomic_add(flag, 0, sem="acquire")` compiled to nothing);
    # streamed calls wait on int32 tile flags
    assert f"ld.acquire.sys.global.b{32 if stream else 64}" in accesses, accesses


@pytest.mark.parametrize("kernel", ["matmul_reduce", "all_gather_matmul"])
def test_fused_kernels_move_tiles_in_16_byte_vectors(kernel):
    pytest.importorskip("triton.backends.nvidia")
    ptx = _fused_ptx(kernel)
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


SIGNAL = "atom.global.sys.release.max.s64"  # Flags.signal: a stamp raised on a member
POISON = "atom.global.sys.relaxed.max.s64"  # Flags.poison: a program that gave up
EXCHANGE = "atom.global.sys.release.exch.b32"  # Flags.set (a tile flag), Flags.unlock
FAULT_FENCES = {"fence.sc.sys"}  # faults.fail, on the path of a program that gives up only


@pytest.mark.parametrize("path,variant,options,atomics", [
    ("pull", C.ONE_SHOT, {}, {SIGNAL, POISON}),
    ("zero_copy", C.ONE_SHOT, dict(zero_copy=True), {SIGNAL, POISON}),
    ("push", C.ONE_SHOT, dict(push=True), {SIGNAL, POISON}),
    # (streamed: SIGNAL only where a program that gave up poisons the lines of programs its launch lacks)
    ("streamed", C.ONE_SHOT, dict(push=True, stream=True), {EXCHANGE, POISON, SIGNAL}),
    ("two_shot", C.TWO_SHOT, {}, {SIGNAL, POISON}),
    ("atomic", C.ATOMIC, {}, {SIGNAL, POISON, "atom.global.sys.relaxed.add.f32"}),
    ("spinlock", C.SPINLOCK, {}, {SIGNAL, POISON, EXCHANGE, "atom.global.acquire.sys.cas.b32"}),
    ("ring", C.RING, {}, {SIGNAL, POISON}),
])
def test_collective_flags_are_release_signals_and_acquire_waits(path, variant, options, atomics):
    """Every flag is raised by a system-scope release (a stamp's atomic max; a streamed tile's
    exchange) and polled by an acquiring load, with no fence but the fault record's; a program
    that gives up poisons its flags (relaxed max), writes its record to host memory (volatile
    stores between system fences, no print) and exits or traps."""
    pytest.importorskip("triton.backends.nvidia")
    ptx = _collective_ptx(C.ALL_REDUCE, variant, **options)
    assert _atomics(ptx) == atomics
    acquire = f"ld.acquire.sys.global.b{32 if path == 'streamed' else 64}"
    assert acquire in _accesses(ptx), _accesses(ptx)
    assert _fences(ptx) == FAULT_FENCES, _fences(ptx)
    assert "vprintf" not in ptx and "trap;" in ptx and "exit;" in ptx


@pytest.mark.parametrize("kernel", ["matmul_reduce", "all_gather_matmul"])
def test_fused_kernels_flag_tiles_with_release_exchanges_and_no_fence(kernel):
    """The fused kernels raise tile flags by release exchanges and wait by acquiring loads
    (test above); program 0 announces the call by a release max, a program that gives up poisons
    its line by a relaxed max; a timeout writes its fault record and stops without printing."""
    pytest.importorskip("triton.backends.nvidia")
    ptx = _fused_ptx(kernel)
    assert _atomics(ptx) == {EXCHANGE, SIGNAL, POISON}
    assert _fences(ptx) == FAULT_FENCES, _fences(ptx)
    assert "vprintf" not in ptx and "trap;" in ptx and "exit;" in ptx


def test_device_barrier_signals_by_release_and_waits_by_acquire_without_printing():
    pytest.importorskip("triton.backends.nvidia")
    from iris_core.device.barrier import barrier_kernel, launch_constants

    signature = {"context_ptr": "*i32", "after_ptr": "*i32", "status_ptr": "*i32"}
    ptx = _ptx(barrier_kernel, signature, launch_constants(area_offset=1 << 16, timeout_ns=10**9, world=2),
               num_warps=4)
    assert _atomics(ptx) == {SIGNAL, POISON}  # POISON: a rank that gave up poisons its slot on every peer
    assert "ld.acquire.sys.global.b64" in _accesses(ptx), _accesses(ptx)
    assert _fences(ptx) == FAULT_FENCES, _fences(ptx)  # only the fault record's (faults.fail)
    assert "vprintf" not in ptx  # a missing rank is named by a fault record (exit, or trap in that mode)
