"""Host side of a kernel launch: its constexprs by name, and the GEMM core's settings.

Every iris kernel's launch (iris_jax), its PTX benchmarks (benchmarks/kernel_ptx.py) and its
tests build the constexprs with the kernel's own builder (collectives.kernels.launch_constants,
kernels.fused.reduce_constants, ...), each a call of `kernel_constants`: a name the kernel does
not have, or one it has no value for, fails here with both lists, not deep in Triton's launch.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

VECTOR_BYTES = 16  # the widest global access of one thread (ld/st.global.v4.b32)


def vector_width(row_elements: int, itemsize: int) -> int:
    """Elements per vector access (a kernel's VEC): a VECTOR_BYTES vector of `itemsize`-byte
    elements where rows of `row_elements` keep every vector aligned, else 1."""
    width = VECTOR_BYTES // itemsize
    return width if row_elements % width == 0 else 1


def next_power_of_two(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1): a tl.arange needs one."""
    return 1 << max(n - 1, 0).bit_length()


class GemmConfig(NamedTuple):
    """The GEMM core's launch settings (iris_core.gemm.gemm): BM x BN output tiles over
    BK-deep slices of K, GROUP_M row tiles per group of the tile order (tile_coords), the dot's
    input precision PREC ("ieee" or "tf32"; 16-bit inputs ignore it), and the launch's
    num_warps and num_stages."""
    BM: int
    BN: int
    BK: int
    GROUP_M: int
    PREC: str
    num_warps: int
    num_stages: int

    def constants(self) -> dict:
        """The tile constexprs every GEMM kernel of iris_core.gemm takes."""
        return dict(BM=self.BM, BN=self.BN, BK=self.BK, GROUP_M=self.GROUP_M, PREC=self.PREC)

    def options(self) -> dict:
        """The launch options (num_warps, num_stages)."""
        return dict(num_warps=self.num_warps, num_stages=self.num_stages)


def kernel_constants(kernel, **given) -> dict:
    """`kernel`'s constexprs, every one by name (Triton's cache key joins their values alone):
    `given`, and the kernel's own default for each other one.

    Raises:
        TypeError: `given` names a constexpr the kernel lacks, or one without a default is
            missing.
    """
    import triton.language as tl  # (lazy: the host layers import GemmConfig without Triton)

    fn = getattr(kernel, "fn", kernel)  # a JITFunction (or the interpreter's) wraps the Python function
    params = inspect.signature(fn).parameters.values()
    constexprs = [p for p in params if p.annotation is tl.constexpr or p.annotation == "tl.constexpr"]
    constants = {p.name: p.default for p in constexprs if p.default is not inspect.Parameter.empty}
    constants.update(given)
    unknown = sorted(set(given) - {p.name for p in constexprs})
    missing = [p.name for p in constexprs if p.name not in constants]
    if unknown or missing:
        raise TypeError(f"{fn.__name__}'s constexprs: unknown {unknown}, missing {missing}")
    return constants
