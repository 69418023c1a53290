"""Tile-level Context collectives on 2 GPUs (iris_core alone: a CUDA heap driven from torch,
no JAX), against numpy; the same kernels and expectations as tests/core/test_tile_collectives.py.
Run: pytest -m gpu (its own process: it needs GPU memory that JAX would otherwise preallocate)."""

import numpy as np
import pytest

from tests.core import tile_kernels as K
from tests.core.test_tile_collectives import expected

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]  # one GPU: test_gpu_shared.py stands in

W, M, N, BM, BN = 2, 300, 517, 64, 64  # partial tiles at both edges; 5 x 9 programs, all resident


@pytest.fixture(scope="module")
def heap():
    import torch

    from iris_core.heap.cuda import CudaHeap

    if torch.cuda.device_count() < W:
        pytest.fail(f"needs {W} GPUs (the gpu tests never skip)")
    heap = CudaHeap(W, 64 << 20, list(range(W)), list(range(W)))
    yield heap
    heap.close()


@pytest.mark.parametrize("op", [K.ATOMIC, K.SPINLOCK, K.ONE_SHOT, K.TWO_SHOT, K.REDUCE_SCATTER,
                                K.ALL_GATHER_ROWS, K.ALL_GATHER_COLS, K.GATHER, K.ALL_TO_ALL])
def test_tile_collective_on_gpus(heap, op):
    import torch

    n = W * BN if op == K.ALL_TO_ALL else N
    npr = BN
    dst_shape = (W * M, n) if op == K.ALL_GATHER_ROWS else (M, W * n) if op == K.ALL_GATHER_COLS else (M, n)
    offsets = [heap.allocate(4 * M * n), heap.allocate(4 * M * n), heap.allocate(4 * int(np.prod(dst_shape))),
               heap.allocate(4 * 4096)]
    try:
        xs = [np.arange(M * n, dtype=np.float32).reshape(M, n) * (r + 1) + r / 10 for r in range(W)]
        views = []
        for r in range(W):
            x = heap.torch_tensor(r, offsets[0], (M, n), torch.float32)
            src = heap.torch_tensor(r, offsets[1], (M, n), torch.float32)
            dst = heap.torch_tensor(r, offsets[2], dst_shape, torch.float32)
            locks = heap.torch_tensor(r, offsets[3], (4096,), torch.int32)
            x.copy_(torch.from_numpy(xs[r]))
            src.fill_(float("nan"))
            dst.fill_(0.0 if op in (K.ATOMIC, K.SPINLOCK) else -7.0)
            locks.zero_()
            views.append((torch.from_numpy(heap.context(r)).to(f"cuda:{r}"), x, src, dst, locks))
        for r in range(W):  # every rank's buffers are ready before any kernel starts
            torch.cuda.synchronize(r)
        grid = (-(-M // BM), -(-n // BN))
        for r in range(W):  # both kernels run at once (their programs wait on each other)
            with torch.cuda.device(r):
                K.tile_collective[grid](*views[r], M, n, 1, OP=op, W=W, BM=BM, BN=BN, NPR=npr, num_warps=4)
        for r in range(W):
            torch.cuda.synchronize(r)
        for r in range(W):
            np.testing.assert_allclose(views[r][3].cpu().numpy(), expected(op, xs, r, BM, BN, npr), rtol=1e-6,
                                       err_msg=f"rank {r}")
    finally:
        for offset in offsets:
            heap.free(offset)
