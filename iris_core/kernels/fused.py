"""GEMM + communication in one persistent kernel: tiles are produced, pushed to the ranks
that need them and flagged, while the remaining tiles are still being computed.

    matmul_reduce_kernel(SCATTER=0)   all-reduce:     out = sum over the group of A_i @ B_i
    matmul_reduce_kernel(SCATTER=1)   reduce-scatter: out = rows block `me` of that sum
    all_gather_matmul_kernel          all-gather:     out = [A_0; ...; A_{G-1}] @ B_me

Workspace: every rank keeps the same region of its heap (offset WS_OFFSET) with

    epochs  [MAX_PROGRAMS] int32, one 128-byte line each: calls this program has made
    flags   int32 [...]: flag f holds the epoch in which its data last arrived
    data    [2 parities][DATA_BYTES]: where peers push tiles (parity = epoch % 2)

Programs and waits. The grid is always the same P programs (the launcher's fixed count), so
every program's epoch equals the number of fused calls so far, identical on every rank
(SPMD). Producers *push* (remote stores, then a release flag on the consumer's heap);
consumers poll their local flags (bounded by TIMEOUT_NS) and read local memory.

* reduce kernels: tile t is computed by program t % P on every rank and consumed by program
  t % P of its consumers, so a program waits only for the same program index of its peers,
  and only after publishing everything that program index publishes before that point
  (all-reduce: consume tile i-1 after publishing tile i; reduce-scatter: each rank computes
  the other ranks' blocks first and its own block last, reducing each own tile as soon as it
  is computed). Correct with all programs resident (GPU, P <= SMs) and with programs run one
  after another (simulator).
* all-gather: programs 0..COMM-1 push this rank's A rows (row tile by row tile, with a flag
  each) and then compute own-block tiles only: they never wait. Programs COMM..P-1 wait on
  those flags of peers before computing the peers' blocks. A program thus waits only for
  lower-indexed programs of peers that never wait: no deadlock in either model.

Reuse of the parity buffers: a rank pushes into a peer's buffer of parity e % 2 in call e.
The peer read that buffer in call e - 2. In call e - 1 this rank waited on a flag the peer
raised in call e - 1 (every call consumes at least one tile from every member), and kernels
of one device run in stream order, so the peer had finished call e - 2. This holds when
consecutive fused calls use the same group (1-D meshes, or always the same axes); see
iris_jax/ops.py for the multi-axis caveat.
"""

import triton
import triton.language as tl

from iris_core.device import Context, global_timer
from iris_core.device.nvidia import peer_timeout
from iris_core.kernels.gemm import aligned_rows, store_tile, tile_coords, tile_gemm

LINE: tl.constexpr = tl.constexpr(128)


@triton.jit
def _prologue(ctx, WS_OFFSET: tl.constexpr):
    """(workspace base address, my epoch pointer, this call's epoch)."""
    pid = tl.program_id(0)
    ws_base = tl.load(ctx.heap_bases + ctx.rank) + WS_OFFSET
    epoch_ptr = tl.cast(ws_base + pid * LINE, tl.pointer_type(tl.int32))
    # kept in a register for the whole call (an L1 re-read could differ between threads)
    epoch = tl.load(epoch_ptr, volatile=True) + 1
    return ws_base, epoch_ptr, epoch


@triton.jit
def _epilogue(epoch_ptr, epoch):
    tl.debug_barrier()  # every thread is done with the epoch before it is published locally
    tl.store(epoch_ptr, epoch)


@triton.jit
def _wait(flag_ptr, epoch, who, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """Waits until my local flag reaches `epoch` (pushed by rank `who`), then acquires."""
    start = global_timer()
    seen = tl.load(flag_ptr, volatile=True)
    while seen < epoch:
        if global_timer() - start > TIMEOUT_NS:
            peer_timeout(WHAT, who)
        seen = tl.load(flag_ptr, volatile=True)
    tl.atomic_add(flag_ptr, 0, sem="acquire", scope="sys")
    tl.debug_barrier()


@triton.jit
def _slot(data, index, offs, BN: tl.constexpr):
    """The BM x BN tile slot `index` of a data buffer (rows of BN elements, vector aligned)."""
    return aligned_rows(data, index * offs.shape[0] * BN + offs, BN * (data.dtype.element_ty.primitive_bitwidth // 8),
                        BN)


@triton.jit
def _push(ctx, ptrs, value, rank, ROW_BYTES: tl.constexpr, mask=None):
    """Stores `value` (a row-major tile, rows ROW_BYTES apart) through my-heap pointers `ptrs`
    into `rank`'s heap, declared vector aligned when ROW_BYTES allows (16-element runs on
    16-byte boundaries), so the tile crosses the link in 16-byte stores, not 2-byte ones."""
    if ROW_BYTES % 16 == 0:
        ctx.store(ptrs, value, to_rank=rank, mask=mask, hint=(1, 16))
    else:
        ctx.store(ptrs, value, to_rank=rank, mask=mask)


@triton.jit
def _consume_all(data, flags, group_ptr, l, epoch, offs, out_ptr, M, N, TB, tiles_m, tiles_n,
                 G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr,
                 TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """All-reduce: out tile l = sum of every member's pushed tile l (members in order, so
    every rank gets bit-identical results)."""
    pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
    total = tl.zeros((BM, BN), dtype=tl.float32)
    for i in tl.static_range(G):
        _wait(flags + l * G + i, epoch, tl.load(group_ptr + 1 + i), TIMEOUT_NS, WHAT)
        total += tl.load(_slot(data, i * TB + l, offs, BN), cache_modifier=".cg").to(tl.float32)
    store_tile(out_ptr, total.to(out_ptr.dtype.element_ty), pid_m, pid_n, M, N, N, 1, BM, BN)


@triton.jit
def matmul_reduce_kernel(context_ptr, group_ptr, a_ptr, b_ptr, out_ptr,
                         M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                         stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr,
                         stride_bn: tl.constexpr, SCATTER: tl.constexpr, G: tl.constexpr,
                         WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         GROUP_M: tl.constexpr, PREC: tl.constexpr, WS_OFFSET: tl.constexpr,
                         FLAGS: tl.constexpr, DATA: tl.constexpr, DATA_BYTES: tl.constexpr,
                         TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """A is (NB * M) x K with NB = G if SCATTER else 1, B is K x N; C = A @ B is split into NB
    row blocks of M rows. SCATTER=0: out (M x N) = sum over members of C. SCATTER=1: out
    (M x N) = sum over members of C's block `me`.

    Pushed tiles land in the consumer's data buffer at slot [source member][tile in block]
    (BM x BN contiguous), flag [tile in block][source member]."""
    ctx = Context.initialize(context_ptr, WORLD)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    me = tl.load(group_ptr)
    ws_base, epoch_ptr, epoch = _prologue(ctx, WS_OFFSET)
    data = tl.cast(ws_base + DATA + (epoch % 2).to(tl.uint64) * DATA_BYTES, out_ptr.dtype)
    flags = tl.cast(ws_base + FLAGS, tl.pointer_type(tl.int32))
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    TB = tiles_m * tiles_n
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    out_dtype = out_ptr.dtype.element_ty
    prev = pid * 0 - 1
    NB: tl.constexpr = G if SCATTER else 1
    for bi in range(NB):
        block = (me + 1 + bi) % NB  # reduce-scatter: others' blocks first, mine last
        first = block * TB
        l0 = (pid - first % programs + programs) % programs  # first local tile of mine: (first + l) % P == pid
        a_block = a_ptr + block * M * stride_am
        for l in range(l0, TB, programs):
            pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
            acc = tile_gemm(a_block, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                            BM, BN, BK, K % BK == 0, PREC, False)
            slot = _slot(data, me * TB + l, offs, BN)
            if SCATTER:
                if block == me:  # reduce my tile now: my part from registers, the others' pushed
                    total = tl.zeros((BM, BN), dtype=tl.float32)
                    for i in tl.static_range(G):
                        if i == me:
                            total += acc
                        else:
                            _wait(flags + l * G + i, epoch, tl.load(group_ptr + 1 + i), TIMEOUT_NS, WHAT)
                            total += tl.load(_slot(data, i * TB + l, offs, BN), cache_modifier=".cg").to(tl.float32)
                    store_tile(out_ptr, total.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
                else:
                    dest = tl.load(group_ptr + 1 + block)
                    _push(ctx, slot, acc.to(out_dtype), dest, BN * (out_dtype.primitive_bitwidth // 8))
                    tl.debug_barrier()
                    ctx.atomic_xchg(flags + l * G + me, epoch, to_rank=dest, sem="release", scope="sys")
            else:
                value = acc.to(out_dtype)
                for i in tl.static_range(G):
                    _push(ctx, slot, value, tl.load(group_ptr + 1 + i), BN * (out_dtype.primitive_bitwidth // 8))
                tl.debug_barrier()
                for i in tl.static_range(G):
                    ctx.atomic_xchg(flags + l * G + me, epoch, to_rank=tl.load(group_ptr + 1 + i),
                                    sem="release", scope="sys")
                if prev >= 0:  # reduce the previous tile while peers finish this one
                    _consume_all(data, flags, group_ptr, prev, epoch, offs, out_ptr, M, N, TB, tiles_m, tiles_n,
                                 G, BM, BN, GROUP_M, TIMEOUT_NS, WHAT)
                prev = l
    if not SCATTER:
        if prev >= 0:
            _consume_all(data, flags, group_ptr, prev, epoch, offs, out_ptr, M, N, TB, tiles_m, tiles_n,
                         G, BM, BN, GROUP_M, TIMEOUT_NS, WHAT)
    _epilogue(epoch_ptr, epoch)


@triton.jit
def all_gather_matmul_kernel(context_ptr, group_ptr, a_ptr, b_ptr, out_ptr,
                             M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                             stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr,
                             stride_bn: tl.constexpr, G: tl.constexpr, WORLD: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr,
                             GROUP_M: tl.constexpr, PREC: tl.constexpr, COMM: tl.constexpr,
                             WS_OFFSET: tl.constexpr, FLAGS: tl.constexpr, DATA: tl.constexpr,
                             DATA_BYTES: tl.constexpr, TIMEOUT_NS: tl.constexpr, WHAT: tl.constexpr):
    """A is my M x K block, B is K x N; out ((G * M) x N) = [A_0; ...; A_{G-1}] @ B.

    Every rank's data buffer holds the gathered A ((G * M) x K, row-major); flag
    [source member][row tile] says that row tile of that member has arrived."""
    ctx = Context.initialize(context_ptr, WORLD)
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    me = tl.load(group_ptr)
    ws_base, epoch_ptr, epoch = _prologue(ctx, WS_OFFSET)
    gathered = tl.cast(ws_base + DATA + (epoch % 2).to(tl.uint64) * DATA_BYTES, a_ptr.dtype)
    flags = tl.cast(ws_base + FLAGS, tl.pointer_type(tl.int32))
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    TB = tiles_m * tiles_n
    out_dtype = out_ptr.dtype.element_ty
    # 1. communication programs push my rows to every peer, one flagged row tile at a time
    if G > 1:
        if pid < COMM:
            for i in range(pid, tiles_m, COMM):
                rows = i * BM + tl.arange(0, BM)
                rmask = rows < M
                for k0 in range(0, K, BKC):
                    cols = k0 + tl.arange(0, BKC)
                    mask = rmask[:, None] & (cols < K)[None, :]
                    value = tl.load(a_ptr + rows[:, None] * stride_am + cols[None, :] * stride_ak, mask=mask)
                    dst = gathered + (me * M + rows)[:, None] * K + cols[None, :]
                    for j in tl.static_range(G):
                        if j != me:
                            _push(ctx, dst, value, tl.load(group_ptr + 1 + j),
                                  K * (a_ptr.dtype.element_ty.primitive_bitwidth // 8), mask)
                tl.debug_barrier()
                for j in tl.static_range(G):
                    if j != me:
                        ctx.atomic_xchg(flags + me * tiles_m + i, epoch, to_rank=tl.load(group_ptr + 1 + j),
                                        sem="release", scope="sys")
    # 2. my own block, from my A directly: every program, no waiting
    for l in range(pid, TB, programs):
        pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
        acc = tile_gemm(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BM, BN, BK, K % BK == 0, PREC, False)
        store_tile(out_ptr + me * M * N, acc.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
    # 3. the peers' blocks, as their row tiles arrive: compute programs only
    if G > 1:
        if pid >= COMM:
            for bi in range(1, G):
                s = (me + bi) % G
                source = tl.load(group_ptr + 1 + s)
                a_s = gathered + s * M * K
                for l in range(pid - COMM, TB, programs - COMM):
                    pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
                    _wait(flags + s * tiles_m + pid_m, epoch, source, TIMEOUT_NS, WHAT)
                    acc = tile_gemm(a_s, b_ptr, pid_m, pid_n, M, N, K, K, 1, stride_bk, stride_bn,
                                    BM, BN, BK, K % BK == 0, PREC, True)
                    store_tile(out_ptr + s * M * N, acc.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
    _epilogue(epoch_ptr, epoch)
