"""What the heap guard costs: PTX instructions (no GPU needed) and psum time (GPUs).

    python benchmarks/guard_cost.py ptx            # instructions per kernel, guard on and off
    python benchmarks/guard_cost.py time [--sizes 1K,64K,16M,256M]   # GPUs: psum vs lax, guard on / off

The guard (iris_core.device.rma, IRIS_HEAP_GUARD) checks every translated access against
the heap's bounds and the rank against the world size. `ptx` compiles, for sm_90 and in a
fresh process per setting (the switch is read when iris_core.device is imported), the
collective kernel as a psum runs it (one-shot pull, push, streamed), a ring all-reduce, and
a plain RMA kernel (one tile loaded from a peer and stored to another), and counts the PTX
instructions of each (and the 16-byte global accesses, which must survive the guard).
`time` runs benchmarks/collectives.py's psum under both settings and prints its rows.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def _ptx(fn, signature, constexprs, **options) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: signature.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
    source = ASTSource(fn, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def _count(ptx: str) -> dict:
    """PTX instructions (lines ending in ';' that are not declarations) and vector accesses."""
    body = ptx[ptx.index("{"):]
    lines = [line.strip() for line in body.splitlines()]
    instructions = [line for line in lines if line.endswith(";") and not line.startswith((".", "//"))]
    return {"instructions": len(instructions),
            "v4_accesses": sum(bool(re.search(r"\b(ld|st)\.global\S*\.v4\.", i)) for i in instructions)}


def _measure() -> dict:
    """Instruction counts of the kernels, as this process's switch compiles them."""
    import triton
    import triton.language as tl

    from iris_core.collectives import kernels as C
    from iris_core.collectives.workspace import MAX_PROGRAMS, WorkspaceLayout
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
                  BLOCK=8192, CHUNK=(1 << 20) // 8, DATA=layout.data, DATA2=layout.data2,
                  DATA_BYTES=layout.data_bytes, MAX_PROGRAMS=MAX_PROGRAMS, TIMEOUT_NS=10**9, WHAT="psum",
                  HEAP_BYTES=1 << 30, VEC=4, STREAM_AT=layout.stream, STREAM_BYTES=layout.stream_capacity,
                  SENDERS=4)
    cases = {
        "psum one-shot (pull, zero-copy)": dict(VARIANT=C.ONE_SHOT, ZERO_COPY=True),
        "psum one-shot (push)": dict(VARIANT=C.ONE_SHOT, PUSH=True),
        "psum streamed": dict(VARIANT=C.ONE_SHOT, PUSH=True, STREAM=True),
        "psum ring": dict(VARIANT=C.RING),
    }
    counts = {name: _count(_ptx(C.collective_kernel, signature, dict(common, **extra), num_warps=8))
              for name, extra in cases.items()}
    counts["rma tile (load + store)"] = _count(_ptx(
        rma_kernel, {"context_ptr": "*i32", "x_ptr": "*fp32", "n": "i32", "out_ptr": "*fp32"},
        dict(W=2, BLOCK=1024), num_warps=4))
    return counts


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["ptx", "time", "_measure"])
    parser.add_argument("--sizes", default="1K,64K,16M,256M")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "out", "guard"))
    opts = parser.parse_args()
    if opts.what == "_measure":
        print(json.dumps(_measure()))
    elif opts.what == "ptx":
        print(ptx_table())
    else:
        time_psum(opts.sizes, opts.out)


if __name__ == "__main__":
    main()
