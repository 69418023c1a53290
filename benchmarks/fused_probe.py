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

from iris_core.device import Context  # noqa: E402
from iris_core.device.flags import write_epoch  # noqa: E402
from iris_core.heap.context_layout import encode_context  # noqa: E402
from iris_core.kernels import fused as F  # noqa: E402
from iris_core.kernels import gemm as Gm  # noqa: E402


@triton.jit
def probe_kernel(context_ptr, group_ptr, a_ptr, b_ptr, out_ptr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr,
                 GEMM_PROGRAMS: tl.constexpr, WS_OFFSET: tl.constexpr, FLAGS: tl.constexpr, DATA: tl.constexpr,
                 DATA_BYTES: tl.constexpr, SLOT: tl.constexpr, FLAG: tl.constexpr, REDUCE: tl.constexpr,
                 POLL_NS: tl.constexpr):
    """matmul_reduce_kernel(SCATTER=0) over a group of one, with pieces switched off."""
    ctx = Context.initialize(context_ptr, 1)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    ws_base, epoch_ptr, epoch = F._prologue(ctx, WS_OFFSET)
    data = tl.cast(ws_base + DATA + (epoch % 2).to(tl.uint64) * DATA_BYTES, out_ptr.dtype)
    flags = tl.cast(ws_base + FLAGS, tl.pointer_type(tl.int32))
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
            acc = Gm.tile_gemm(a_ptr, b_ptr, pid_m, pid_n, M, N, K, K, 1, N, 1, BM, BN, BK, True, "tf32", False)
            if SLOT:
                tl.store(F._slot(data, t, offs, BN), acc.to(out_dtype))
            else:
                Gm.store_tile(out_ptr, acc.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
            if FLAG:
                tl.debug_barrier()
                ctx.atomic_xchg(flags + t, epoch, to_rank=0, sem="release", scope="sys")
            if SLOT & (REDUCE == 3) & (t >= tail):
                F._reduce_tile(ctx, group_ptr, data, flags, t, epoch, offs, out_ptr, pid_m, pid_n, M, N, 1, BM, BN,
                               POLL_NS, 10**10, "probe")
    elif REDUCE > 0:
        for t in range(pid - PG, tail, programs - PG):
            F._wait(flags + t, epoch, 0, POLL_NS, 10**10, "probe")
            if REDUCE == 2:
                x = tl.load(F._slot(data, t, offs, BN))
                tl.store(F._slot(data, t, offs, BN), x, mask=x == 12345.0)  # keeps the load, stores nothing
            if REDUCE == 3:
                pid_m, pid_n = Gm.tile_coords(t, tiles_m, tiles_n, GROUP_M)
                F._reduce_tile(ctx, group_ptr, data, flags, t, epoch, offs, out_ptr, pid_m, pid_n, M, N, 1, BM, BN,
                               POLL_NS, 10**10, "probe")
    write_epoch(epoch_ptr, epoch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=8192)
    parser.add_argument("--n", type=int, default=8192)
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--reducers", type=int, default=16)
    opts = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        sys.exit("fused_probe.py needs a GPU")
    M, N, K = opts.m, opts.n, opts.k
    SMS = torch.cuda.get_device_properties(0).multi_processor_count
    PG = SMS - opts.reducers
    BM, BN, BK, GROUP_M, warps, stages = 128, 256, 64, 8, 8, 3
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = (torch.randn(K, N, device="cuda") * K ** -0.5).to(torch.bfloat16)
    out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    want = (a.float() @ b.float()).to(torch.bfloat16).float()
    flags_bytes = 1 << 20
    data_bytes = M * N * 2
    heap = torch.zeros(F.LINE.value * 256 + flags_bytes + 2 * data_bytes, device="cuda", dtype=torch.uint8)
    ctx = torch.from_numpy(encode_context(0, [heap.data_ptr()], heap_size=heap.numel())).cuda()
    group = torch.tensor([0, 0], device="cuda", dtype=torch.int32)
    ws = dict(WS_OFFSET=0, FLAGS=F.LINE.value * 256, DATA=F.LINE.value * 256 + flags_bytes, DATA_BYTES=data_bytes)
    gemm = dict(M=M, N=N, K=K, BM=BM, BN=BN, BK=BK, num_warps=warps, num_stages=stages)

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

    def plain(grid, group_m=GROUP_M):
        return lambda: Gm.matmul_kernel[(grid,)](ctx, a, b, out, stride_am=K, stride_ak=1, stride_bk=N, stride_bn=1,
                                                  GROUP_M=group_m, PREC="tf32", **gemm)

    def fused(pg=PG, poll=0):
        return lambda: F.matmul_reduce_kernel[(SMS,)](
            ctx, group, a, b, out, stride_am=K, stride_ak=1, stride_bk=N, stride_bn=1, SCATTER=0, G=1, WORLD=1,
            GROUP_M=GROUP_M, PREC="tf32", GEMM_PROGRAMS=pg, POLL_NS=poll, TIMEOUT_NS=10**10, WHAT="probe", **ws,
            **gemm)

    def probe(slot, flag, reduce, pg=PG, poll=0):
        return lambda: probe_kernel[(SMS,)](ctx, group, a, b, out, GROUP_M=GROUP_M, GEMM_PROGRAMS=pg, SLOT=slot,
                                            FLAG=flag, REDUCE=reduce, POLL_NS=poll, **ws, **gemm)

    print(f"M={M} N={N} K={K} bf16, {SMS} SMs, {PG} GEMM programs, mean of {opts.reps} launches (CUDA events)")
    print("| kernel | us | correct |\n|---|---|---|")
    timed(f"GEMM core, grid {SMS}", plain(SMS))
    timed(f"GEMM core, grid {PG}", plain(PG))
    timed("fused all-reduce kernel, group of one", fused())
    timed(f"fused, no reducers ({SMS} programs reduce their own tiles)", fused(pg=SMS))
    timed("probe: GEMM programs only, tiles to the output", probe(0, 0, 0), check=True)
    timed("probe: slot + flag", probe(1, 1, 0), check=False)
    timed("probe: slot + flag, reducers wait", probe(1, 1, 1), check=False)
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
