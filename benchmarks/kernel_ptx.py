"""The sm_90 PTX of iris's kernels, compiled on any machine (no GPU): the collective kernel over a
matrix of its configurations, the fused GEMM ops, the device barrier, ragged_all_to_all and the
tile-level collectives.

    python benchmarks/kernel_ptx.py > before.json   # then change the kernel
    python benchmarks/kernel_ptx.py --compare before.json

For each configuration (kind, variant, path, group size, dtype, tracing): the instruction count,
16-byte accesses, and a fingerprint of the instruction sequence with registers, labels and
names left out. A refactor that keeps every fingerprint compiles to the same code.
"""

import argparse
import hashlib
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TRITON_INTERPRET", "0")

from benchmarks import small  # noqa: E402
from benchmarks.small import compile_ptx, count_instructions  # noqa: E402


def _fingerprint(ptx: str) -> str:
    body = ptx[ptx.index("{"):]
    ops = []
    for line in body.splitlines():
        line = line.strip()
        if line.endswith(";") and not line.startswith((".", "//")):
            line = re.sub(r"%\w+|\$\w+|\b\w*_param_\d+\b", "R", line)  # registers, labels, parameter names
            ops.append(line)
    return hashlib.sha256("\n".join(ops).encode()).hexdigest()[:16]


def _memory(ptx: str) -> dict:
    """How the kernel touches memory: each kind of global load / store (vector width, acquire),
    atomic (op, semantics, scope) and fence, counted, and whether it prints (vprintf) or traps."""
    ops = re.findall(r"\b(?:(?:ld|st)(?:\.acquire\.sys)?\.global[a-z0-9.]*|(?:atom|red)\.[a-z0-9._]+|membar\.[a-z]+|"
                     r"fence\.(?:acq_rel|sc|acquire|release)[a-z0-9.]*)", ptx)
    counts = {op: ops.count(op) for op in sorted(set(ops))}
    return dict(counts, vprintf="vprintf" in ptx, trap="trap;" in ptx)


def cases() -> dict:
    from iris_core.collectives import kernels as C

    out = {}
    for kind, name in [(C.ALL_REDUCE, "all_reduce"), (C.ALL_GATHER, "all_gather"),
                       (C.REDUCE_SCATTER, "reduce_scatter"), (C.ALL_TO_ALL, "all_to_all"),
                       (C.PPERMUTE, "ppermute"), (C.BROADCAST, "broadcast")]:
        paths = {"pull": {}, "zero_copy": dict(ZERO_COPY=True), "push": dict(PUSH=True)}
        if kind in (C.ALL_REDUCE, C.ALL_GATHER, C.REDUCE_SCATTER, C.ALL_TO_ALL):
            paths["stream"] = dict(PUSH=True, STREAM=True)
        for path, extra in paths.items():
            out[f"{name} {path} G4"] = dict(KIND=kind, VARIANT=C.ONE_SHOT, G=4, **extra)
        out[f"{name} pull G2 bf16"] = dict(KIND=kind, VARIANT=C.ONE_SHOT, G=2, dtype="bf16")
    for variant, name in [(C.TWO_SHOT, "two_shot"), (C.ATOMIC, "atomic"), (C.SPINLOCK, "spinlock"),
                          (C.RING, "ring")]:
        out[f"all_reduce {name} G4"] = dict(KIND=C.ALL_REDUCE, VARIANT=variant, G=4)
        out[f"all_reduce {name} G2 zero_copy"] = dict(KIND=C.ALL_REDUCE, VARIANT=variant, G=2, ZERO_COPY=True)
    out["all_reduce pull G4 max"] = dict(KIND=C.ALL_REDUCE, VARIANT=C.ONE_SHOT, G=4, OP=C.MAX)
    # every dtype the kernels take (iris_jax.collectives.dtypes.KERNEL_DTYPES; others travel as one of them)
    for dtype in ("fp16", "fp64", "i8", "u8", "i16", "u16", "u32", "i64", "u64"):
        out[f"all_reduce pull G4 {dtype}"] = dict(KIND=C.ALL_REDUCE, VARIANT=C.ONE_SHOT, G=4, dtype=dtype)
        out[f"all_reduce pull G4 max {dtype}"] = dict(KIND=C.ALL_REDUCE, VARIANT=C.ONE_SHOT, G=4, OP=C.MAX, dtype=dtype)
        out[f"reduce_scatter stream G4 {dtype}"] = dict(KIND=C.REDUCE_SCATTER, VARIANT=C.ONE_SHOT, G=4, PUSH=True,
                                                        STREAM=True, dtype=dtype)
        out[f"all_gather push G4 {dtype}"] = dict(KIND=C.ALL_GATHER, VARIANT=C.ONE_SHOT, G=4, PUSH=True, dtype=dtype)
    for variant, name in [(C.TWO_SHOT, "two_shot"), (C.SPINLOCK, "spinlock"), (C.RING, "ring")]:
        for dtype in ("bf16", "fp64", "u8"):
            out[f"all_reduce {name} G4 {dtype}"] = dict(KIND=C.ALL_REDUCE, VARIANT=variant, G=4, dtype=dtype)
    out["all_reduce push G4 traced"] = dict(KIND=C.ALL_REDUCE, VARIANT=C.ONE_SHOT, G=4, PUSH=True, TRACING=True)
    out["all_reduce two_shot G4 traced"] = dict(KIND=C.ALL_REDUCE, VARIANT=C.TWO_SHOT, G=4, TRACING=True)
    return out


def _tile_kernel():
    """A kernel of one tile-level collective (iris_core.device.tile_collectives), OP choosing which."""
    import triton
    import triton.language as tl

    from iris_core.device import Context, TensorView, Tile

    @triton.jit
    def tile_collective(context_ptr, x_ptr, src_ptr, dst_ptr, locks_ptr, M, N, OP: tl.constexpr, W: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr):
        ctx = Context.initialize(context_ptr, W)
        x = TensorView(x_ptr, M, N, N, 1)
        ptrs, mask = x.tile_ptr(Tile(tl.program_id(0), tl.program_id(1), BM, BN, tl.zeros((BM, BN), tl.float32)))
        tile = Tile(tl.program_id(0), tl.program_id(1), BM, BN, tl.load(ptrs, mask=mask, other=0))
        src, dst = TensorView(src_ptr, M, N, N, 1), TensorView(dst_ptr, M, N, N, 1)
        if OP == 0:
            ctx.all_reduce_atomic(tile, dst)
        elif OP == 1:
            ctx.all_reduce_spinlock(tile, dst, locks_ptr)
        elif OP == 2:
            ctx.all_reduce_one_shot(tile, src, dst, locks_ptr)
        elif OP == 3:
            ctx.all_reduce_two_shot(tile, src, dst, locks_ptr)
        elif OP == 4:
            ctx.reduce_scatter(tile, src, dst, locks_ptr)
        elif OP == 5:
            ctx.all_gather(tile, TensorView(dst_ptr, W * M, N, N, 1), 0)
        elif OP == 6:
            out_ptrs, out_mask = dst.tile_ptr(tile)
            tl.store(out_ptrs, ctx.gather(tile, x, (ctx.rank + 1) % W), mask=out_mask)
        else:
            ctx.all_to_all(tile, x, dst, N // W)

    return tile_collective


TILE_OPS = ("all_reduce_atomic", "all_reduce_spinlock", "all_reduce_one_shot", "all_reduce_two_shot",
            "reduce_scatter", "all_gather", "gather", "all_to_all")


def other_kernels() -> dict:
    """name -> (kernel, signature, constexprs, options) of the kernels besides the collective
    kernel, with the constexprs their launch sites pass (iris_jax.ops, iris_jax.device_barrier, the
    ragged_all_to_all rule): the fused GEMM ops, the device barrier, ragged_all_to_all; and the
    tile-level collectives, each in a kernel of one tile as a user would write it."""
    from iris_core.collectives import ragged
    from iris_core.collectives.workspace import FusedLayout, WorkspaceLayout
    from iris_core.device.barrier import barrier_kernel
    from iris_core.device.barrier import launch_constants as barrier_constants
    from iris_core.gemm import fused as F
    from iris_core.launch import GemmConfig

    out = {}
    fused = FusedLayout(64 << 20, 1 << 12, 8)
    gemm = GemmConfig(BM=128, BN=256, BK=64, GROUP_M=8, PREC="tf32", num_warps=8, num_stages=3)  # bf16 on GPUs
    waits = dict(layout=fused, poll_ns=500, timeout_ns=10**9)
    pointers = {"context_ptr": "*i32", "group_ptr": "*i32", "a_ptr": "*bf16", "b_ptr": "*bf16", "out_ptr": "*bf16"}
    M, N, K = 1024, 4096, 2048
    for G in (2, 4):
        for scatter in (0, 1):
            name = f"fused matmul_{'reduce_scatter' if scatter else 'all_reduce'} G{G} bf16"
            out[name] = (F.matmul_reduce_kernel, pointers,
                         F.reduce_constants(M=M, N=N, K=K, scatter=scatter, G=G, world=G, gemm=gemm,
                                            gemm_programs=116, what=name, **waits), gemm.options())
        name = f"fused all_gather_matmul G{G} bf16"
        out[name] = (F.all_gather_matmul_kernel, pointers,
                     F.gather_constants(M=M, N=N, K=K, G=G, world=G, gemm=gemm, comm_programs=8, what=name, **waits),
                     gemm.options())
    for W in (2, 8):
        for tracing in (False, True):
            out[f"device_barrier W{W}{' traced' if tracing else ''}"] = (
                barrier_kernel, {"context_ptr": "*i32", "after_ptr": "*i32", "status_ptr": "*i32"},
                barrier_constants(area_offset=1 << 20, timeout_ns=10**9, world=W, tracing=tracing), dict(num_warps=4))
    layout = WorkspaceLayout(4, 1 << 20)
    ints = {n: "*i32" for n in ("context_ptr", "group_ptr", "in_offsets", "sizes", "out_offsets")}
    for G, slices in ((2, 1), (4, 2)):
        out[f"ragged_all_to_all G{G} slices {slices} bf16"] = (
            ragged.ragged_kernel, dict(ints, x_ptr="*bf16", output_ptr="*bf16", out_ptr="*bf16", N="i32", M="i32",
                                       R="i32", ROWS="i32"),
            ragged.launch_constants(G=G, world=G, slices=slices, block=4096, layout=layout, timeout_ns=10**9, vec=8),
            dict(num_warps=8))
    tile = _tile_kernel()
    signature = {"context_ptr": "*i32", "x_ptr": "*fp32", "src_ptr": "*fp32", "dst_ptr": "*fp32",
                 "locks_ptr": "*i32", "M": "i32", "N": "i32"}
    for op, name in enumerate(TILE_OPS):
        out[f"tile {name} W4"] = (tile, signature, dict(OP=op, W=4, BM=64, BN=64), dict(num_warps=4))
    return out


_NUMPY_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp64": "float64", "i8": "int8",
                "u8": "uint8", "i16": "int16", "u16": "uint16", "i32": "int32", "u32": "uint32", "i64": "int64",
                "u64": "uint64"}

# --small: one configuration of each kernel, exactly as named
SMALL = ("all_reduce pull G2 bf16", "fused matmul_all_reduce G2 bf16", "fused all_gather_matmul G2 bf16",
         "device_barrier W2", "ragged_all_to_all G2 slices 1 bf16", "tile all_gather W4")


def _chosen(name: str, only: str | None, names: tuple[str, ...] | None) -> bool:
    return (not only or only in name) and (names is None or name in names)


def measure(only: str | None = None, names: tuple[str, ...] | None = None) -> dict:
    import triton.language as tl

    from iris_core.collectives import kernels as C
    from iris_core.collectives import kinds
    from iris_core.collectives.workspace import WorkspaceLayout

    results = {}
    for name, (kernel, signature, constexprs, options) in other_kernels().items():
        if _chosen(name, only, names):
            ptx = compile_ptx(kernel, signature, constexprs, **options)
            results[name] = dict(count_instructions(ptx), fingerprint=_fingerprint(ptx), memory=_memory(ptx))
    for name, case in cases().items():
        if not _chosen(name, only, names):
            continue
        case = dict(case)
        G = case.pop("G")
        dtype = case.pop("dtype", "fp32")
        itemsize = int(dtype.lstrip("fpiub")) // 8
        blocks = G if case["KIND"] in (C.REDUCE_SCATTER, C.ALL_TO_ALL) else 1
        out_blocks = G if case["KIND"] in (C.ALL_GATHER, C.ALL_TO_ALL) else 1
        layout = WorkspaceLayout(G, 1 << 20)
        signature = {"context_ptr": "*i32", "group_ptr": "*i32", "x_ptr": f"*{dtype}", "m": "i32",
                     "out_ptr": f"*{dtype}"}
        accumulator = getattr(tl, kinds.accumulator(_NUMPY_NAMES[dtype]))
        common = dict(OP=C.SUM, G=G, WORLD=G, XB=blocks, OB=out_blocks, SOURCES=tuple((i + 1) % G for i in range(G)),
                      ACC=accumulator, BLOCK=4096, CHUNK=(1 << 20) // (4 * blocks), REGIONS=layout.regions,
                      TIMEOUT_NS=10**9, WHAT="collective", HEAP_BYTES=1 << 30, VEC=16 // itemsize, SENDERS=4)
        constexprs = C.launch_constants(**(common | case))
        ptx = compile_ptx(C.collective_kernel, signature, constexprs, num_warps=8)
        results[name] = dict(count_instructions(ptx), fingerprint=_fingerprint(ptx), memory=_memory(ptx))
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", help="a JSON file of an earlier run: print what changed")
    parser.add_argument("--only", help="configurations whose name contains this")
    small.add_flag(parser, "one configuration of each kernel (" + ", ".join(SMALL) + ")")
    args = parser.parse_args()
    now = measure(args.only, SMALL if args.small else None)
    if not args.compare:
        print(json.dumps(now, indent=1))
        return
    before = json.load(open(args.compare))
    same = same_memory = 0
    for name, result in now.items():
        old = before.get(name)
        if old == result:
            same += 1
            same_memory += 1
            continue
        was = f"{old['instructions']} ({old['fingerprint']})" if old else "absent"
        print(f"{name}: {was} -> {result['instructions']} ({result['fingerprint']}), "
              f"16-byte accesses {old and old['v4_accesses']} -> {result['v4_accesses']}")
        if old and old.get("memory") == result["memory"]:
            same_memory += 1
        elif old:
            changed = {k: (old.get("memory", {}).get(k), v) for k, v in result["memory"].items()
                       if old.get("memory", {}).get(k) != v}
            print(f"  memory operations changed: {changed}")
    print(f"{same} of {len(now)} configurations compile to the same instructions, {same_memory} to the same "
          "memory operations (each kind of load, store, atomic and fence, counted; prints; traps)")


if __name__ == "__main__":
    main()
