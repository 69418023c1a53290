"""Tile and tensor views used by tile-level collectives and fused kernels.

`TensorView` describes a 2-D row-major-or-strided matrix; `TileView` a BLOCK_M x BLOCK_N
tile position in it; `Tile` a TileView plus the tile's data.
"""

import triton
import triton.language as tl

from iris_core.compat import aggregate


@aggregate
class TileView:
    """The position of a BLOCK_M x BLOCK_N tile in a matrix.

    Attributes:
      pid_m: the tile's row index (in tiles).
      pid_n: the tile's column index (in tiles).
      block_m: rows per tile (a constexpr).
      block_n: columns per tile (a constexpr).
    """

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)


@aggregate
class Tile:
    """A tile's position (as `TileView`) and its data.

    Attributes:
      pid_m: the tile's row index (in tiles).
      pid_n: the tile's column index (in tiles).
      block_m: rows per tile (a constexpr).
      block_n: columns per tile (a constexpr).
      data: the block_m x block_n values.
    """

    pid_m: tl.tensor
    pid_n: tl.tensor
    block_m: tl.constexpr
    block_n: tl.constexpr
    data: tl.tensor

    @triton.constexpr_function
    def __init__(self, pid_m, pid_n, block_m, block_n, data):
        self.pid_m = pid_m
        self.pid_n = pid_n
        self.block_m = tl.constexpr(block_m)
        self.block_n = tl.constexpr(block_n)
        self.data = data


@triton.constexpr_function
def _field(value):
    """Sizes and strides may be tensors or compile-time constants (jax-triton turns a scalar
    argument equal to 1 into a constant)."""
    return value if isinstance(value, tl.tensor) else tl.constexpr(value)


@aggregate
class TensorView:
    """A 2-D matrix in memory (row-major or strided), which tiles index into.

    Attributes:
      ptr: pointer to element (0, 0).
      M: rows.
      N: columns.
      stride_m: elements between two rows.
      stride_n: elements between two columns.
    """

    ptr: tl.tensor
    M: tl.tensor | tl.constexpr
    N: tl.tensor | tl.constexpr
    stride_m: tl.tensor | tl.constexpr
    stride_n: tl.tensor | tl.constexpr

    @triton.constexpr_function
    def __init__(self, ptr, M, N, stride_m, stride_n):
        self.ptr = ptr
        self.M = _field(M)
        self.N = _field(N)
        self.stride_m = _field(stride_m)
        self.stride_n = _field(stride_n)

    @triton.jit
    def tile_ptr(self, tile):
        """(pointers, mask) of `tile`'s elements in this tensor."""
        rm = tile.pid_m * tile.block_m + tl.arange(0, tile.block_m)
        rn = tile.pid_n * tile.block_n + tl.arange(0, tile.block_n)
        ptrs = self.ptr + rm[:, None] * self.stride_m + rn[None, :] * self.stride_n
        mask = (rm[:, None] < self.M) & (rn[None, :] < self.N)
        return ptrs, mask

    @triton.jit
    def offset_tile_ptr(self, tile, offset_m, offset_n, src_mask):
        """Pointers of `tile` shifted by (offset_m, offset_n) rows/columns, with `src_mask`."""
        rm = tile.pid_m * tile.block_m + tl.arange(0, tile.block_m) + offset_m
        rn = tile.pid_n * tile.block_n + tl.arange(0, tile.block_n) + offset_n
        ptrs = self.ptr + rm[:, None] * self.stride_m + rn[None, :] * self.stride_n
        return ptrs, src_mask
