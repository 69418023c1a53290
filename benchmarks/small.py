"""Every benchmark script's small mode (`--small`): what CI runs (tests/test_benchmarks.py), so
that a change to a kernel's or the API's signature cannot break a script unseen.

A script that measures through JAX runs a tiny correctness pass on the CPU simulator (no
timings); a script whose kernels run only on GPUs (torch launches, inline PTX) compiles them for
sm_90 on the CPU, with the constexprs its launch passes (no GPU needed).
"""

from __future__ import annotations

import os
import re

HELP = "a tiny run that needs no GPU (CI runs it): "


def add_flag(parser, what: str) -> None:
    """Adds `--small` to a script's parser; `what` says what its small mode does."""
    parser.add_argument("--small", action="store_true", help=HELP + what)


def use_simulator(ranks: int = 2) -> None:
    """Before jax is imported: JAX on the CPU with `ranks` devices, so iris runs on its simulator."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={ranks}".strip()


def compile_ptx(kernel, signature: dict, constexprs: dict, **options) -> str:
    """`kernel`'s PTX for sm_90, compiled here (no GPU needed). `signature`: Triton types of the
    run-time arguments by name ("*fp32", "i32"); every other argument is a constexpr, given in
    `constexprs` or left at its default; pointers are declared 16-byte aligned (as jax-triton
    and torch launches pass them); `options`: num_warps, num_stages. Needs a process in which
    Triton's interpreter is off (TRITON_INTERPRET unset or 0 when the kernel was defined)."""
    import triton
    from triton.compiler import ASTSource

    from iris_core.platform import GPU

    names = kernel.arg_names
    sig = {n: signature.get(n, "constexpr") for n in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(names) if sig[n].startswith("*")}
    source = ASTSource(kernel, sig, constexprs={(names.index(k),): v for k, v in constexprs.items()}, attrs=attrs)
    return triton.compile(source, target=GPU.triton_target(90), options=options).asm["ptx"]


def count_instructions(ptx: str) -> dict:
    """PTX instructions (lines ending in ';' that are not declarations) and 16-byte accesses."""
    body = ptx[ptx.index("{"):]
    lines = [line.strip() for line in body.splitlines()]
    instructions = [line for line in lines if line.endswith(";") and not line.startswith((".", "//"))]
    return {"instructions": len(instructions),
            "v4_accesses": sum(bool(re.search(r"\b(ld|st)\.global\S*\.v4\.", i)) for i in instructions)}


def compile_all(kernels: dict) -> None:
    """Compiles name -> (kernel, signature, constexprs, options) for sm_90 and prints each one's
    instruction count: a small mode's check that the launches still match the kernels."""
    for name, (kernel, signature, constexprs, options) in kernels.items():
        counts = count_instructions(compile_ptx(kernel, signature, constexprs, **options))
        print(f"{name}: sm_90 PTX, {counts['instructions']} instructions", flush=True)
