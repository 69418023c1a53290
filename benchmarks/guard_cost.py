"""What the heap guard costs: PTX instructions (no GPU needed) and psum time (GPUs).

    python benchmarks/guard_cost.py ptx            # instructions per kernel, guard on and off
    python benchmarks/guard_cost.py time [--sizes 1K,64K,16M,256M]   # GPUs: psum vs lax, guard on / off
    python benchmarks/guard_cost.py time1 [--sizes 1K,64K,16M]       # one GPU: iris psum alone, on / off
    python benchmarks/guard_cost.py rma1 [--sizes 64K,16M,256M]      # one GPU: guarded load/store kernels

The guard (iris_core.device.rma, IRIS_HEAP_GUARD) checks every translated access against
the heap's bounds and the rank against the world size. `ptx` compiles, for sm_90 and in a
fresh process per setting (the switch is read when iris_core.device is imported), the
collective kernel as a psum runs it (one-shot pull, push, streamed), a ring all-reduce, and
a plain RMA kernel (one tile loaded from a peer and stored to another), and counts the PTX
instructions of each (and the 16-byte global accesses, which must survive the guard).
`time` runs benchmarks/collectives.py's psum under both settings and prints its rows (two
or more GPUs: it compares against lax.psum, which NCCL refuses for two ranks on one GPU).

`time1` needs one GPU: two processes share GPU 0 (as tests/gpu/launcher.py's shared mode;
heaps mapped through CUDA IPC) and time iris's psum alone, K chained calls in one jit, with
IRIS_HEAP_GUARD=1 and 0 (twice each, interleaved, a fresh pair of processes per setting).
It reports per call the collective kernel's time from a profile and the wall time. The two
ranks' kernels time-slice on one GPU and their "remote" accesses stay in that GPU's memory,
so it measures the guard's relative kernel-time cost (on / off), not NVLink speed and not
what a psum costs between GPUs. Measured: each wait on the other rank costs a time slice
(~2 ms per call at every size), which hides the guard.

`rma1` needs one GPU and no peer: a heap of one rank, and persistent kernels that copy N bytes
through `ctx.load(from_rank=0)` and through `ctx.store(to_rank=0)` (every access translated and,
with the guard, bounds-checked), timed with triton.testing.do_bench, guard on and off in fresh
processes, twice each, interleaved. It is the guard's cost per translated access on a
memory-bound kernel, what the collectives' tile loops pay.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import small  # noqa: E402
from benchmarks.small import compile_ptx, count_instructions  # noqa: E402


def _kernels() -> dict:
    """name -> (kernel, signature, constexprs, options) of what `ptx` counts: the collective
    kernel as a psum runs it, and a plain RMA kernel."""
    import triton
    import triton.language as tl

    from iris_core.collectives import kernels as C
    from iris_core.collectives.workspace import WorkspaceLayout
    from iris_core.device import Context

    @triton.jit
    def rma_kernel(context_ptr, x_ptr, n, out_ptr, W: tl.constexpr, BLOCK: tl.constexpr):
        ctx = Context.initialize(context_ptr, W)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n // 4 * 4  # whole 16-byte vectors: the accesses can vectorize
        value = ctx.load(x_ptr + offs, (ctx.rank + 1) % W, mask=mask, hint=16)
        ctx.store(out_ptr + offs, value, (ctx.rank + W - 1) % W, mask=mask, hint=16)

    layout = WorkspaceLayout(2, 1 << 20)
    signature = {"context_ptr": "*i32", "group_ptr": "*i32", "x_ptr": "*fp32", "m": "i32", "out_ptr": "*fp32"}
    common = dict(KIND=C.ALL_REDUCE, OP=C.SUM, G=2, WORLD=2, XB=1, OB=1, SOURCES=(1, 0), ACC=tl.float32,
                  BLOCK=8192, CHUNK=(1 << 20) // 8, REGIONS=layout.regions, TIMEOUT_NS=10**9, WHAT="psum",
                  HEAP_BYTES=1 << 30, VEC=4, SENDERS=4)
    cases = {
        "psum one-shot (pull, zero-copy)": dict(VARIANT=C.ONE_SHOT, ZERO_COPY=True),
        "psum one-shot (push)": dict(VARIANT=C.ONE_SHOT, PUSH=True),
        "psum streamed": dict(VARIANT=C.ONE_SHOT, PUSH=True, STREAM=True),
        "psum ring": dict(VARIANT=C.RING),
    }
    kernels = {name: (C.collective_kernel, signature, C.launch_constants(**common, **extra), dict(num_warps=8))
               for name, extra in cases.items()}
    kernels["rma tile (load + store)"] = (rma_kernel, {"context_ptr": "*i32", "x_ptr": "*fp32", "n": "i32",
                                                       "out_ptr": "*fp32"}, dict(W=2, BLOCK=1024), dict(num_warps=4))
    return kernels


def _measure() -> dict:
    """Instruction counts of the kernels, as this process's switch compiles them."""
    return {name: count_instructions(compile_ptx(kernel, signature, constexprs, **options))
            for name, (kernel, signature, constexprs, options) in _kernels().items()}


def ptx_table() -> str:
    results = {}
    for guard in ("1", "0"):
        env = dict(os.environ, IRIS_HEAP_GUARD=guard, TRITON_INTERPRET="0")
        out = subprocess.run([sys.executable, __file__, "_measure"], env=env, capture_output=True, text=True,
                             check=True).stdout
        results[guard] = json.loads(out.strip().splitlines()[-1])
    lines = ["| kernel (sm_90 PTX) | guard off | guard on | added | 16-byte accesses off / on |", "|---|---|---|---|---|"]
    for name, off in results["0"].items():
        on = results["1"][name]
        added = on["instructions"] - off["instructions"]
        lines.append(f"| {name} | {off['instructions']} | {on['instructions']} | {added:+d} "
                     f"({100 * added / off['instructions']:+.1f}%) | {off['v4_accesses']} / {on['v4_accesses']} |")
    return "\n".join(lines)


def time_psum(sizes: str, out: str) -> None:
    for guard in ("1", "0", "1", "0"):  # twice each, interleaved: run-to-run noise shows
        print(f"== IRIS_HEAP_GUARD={guard}", flush=True)
        env = dict(os.environ, IRIS_HEAP_GUARD=guard)
        subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "collectives.py"), "--sizes", sizes,
                        "--ops", "psum", "--out", os.path.join(out, f"guard{guard}")], env=env, check=False)


SHARED_ROW = "guard_cost row "  # how a rank of `time1` prints a measurement (then JSON)


def shared_rank(process: int, port: int, sizes: str, calls: int) -> None:
    """One of `time1`'s two processes on GPU 0: times iris psum at each size; rank 0 prints
    its rows (IRIS_HEAP_GUARD in the environment says which setting)."""
    import statistics

    import jax

    jax.distributed.initialize(f"localhost:{port}", num_processes=2, process_id=process, local_device_ids=[0])
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import iris_jax
    from benchmarks.collectives import chain_jit, gpu_time, parse_size

    iris_jax.init(heap_size=256 << 20)
    devices = sorted(jax.devices(), key=lambda d: d.id)  # both processes' ranks (the runtime's devices: this one's)
    mesh = jax.make_mesh((len(devices),), ("i",), devices=devices)
    for size in sizes.split(","):
        n = parse_size(size) // 4
        whole = np.ones((2 * n,), np.float32)
        x = jax.make_array_from_callback(whole.shape, NamedSharding(mesh, P("i")), lambda idx: whole[idx])
        f = chain_jit(lambda v: iris_jax.psum(v, "i"), mesh, n, jnp.dtype(jnp.float32), calls, jax, jnp, P)
        jax.block_until_ready(f(x))
        kernel_us = min(gpu_time(f, x, calls=calls).comm for _ in range(3))
        walls = []
        for _ in range(5):
            start = time.perf_counter()
            jax.block_until_ready(f(x))
            walls.append(time.perf_counter() - start)
        if process == 0:
            row = dict(guard=os.environ.get("IRIS_HEAP_GUARD", "1"), size=size, kernel_us=kernel_us,
                       wall_us=statistics.median(walls) / calls * 1e6)
            print(SHARED_ROW + json.dumps(row), flush=True)
    iris_jax.barrier()
    iris_jax.shutdown()


def time_psum_one_gpu(sizes: str, calls: int, rounds: int, limit_s: float) -> None:
    """`time1`: pairs of processes on GPU 0, guard on and off interleaved; prints a table."""
    import socket

    rows = []
    for guard in ("1", "0") * rounds:
        with socket.socket() as sock:
            sock.bind(("localhost", 0))
            port = sock.getsockname()[1]
        env = dict(os.environ, IRIS_HEAP_GUARD=guard, PYTHONUNBUFFERED="1", XLA_PYTHON_CLIENT_PREALLOCATE="false",
                   XLA_PYTHON_CLIENT_MEM_FRACTION="0.1", PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        env.pop("JAX_PLATFORMS", None)
        procs = [subprocess.Popen([sys.executable, __file__, "_shared_rank", "--process", str(p), "--port", str(port),
                                   "--sizes", sizes, "--calls", str(calls)], env=env, cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for p in range(2)]
        outputs = []
        for proc in procs:
            try:
                outputs.append(proc.communicate(timeout=limit_s)[0])
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                outputs.append(proc.communicate()[0] + f"\n(killed after {limit_s:.0f} s)")
        mine = [json.loads(line[len(SHARED_ROW):]) for line in outputs[0].splitlines() if line.startswith(SHARED_ROW)]
        print(f"== IRIS_HEAP_GUARD={guard}: " + ", ".join(
            f"{r['size']} kernel {r['kernel_us']:.1f} us wall {r['wall_us']:.1f} us" for r in mine), flush=True)
        if any(proc.returncode != 0 for proc in procs) or not mine:
            for p, text in enumerate(outputs):
                print(f"--- process {p} (exit {procs[p].returncode}):\n{text[-3000:]}", flush=True)
        rows += mine
    print("| size | kernel us, guard on | kernel us, guard off | on / off | wall us on / off |\n|---|---|---|---|---|")
    for size in sizes.split(","):
        on = [r for r in rows if r["size"] == size and r["guard"] == "1"]
        off = [r for r in rows if r["size"] == size and r["guard"] == "0"]
        if on and off:
            k_on, k_off = min(r["kernel_us"] for r in on), min(r["kernel_us"] for r in off)
            w_on, w_off = min(r["wall_us"] for r in on), min(r["wall_us"] for r in off)
            print(f"| {size} | {k_on:.1f} | {k_off:.1f} | {k_on / k_off if k_off else float('nan'):.3f} | "
                  f"{w_on:.1f} / {w_off:.1f} |")
    print("(one GPU shared by 2 ranks: the guard's relative kernel-time cost, not NVLink speed; best of "
          f"{rounds} runs per setting)")


def rma_one_gpu(sizes: str) -> list[dict]:
    """`rma1`'s child: this process's guard setting, each size, load and store kernels."""
    import torch
    import triton

    from benchmarks.collectives import parse_size
    from benchmarks.rma import load_persistent_kernel, store_persistent_kernel
    from iris_core.heap.cuda import CudaHeap

    largest = max(parse_size(size) for size in sizes.split(","))
    heap = CudaHeap(1, 2 * largest + (1 << 20), [0], [0])
    src_off, dst_off = heap.allocate(largest), heap.allocate(largest)
    ctx = torch.from_numpy(heap.context(0)).to("cuda:0")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for size in sizes.split(","):
        n = parse_size(size) // 4
        src = heap.torch_tensor(0, src_off, (n,), torch.float32)
        dst = heap.torch_tensor(0, dst_off, (n,), torch.float32)
        src.copy_(torch.randn(n, device="cuda:0"))
        for op, kernel, extra in (("load", load_persistent_kernel, dict(FROM=0, CACHE="")),
                                  ("store", store_persistent_kernel, dict(TO=0))):
            dst.fill_(float("nan"))
            run = lambda: kernel[(sms,)](ctx, src, dst, n, BLOCK=4096, W=1, num_warps=8, **extra)  # noqa: E731
            run()
            torch.cuda.synchronize()
            ok = bool(torch.equal(dst, src))
            us = triton.testing.do_bench(run, warmup=25, rep=200, return_mode="median") * 1e3
            rows.append(dict(guard=os.environ.get("IRIS_HEAP_GUARD", "1"), size=size, op=op, us=us, ok=ok))
    heap.close()
    return rows


def time_rma_one_gpu(sizes: str, rounds: int) -> None:
    """`rma1`: fresh processes per setting (the switch is read at import), interleaved; a table."""
    rows = []
    for guard in ("1", "0") * rounds:
        env = dict(os.environ, IRIS_HEAP_GUARD=guard, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        out = subprocess.run([sys.executable, __file__, "_rma1", "--sizes", sizes], env=env, cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
        mine = [json.loads(line[len(SHARED_ROW):]) for line in out.stdout.splitlines() if line.startswith(SHARED_ROW)]
        if out.returncode != 0 or not mine:
            print(f"--- IRIS_HEAP_GUARD={guard} (exit {out.returncode}):\n{(out.stdout + out.stderr)[-3000:]}")
        rows += mine
    print("| size | op | us, guard on | us, guard off | on / off | correct |\n|---|---|---|---|---|---|")
    for size in sizes.split(","):
        for op in ("load", "store"):
            on = [r for r in rows if (r["size"], r["op"], r["guard"]) == (size, op, "1")]
            off = [r for r in rows if (r["size"], r["op"], r["guard"]) == (size, op, "0")]
            if on and off:
                best_on, best_off = min(r["us"] for r in on), min(r["us"] for r in off)
                print(f"| {size} | {op} | {best_on:.1f} | {best_off:.1f} | {best_on / best_off:.3f} | "
                      f"{all(r['ok'] for r in on + off)} |")
    print(f"(one GPU, a heap of one rank, persistent grid of one program per SM; best of {rounds} processes per setting)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["ptx", "time", "time1", "rma1", "_measure", "_shared_rank", "_rma1"])
    parser.add_argument("--sizes", default=None, help="default 1K,64K,16M,256M (time) or 1K,64K,16M (time1)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out", "guard"))
    parser.add_argument("--calls", type=int, default=20, help="time1: chained psum calls per jit")
    parser.add_argument("--rounds", type=int, default=2, help="time1: runs per setting")
    parser.add_argument("--limit", type=float, default=45, help="time1: seconds per pair of processes")
    parser.add_argument("--process", type=int, default=0)
    parser.add_argument("--port", type=int, default=0)
    small.add_flag(parser, "compiles a psum's collective kernel and the RMA kernel for sm_90 in this process, "
                   "whatever WHAT says (`time` runs collectives.py and `rma1` rma.py's kernels: their own "
                   "--small cover those)")
    opts = parser.parse_args()
    if opts.small:
        kernels = _kernels()
        small.compile_all({name: kernels[name] for name in ("psum one-shot (push)", "rma tile (load + store)")})
    elif opts.what == "_measure":
        print(json.dumps(_measure()))
    elif opts.what == "ptx":
        print(ptx_table())
    elif opts.what == "time":
        time_psum(opts.sizes or "1K,64K,16M,256M", opts.out)
    elif opts.what == "rma1":
        time_rma_one_gpu(opts.sizes or "64K,16M,256M", opts.rounds)
    elif opts.what == "_rma1":
        for row in rma_one_gpu(opts.sizes):
            print(SHARED_ROW + json.dumps(row), flush=True)
    elif opts.what == "time1":
        time_psum_one_gpu(opts.sizes or "1K,64K,16M", opts.calls, opts.rounds, opts.limit)
    else:
        shared_rank(opts.process, opts.port, opts.sizes or "1K,64K,16M", opts.calls)


if __name__ == "__main__":
    main()
