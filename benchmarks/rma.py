"""Remote store / load bandwidth GPU0 -> GPU1 through the device API, vs a plain copy.

    python benchmarks/rma.py [--mib 256]

Times, in one run: torch's device-to-device copy GPU0 -> GPU1; `ctx.store` (kernel on
GPU0 writes GPU1's heap) and `ctx.load` (kernel on GPU1 reads GPU0's heap), each with
and without `hint`; both directions at once (two copies; two loading kernels, what an
all-reduce on 2 GPUs does; two storing kernels, what a pushing collective would do); and the
one-way latency of a flag (ping-pong / 2). Prints a markdown table (GB/s and % of the
one-way copy). Needs 2 GPUs; on a machine without them it says so and exits.
"""

from __future__ import annotations

import argparse
import datetime
import os
import shutil
import subprocess
import sys
import time

import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import small  # noqa: E402
from iris_core.device import Context, global_timer  # noqa: E402


@triton.jit
def store_kernel(context_ptr, src_ptr, dst_ptr, n, TO: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr,
                 W: tl.constexpr):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    ctx.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=m), to_rank=TO, mask=m, hint=HINT)


@triton.jit
def load_kernel(context_ptr, src_ptr, dst_ptr, n, FROM: tl.constexpr, BLOCK: tl.constexpr, HINT: tl.constexpr,
                W: tl.constexpr, CACHE: tl.constexpr = ""):
    ctx = Context.initialize(context_ptr, W)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst_ptr + offs, ctx.load(src_ptr + offs, from_rank=FROM, mask=m, hint=HINT, cache_modifier=CACHE),
             mask=m)


@triton.jit
def load_persistent_kernel(context_ptr, src_ptr, dst_ptr, n, FROM: tl.constexpr, BLOCK: tl.constexpr,
                           W: tl.constexpr, CACHE: tl.constexpr = ""):
    """The collectives' pattern: a fixed grid, program k takes tiles k, k + P, ..."""
    ctx = Context.initialize(context_ptr, W)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst_ptr + offs, ctx.load(src_ptr + offs, from_rank=FROM, mask=m, cache_modifier=CACHE), mask=m)


@triton.jit
def store_persistent_kernel(context_ptr, src_ptr, dst_ptr, n, TO: tl.constexpr, BLOCK: tl.constexpr,
                            W: tl.constexpr):
    """The push twin of load_persistent_kernel: program k stores tiles k, k + P, ... to rank TO."""
    ctx = Context.initialize(context_ptr, W)
    for t in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = t.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        ctx.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=m), to_rank=TO, mask=m)


@triton.jit
def ping_pong_kernel(context_ptr, flag_ptr, out_ptr, ROUNDS: tl.constexpr, W: tl.constexpr):
    """Ranks 0 and 1 raise each other's flag in turn, ROUNDS times; out: ns, or -1 on timeout."""
    ctx = Context.initialize(context_ptr, W)
    peer = 1 - ctx.rank
    start = global_timer()
    failed = 0
    for r in range(1, ROUNDS + 1):
        if (r % 2) == ctx.rank:
            ctx.atomic_xchg(flag_ptr, r, to_rank=peer, sem="release", scope="sys")
        else:
            seen = tl.load(flag_ptr, volatile=True)
            while seen < r:
                seen = tl.load(flag_ptr, volatile=True)
                if global_timer() - start > 5_000_000_000:  # a lost peer: give up, report -1
                    seen = tl.full((), r, tl.int64)
                    failed = 1
    tl.store(out_ptr, tl.where(failed == 1, -1, global_timer() - start))


BLOCK = 4096  # elements per program (per tile of the persistent kernels)


def small_kernels() -> dict:
    """--small: every kernel with the constexprs main() launches it with, for sm_90."""
    args = {"context_ptr": "*i32", "src_ptr": "*fp32", "dst_ptr": "*fp32", "n": "i32"}
    warps = dict(num_warps=8)
    return {
        "ctx.store, hint 16": (store_kernel, args, dict(TO=1, BLOCK=BLOCK, HINT=16, W=2), warps),
        "ctx.load, .cg": (load_kernel, args, dict(FROM=0, BLOCK=BLOCK, HINT=None, W=2, CACHE=".cg"), warps),
        "ctx.load, persistent": (load_persistent_kernel, args, dict(FROM=0, BLOCK=BLOCK, W=2, CACHE=""), warps),
        "ctx.store, persistent": (store_persistent_kernel, args, dict(TO=1, BLOCK=BLOCK, W=2), warps),
        "flag ping-pong": (ping_pong_kernel, {"context_ptr": "*i32", "flag_ptr": "*i64", "out_ptr": "*i64"},
                           dict(ROUNDS=PING_PONG_ROUNDS, W=2), {}),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    small.add_flag(parser, "compiles every kernel for sm_90, as launched")
    opts = parser.parse_args()
    if opts.small:
        small.compile_all(small_kernels())
        return
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("rma.py measures GPU-to-GPU bandwidth and needs 2 GPUs; none here, nothing measured.")
        return
    from iris_core.heap.cuda import CudaHeap

    nbytes = opts.mib << 20
    n = nbytes // 4
    heap = CudaHeap(2, 2 * nbytes + (1 << 20), [0, 1], [0, 1])
    src_off, dst_off = heap.allocate(nbytes), heap.allocate(nbytes)
    src = [heap.torch_tensor(r, src_off, (n,), torch.float32) for r in range(2)]
    dst = [heap.torch_tensor(r, dst_off, (n,), torch.float32) for r in range(2)]
    ctx = [torch.from_numpy(heap.context(r)).to(f"cuda:{r}") for r in range(2)]
    for r in range(2):
        src[r].copy_(torch.randn(n, device=f"cuda:{r}"))
    rows = []

    def bench(name, device, fn, check):
        torch.cuda.set_device(device)
        for r in range(2):
            dst[r].fill_(float("nan"))
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        fn()
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        ok = check()
        ms = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
        torch.cuda.synchronize(0), torch.cuda.synchronize(1)
        rows.append((name, ms * 1e3, nbytes / ms / 1e6, ok))

    bench("torch copy GPU0->GPU1", 0, lambda: dst[1].copy_(src[0]), lambda: torch.equal(dst[1].cpu(), src[0].cpu()))
    block = BLOCK
    grid = (triton.cdiv(n, block),)
    for hint in (None, 16):
        bench(f"ctx.store GPU0->GPU1 hint={hint}", 0,
              lambda: store_kernel[grid](ctx[0], src[0], dst[0], n, TO=1, BLOCK=block, HINT=hint, W=2, num_warps=8),
              lambda: torch.equal(dst[1].cpu(), src[0].cpu()))
        bench(f"ctx.load GPU0->GPU1 hint={hint}", 1,
              lambda: load_kernel[grid](ctx[1], src[1], dst[1], n, FROM=0, BLOCK=block, HINT=hint, W=2, num_warps=8),
              lambda: torch.equal(dst[1].cpu(), src[0].cpu()))
    # what the collectives do differently: peers' data read with .cg, a persistent grid
    bench("ctx.load GPU0->GPU1 cache_modifier=.cg", 1,
          lambda: load_kernel[grid](ctx[1], src[1], dst[1], n, FROM=0, BLOCK=block, HINT=None, W=2, CACHE=".cg",
                                    num_warps=8),
          lambda: torch.equal(dst[1].cpu(), src[0].cpu()))
    sms = torch.cuda.get_device_properties(1).multi_processor_count
    for programs, cache in ((sms, ""), (sms, ".cg"), (2 * sms, "")):
        bench(f"ctx.load GPU0->GPU1 persistent grid={programs} cache_modifier={cache or 'none'}", 1,
              lambda: load_persistent_kernel[(programs,)](ctx[1], src[1], dst[1], n, FROM=0, BLOCK=block, W=2,
                                                          CACHE=cache, num_warps=8),
              lambda: torch.equal(dst[1].cpu(), src[0].cpu()))
    both_ways("torch copy, both directions at once (per direction)", rows, nbytes,
              lambda: (dst[1].copy_(src[0]), dst[0].copy_(src[1])),  # each on its source GPU's stream
              lambda: torch.equal(dst[1].cpu(), src[0].cpu()) and torch.equal(dst[0].cpu(), src[1].cpu()))
    both_ways(f"ctx.load persistent grid={sms}, both directions at once (per direction)", rows, nbytes,
              lambda: [on_device(r, lambda r=r: load_persistent_kernel[(sms,)](
                  ctx[r], src[r], dst[r], n, FROM=1 - r, BLOCK=block, W=2, CACHE="", num_warps=8)) for r in (1, 0)],
              lambda: torch.equal(dst[1].cpu(), src[0].cpu()) and torch.equal(dst[0].cpu(), src[1].cpu()))
    both_ways(f"ctx.store persistent grid={sms}, both directions at once (per direction)", rows, nbytes,
              lambda: [on_device(r, lambda r=r: store_persistent_kernel[(sms,)](
                  ctx[r], src[r], dst[r], n, TO=1 - r, BLOCK=block, W=2, num_warps=8)) for r in (1, 0)],
              lambda: torch.equal(dst[1].cpu(), src[0].cpu()) and torch.equal(dst[0].cpu(), src[1].cpu()))
    latency = flag_latency_us(heap, ctx, src_off)
    copy_bw = rows[0][2]
    print(f"\n### RMA bandwidth, {opts.mib} MiB float32, {datetime.date.today()}, "
          f"{_gpu_name()} x2, `python benchmarks/rma.py --mib {opts.mib}`\n")
    print("| op | time (us) | GB/s | % of copy | correct |\n|---|---|---|---|---|")
    for name, us, bw, ok in rows:
        print(f"| {name} | {us:.1f} | {bw:.1f} | {100 * bw / copy_bw:.0f}% | {ok} |")
    print(f"\nflag one-way latency GPU0 <-> GPU1 (ping-pong / 2, {PING_PONG_ROUNDS} rounds): {latency:.2f} us")
    heap.close()


def both_ways(name, rows, nbytes, fn, check, iters=20):
    """Launches on both GPUs (each on its own current stream), times `iters` rounds by wall clock."""
    import torch

    for r in range(2):
        torch.cuda.synchronize(r)
    fn()
    for r in range(2):
        torch.cuda.synchronize(r)
    ok = check()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        for r in range(2):
            torch.cuda.synchronize(r)
        times.append((time.perf_counter() - start) / iters)
    s = sorted(times)[len(times) // 2]
    rows.append((name, s * 1e6, nbytes / s / 1e9, ok))


PING_PONG_ROUNDS = 10000


def on_device(r, fn):
    import torch

    with torch.cuda.device(r):
        return fn()


def flag_latency_us(heap, ctx, offset):
    """One-way flag latency: both GPUs run ping_pong_kernel at once; time / rounds."""
    import torch

    flags = [heap.torch_tensor(r, offset, (1,), torch.int64) for r in range(2)]
    outs = [torch.zeros(1, dtype=torch.int64, device=f"cuda:{r}") for r in range(2)]
    for r in range(2):
        flags[r].zero_()
        torch.cuda.synchronize(r)
    for r in range(2):
        on_device(r, lambda r=r: ping_pong_kernel[(1,)](ctx[r], flags[r], outs[r], ROUNDS=PING_PONG_ROUNDS, W=2))
    for r in range(2):
        torch.cuda.synchronize(r)
    ns = [int(o.item()) for o in outs]
    if min(ns) < 0:
        raise RuntimeError(f"ping-pong timed out (ns per rank: {ns})")
    return max(ns) / PING_PONG_ROUNDS / 1e3


def _gpu_name() -> str:
    if shutil.which("nvidia-smi"):
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.splitlines()[0]
    return "GPU"


if __name__ == "__main__":
    main()
