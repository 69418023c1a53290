"""Remote store / load bandwidth GPU0 -> GPU1 through the device API, vs a plain copy.

    python benchmarks/rma.py [--mib 256]

Times, in one run: torch's device-to-device copy GPU0 -> GPU1; `ctx.store` (kernel on
GPU0 writes GPU1's heap) and `ctx.load` (kernel on GPU1 reads GPU0's heap), each with
and without `hint`. Prints a markdown table (GB/s and % of the copy). Needs 2 GPUs; on
a machine without them it says so and exits.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import subprocess

import triton
import triton.language as tl

from iris_core.device import Context


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    opts = parser.parse_args()
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
    block = 4096
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
    copy_bw = rows[0][2]
    print(f"\n### RMA bandwidth, {opts.mib} MiB float32, {datetime.date.today()}, "
          f"{_gpu_name()} x2, `python benchmarks/rma.py --mib {opts.mib}`\n")
    print("| op | time (us) | GB/s | % of copy | correct |\n|---|---|---|---|---|")
    for name, us, bw, ok in rows:
        print(f"| {name} | {us:.1f} | {bw:.1f} | {100 * bw / copy_bw:.0f}% | {ok} |")
    heap.close()


def _gpu_name() -> str:
    if shutil.which("nvidia-smi"):
        return subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True).stdout.splitlines()[0]
    return "GPU"


if __name__ == "__main__":
    main()
