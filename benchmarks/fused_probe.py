"""Where the fused all-reduce kernel loses time against the plain GEMM, on one GPU (no link).

    python benchmarks/fused_probe.py [--m 8192] [--n 8192] [--k 4096] [--reps 20]

Written when the fused matmul_all_reduce kernel over a group of one took ~1070 us where the
GEMM core alone took ~745. It showed that the GEMM
programs alone ran at full speed and slowed down as soon as the reducing programs' waits were
compiled in: their timeout print made ptxas serialize the kernel's wgmma. This script
launches the kernels directly from torch on GPU 0 (a world of one: the heap is a torch
buffer) and times, with CUDA events (mean of `reps` back-to-back launches):

  * the GEMM core (gemm.matmul_kernel) on all SMs and on the fused kernel's GEMM programs only;
  * the fused kernel itself (fused.matmul_reduce_kernel);
  * `probe_kernel`: the fused kernel's structure with pieces switched off one at a time
    (SLOT: tiles go to the heap slot and not straight to the output; FLAG: the release
    per tile; REDUCE: what the reducing programs do: 0 nothing, 1 wait for the flag,
    2 wait and pull the tile, 3 wait, pull and store the result);
  * the waits polling flat out or sleeping POLL_NS between reads (nanosleep), per reducer count;
  * the SM clock and power while the plain GEMM and the fused kernel run (nvidia-smi).
GPUs only; a probe for tuning, not a benchmark of the library's API.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402
from iris_core.collectives import group_layout, kinds  # noqa: E402
from iris_core.collectives.workspace import FusedLayout  # noqa: E402
from iris_core.device import Context, flags  # noqa: E402
from iris_core.device.flags import Flags  # noqa: E402
from iris_core.gemm import fused as F  # noqa: E402
from iris_core.gemm import gemm as Gm  # noqa: E402
from iris_core.heap.context_layout import encode_context  # noqa: E402
from iris_core.launch import GemmConfig, kernel_constants  # noqa: E402

H200_SMS = 132  # --small compiles for the GPU the probe was written on
GEMM = GemmConfig(BM=128, BN=256, BK=64, GROUP_M=8, PREC="tf32", num_warps=8, num_stages=3)  # bf16's default
TIMEOUT_NS = 10**10  # a probe's waits end after 10 s


@triton.jit
def probe_kernel(context_ptr, group_ptr, a_ptr, b_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr, stride_bn: tl.constexpr,
                 SCATTER: tl.constexpr, G: tl.constexpr, WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 BK: tl.constexpr, GROUP_M: tl.constexpr, PREC: tl.constexpr, GEMM_PROGRAMS: tl.constexpr,
                 MEMBERS: tl.constexpr, FLAGS: tl.constexpr, DATA: tl.constexpr, DATA_BYTES: tl.constexpr,
                 POLL_NS: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr, SLOT: tl.constexpr = 1,
                 FLAG: tl.constexpr = 1, REDUCE: tl.constexpr = 3, CHECK: tl.constexpr = 1):
    """matmul_reduce_kernel(SCATTER=0) over a group of one (its constexprs, F.reduce_constants,
    plus four switches), with pieces switched off. CHECK: the call's announcement and the
    members check before the first wait."""
    ctx = Context.initialize(context_ptr, 1)
    f = Flags(ctx, TIMEOUT_NS, POLL_NS, WHAT)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    ws_base, epoch_ptr, epoch = F._prologue(ctx, group_ptr, 1)
    sig = F._signature(kinds.MATMUL_ALL_REDUCE, a_ptr.dtype.element_ty, 1, M, N, K)
    if CHECK & (pid == 0):
        F._announce(f, group_ptr, ws_base, epoch, sig, 1, MEMBERS)
    data = tl.cast(ws_base + DATA + (epoch % 2).to(tl.uint64) * DATA_BYTES, out_ptr.dtype)
    tile_flags = tl.cast(ws_base + FLAGS, tl.pointer_type(tl.int32))
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    T = tiles_m * tiles_n
    PG: tl.constexpr = GEMM_PROGRAMS
    tail = (tl.cdiv(T, PG) - 1) * PG if (programs > PG) & (REDUCE > 0) else 0
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    out_dtype = out_ptr.dtype.element_ty
    if pid < PG:
        for t in range(pid, T, PG):
            pid_m, pid_n = Gm.tile_coords(t, tiles_m, tiles_n, GROUP_M)
            acc = Gm.tile_gemm(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                               BM, BN, BK, K % BK == 0, PREC, False)
            if SLOT:
                tl.store(F._slot(data, t, offs, BN), acc.to(out_dtype))
            else:
                Gm.store_tile(out_ptr, acc.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
            if FLAG:
                tl.debug_barrier()
                f.set(tile_flags + t, epoch, 0)
            if SLOT & (REDUCE == 3) & (t >= tail):
                if CHECK:
                    F._check_members(f, group_ptr, ws_base, epoch, sig, 1, MEMBERS)
                F._reduce_tile(f, group_ptr, ws_base, sig, data, tile_flags, t, epoch, offs, out_ptr, pid_m, pid_n,
                               M, N, 1, BM, BN, MEMBERS)
    elif REDUCE > 0:
        if CHECK:
            F._check_members(f, group_ptr, ws_base, epoch, sig, 1, MEMBERS)
        for t in range(pid - PG, tail, programs - PG):
            f.wait_or_fail(tile_flags + t, epoch, 0)
            if REDUCE == 2:
                x = tl.load(F._slot(data, t, offs, BN))
                tl.store(F._slot(data, t, offs, BN), x, mask=x == 12345.0)  # keeps the load, stores nothing
            if REDUCE == 3:
                pid_m, pid_n = Gm.tile_coords(t, tiles_m, tiles_n, GROUP_M)
                F._reduce_tile(f, group_ptr, ws_base, sig, data, tile_flags, t, epoch, offs, out_ptr, pid_m, pid_n,
                               M, N, 1, BM, BN, MEMBERS)
    flags.write_epoch(epoch_ptr, epoch)


def layout_for(M: int, N: int) -> FusedLayout:
    """The fused workspace of a group of one at the heap's start: a flag per tile, M x N bf16."""
    tiles = -(-M // GEMM.BM) * -(-N // GEMM.BN)
    return FusedLayout(data_bytes=-(-M * N * 2 // 256) * 256, flag_count=tiles, world_size=1)


def constants(M: int, N: int, K: int, sms: int, reducers: int, poll_ns: int = 0) -> dict:
    """matmul_reduce_kernel's constexprs over a group of one: `sms` programs, `reducers` of
    them reducing (0: every program reduces its own tiles)."""
    return F.reduce_constants(M=M, N=N, K=K, scatter=False, G=1, world=1, gemm=GEMM, gemm_programs=sms - reducers,
                              layout=layout_for(M, N), poll_ns=poll_ns, timeout_ns=TIMEOUT_NS, what="probe")


def compile_small():
    """--small: the plain GEMM, the fused kernel and the probe, compiled for sm_90 as launched."""
    M, N, K = 1024, 1024, 512
    pointers = {"context_ptr": "*i32", "group_ptr": "*i32", "a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16",
                "c_ptr": "*bf16"}
    fused = constants(M, N, K, H200_SMS, 16, poll_ns=500)
    small.compile_all({
        "GEMM core": (Gm.matmul_kernel, pointers, Gm.matmul_constants(M=M, N=N, K=K, gemm=GEMM), GEMM.options()),
        "fused all-reduce kernel, group of one": (F.matmul_reduce_kernel, pointers, fused, GEMM.options()),
        "probe: slot + flag, reducers wait, pull and store": (
            probe_kernel, pointers, kernel_constants(probe_kernel, **fused, SLOT=1, FLAG=1, REDUCE=3), GEMM.options()),
    })


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--reducers", type=int, default=16)
    small.add_flag(parser, "compiles the GEMM core, the fused kernel and the probe for sm_90 (H200's grid)")
    opts = parser.parse_args()
    if opts.small:
        compile_small()
        return
    import torch

    if not torch.cuda.is_available():
        sys.exit("fused_probe.py needs a GPU (--small compiles its kernels without one)")
    M, N, K = opts.m, opts.n, opts.k
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    PG = SMS - opts.reducers
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(K, N, device="cuda") * K ** -0.5).to(torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    want = (a.float() @ b.float()).to(torch.bfloat16).float()
    layout = layout_for(M, N)
    heap = torch.zeros(layout.total_bytes, device="cuda", dtype=torch.uint8)  # the workspace at heap offset 0
    ctx = torch.from_numpy(encode_context(0, [heap.data_ptr()], heap_size=heap.numel())).cuda()
    group = torch.tensor(group_layout.encode(0, [0], 0), device="cuda", dtype=torch.int32)

    def timed(name, launch, check=True):
        for _ in range(3):
            launch()
        if check:
            out.fill_(float("nan"))
            launch()
            err = (out.float() - want).abs().max().item()
            ok = err <= 0.05
        else:
            ok = "-"
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(opts.reps):
            launch()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / opts.reps
        print(f"| {name} | {us:.1f} | {ok} |", flush=True)
        return us

    def plain(grid):
        return lambda: Gm.matmul_kernel[(grid,)](ctx, a, b, out, **Gm.matmul_constants(M=M, N=N, K=K, gemm=GEMM),
                                                  **GEMM.options())

    def fused(pg=PG, poll=0):
        consts = constants(M, N, K, SMS, SMS - pg, poll)
        return lambda: F.matmul_reduce_kernel[(SMS,)](ctx, group, a, b, out, **consts, **GEMM.options())

    def probe(slot, flag, reduce, pg=PG, poll=0, check=1):
        consts = kernel_constants(probe_kernel, **constants(M, N, K, SMS, SMS - pg, poll), SLOT=slot, FLAG=flag,
                                  REDUCE=reduce, CHECK=check)
        return lambda: probe_kernel[(SMS,)](ctx, group, a, b, out, **consts, **GEMM.options())

    print(f"M={M} N={N} K={K} bf16, {SMS} SMs, {PG} GEMM programs, mean of {opts.reps} launches (CUDA events)")
    print("| kernel | us | correct |\n|---|---|---|")
    timed(f"GEMM core, grid {SMS}", plain(SMS))
    timed(f"GEMM core, grid {PG}", plain(PG))
    timed("fused all-reduce kernel, group of one", fused())
    timed(f"fused, no reducers ({SMS} programs reduce their own tiles)", fused(pg=SMS))
    timed("probe: GEMM programs only, tiles to the output", probe(0, 0, 0), check=True)
    timed("probe: slot + flag", probe(1, 1, 0), check=False)
    timed("probe: slot + flag, reducers wait", probe(1, 1, 1), check=False)
    timed("probe: the whole kernel", probe(1, 1, 3))
    timed("probe: the whole kernel but the announcement and members check", probe(1, 1, 3, check=0))
    for poll in (100, 500, 2000):
        timed(f"probe: slot + flag, reducers wait, polling every {poll} ns", probe(1, 1, 1, poll=poll), check=False)
        timed(f"fused, polling every {poll} ns", fused(poll=poll))
    for reducers in (8, 12, 24):
        timed(f"fused, {reducers} reducing programs, polling every 500 ns", fused(SMS - reducers, 500))

    # clocks and power while each kernel runs back to back for ~2 s
    for name, launch in (("GEMM core", plain(SMS)), ("fused, polling every 500 ns", fused(poll=500))):
        smi = subprocess.Popen(["nvidia-smi", "-i", "0", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                "--format=csv,noheader", "-lms", "200"], stdout=subprocess.PIPE, text=True)
        for _ in range(2500 if name == "GEMM core" else 1800):
            launch()
        torch.cuda.synchronize()
        smi.terminate()
        samples = smi.communicate()[0].strip().splitlines()
        print(f"{name}: nvidia-smi samples (sm MHz, mem MHz, W, C): {samples[2:-1]}", flush=True)


if __name__ == "__main__":
    main()
