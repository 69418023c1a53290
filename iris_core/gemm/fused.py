"""GEMM + communication in one persistent kernel: tiles are produced and flagged, and
moved to the ranks that need them while the remaining tiles are still being computed.

    matmul_reduce_kernel(SCATTER=0)   all-reduce:     out = sum over the group of A_i @ B_i
    matmul_reduce_kernel(SCATTER=1)   reduce-scatter: out = rows block `me` of that sum
    all_gather_matmul_kernel          all-gather:     out = [A_0; ...; A_{G-1}] @ B_me

Workspace: the fused part of the group's partition workspace (iris_jax._runtime.workspace; its heap
offset is in the group row, the layout is iris_core.collectives.workspace.FusedLayout):

    epochs  [MAX_PROGRAMS] int32, one 128-byte line each: calls this program has made
    members [W] at MEMBERS: line i = [the last epoch member i announced, or POISON + the epoch
            in which it gave up; its call's signature in even epochs, in odd epochs]
    flags   int32 [...] at FLAGS: flag f holds the epoch in which its data was last published
    data    [2 parities][DATA_BYTES] at DATA: tiles (parity = epoch % 2)

Calls that differ, and calls after a give-up. Program 0 announces each call on every member:
its signature (kind, dtype, group size, and a hash of M, N and K), then the epoch. Before its
first wait on a peer's tile, a program checks every member's announcement (`_check_members`,
bounded like every wait): a member that never came fails it with PeerTimeoutError, one whose
call differs with RankMismatchError (nothing of that member is read), one that gave up before
with PeerFailedError. A program that gives up (there, or waiting for a tile) writes its
signature and POISON + the epoch into its rank's line on every member, so that the members'
later calls, and its own rank's, fail at once instead of pairing with calls whose epochs no
longer agree.

Programs and waits. The grid is always the same P programs (the launcher's fixed count), so
every program's epoch equals the number of fused calls over this partition so far,
identical on every member (SPMD). Every wait is bounded by TIMEOUT_NS.

* reduce kernels *pull*, on their own SMs. The GEMM programs write each C tile into their
  own heap and release a flag into the heap of every member that reduces it; they never
  wait, so the GEMM runs at full speed. The communication programs (the other SMs) poll
  their local flags and pull each member's tile over the link, summing in member order.
  Pushing the data from the GEMM programs instead (the first design) stalled the tensor
  cores: every program finished its tile in the same wave, then waited while the link
  drained 132 tiles at once. Only each GEMM program's last round of tiles (nothing is left
  to overlap with) is reduced by the GEMM program itself: it waits for the same program
  index of its peers, which computes the same tile and never waits before publishing it.
* all-gather pushes: programs 0..COMM-1 push this rank's A rows (row tile by row tile, with
  a flag each on the peer) and then compute own-block tiles only: they never wait. Programs
  COMM..P-1 poll their local flags before computing the peers' blocks.

A program thus only waits for programs that never wait before publishing (or, for the
tail, for their own publication), and for program 0's announcement, which comes before
anything else: all programs resident (GPU, P <= SMs) or run one after another in index order
(simulator), nothing deadlocks.

No printing in these kernels: a `tl.device_print` (an extern call) makes ptxas serialize
every wgmma of the kernel. A timeout writes a fault record naming the op and the rank
(iris_core.device.faults: plain stores), which the host reports; the simulator raises
PeerTimeoutError with the same message.

Reuse of the parity buffers, all-gather: a rank pushes into a peer's buffer of parity
e % 2 in call e. The peer read that buffer in call e - 2. In call e - 1 this rank waited on
a flag the peer raised in call e - 1 (every call consumes at least one tile from every
member), and kernels of one device run in stream order, so the peer had finished call
e - 2. Reduce kernels: a rank rewrites its own buffer of parity e % 2 in call e, which peers
read in call e - 2; in call e - 1 it pulled a tile the peer published in call e - 1, so the
peer's call e - 2 was over. Both arguments need consecutive calls over one workspace to
have the same group: hence a workspace per partition of the ranks.
"""

import triton
import triton.language as tl

from iris_core import faults
from iris_core.collectives import kinds
from iris_core.collectives.group import member_rank, workspace_offset
from iris_core.collectives.workspace import FusedLayout
from iris_core.device import Context, flags, global_timer
from iris_core.device.faults import MISMATCH, PEER_FAILED, TIMEOUT, fail, signature
from iris_core.device.flags import LINE, Flags
from iris_core.gemm.gemm import aligned_rows, store_tile, tile_coords, tile_gemm
from iris_core.launch import GemmConfig, kernel_constants

# all_gather_matmul pushes A's rows in slices of at most this many columns (and at least
# MIN_PUSH_COLUMNS: one 16-byte vector of any dtype per row and more)
MAX_PUSH_COLUMNS = 256
MIN_PUSH_COLUMNS = 16


@triton.jit
def _prologue(ctx, group_ptr, G: tl.constexpr):
    """(workspace base address, my epoch pointer, this call's epoch)."""
    pid = tl.program_id(0)
    ws_base = tl.load(ctx.heap_bases + ctx.rank) + workspace_offset(group_ptr, G)
    epoch_ptr = tl.cast(ws_base + pid * LINE, tl.pointer_type(tl.int32))
    return ws_base, epoch_ptr, flags.read_epoch(epoch_ptr) + 1


@triton.jit
def _signature(KIND: tl.constexpr, dtype, G: tl.constexpr, M: tl.constexpr, N: tl.constexpr, K: tl.constexpr):
    """The call's signature: what its members must agree on (iris_core.faults.signature)."""
    return signature(KIND, 0, 0, dtype, G, faults.matmul_shapes(M, N, K))


@triton.jit
def _member_line(ws_base, member, MEMBERS: tl.constexpr):
    """Member `member`'s line of the members region (in my heap): [epoch, signature even, odd]."""
    return tl.cast(ws_base + MEMBERS + member * LINE, tl.pointer_type(tl.int64))


@triton.jit
def _announce(f, group_ptr, ws_base, epoch, sig, G: tl.constexpr, MEMBERS: tl.constexpr):
    """Program 0, first of all: my call's signature, then its epoch, into my line on every member."""
    me = tl.load(group_ptr)
    line = _member_line(ws_base, me, MEMBERS)
    for i in tl.static_range(G):
        f.ctx.store(line + 1 + epoch % 2, sig, to_rank=member_rank(group_ptr, i))
    tl.debug_barrier()  # the signatures precede the announcement
    for i in tl.static_range(G):
        f.signal(line, epoch.to(tl.int64), member_rank(group_ptr, i))


@triton.jit(noinline=True)  # one copy of the give-up path per kernel, not one per wait site
def _give_up(f, group_ptr, ws_base, epoch, sig, CODE, member, theirs, G: tl.constexpr, MEMBERS: tl.constexpr):
    """Fails this call because of member `member` (CODE: a fault code, a constant or a value;
    `theirs`: its differing signature, or 0). First my signature and POISON + the epoch into my
    line on every member: their later calls, and mine, then fail at once. My program's count of
    calls moves on as if the call had ended, so that its later calls pair with the others'."""
    me = tl.load(group_ptr)
    line = _member_line(ws_base, me, MEMBERS)
    for i in tl.static_range(G):
        f.ctx.store(line + 1 + epoch % 2, sig, to_rank=member_rank(group_ptr, i))
    tl.debug_barrier()  # the signature precedes the poison that makes it readable
    for i in tl.static_range(G):
        f.poison(line, member_rank(group_ptr, i), epoch.to(tl.int64))
    flags.write_epoch(tl.cast(ws_base + tl.program_id(0) * LINE, tl.pointer_type(tl.int32)), epoch)
    workspace = (ws_base - tl.load(f.ctx.heap_bases + f.ctx.rank)).to(tl.int64)
    fail(f.ctx, CODE, f.WHAT, member_rank(group_ptr, member), epoch, workspace, sig, theirs)


@triton.jit
def _differing(group_ptr, ws_base, epoch, sig, G: tl.constexpr, MEMBERS: tl.constexpr):
    """(member, signature) of a member whose call in this epoch differs from mine, else (-1, 0):
    its line holds this epoch's signature once it announced the epoch or gave up in it."""
    culprit = tl.full((), -1, tl.int32)
    theirs = tl.full((), 0, tl.int64)
    for i in tl.static_range(G):
        line = _member_line(ws_base, i, MEMBERS)
        seen = tl.load(line, volatile=True)
        other = tl.load(line + 1 + epoch % 2, volatile=True)
        this_epoch = tl.where(flags.poisoned(seen), flags.poisoned_at(seen) == epoch, seen >= epoch)
        hit = this_epoch & (other != sig) & (culprit < 0)
        culprit = tl.where(hit, i, culprit)
        theirs = tl.where(hit, other, theirs)
    return culprit, theirs


@triton.jit
def _check_members(f, group_ptr, ws_base, epoch, sig, G: tl.constexpr, MEMBERS: tl.constexpr):
    """Before a program's first wait on a peer: every member announced this epoch, with my
    signature. Else gives up (_give_up) naming the member that never came (timeout), whose call
    differs (RankMismatchError), or that gave up before (PeerFailedError; RankMismatchError when
    some member's call in this epoch differs from mine: my call may be one of those)."""
    start = global_timer()
    bad = tl.full((), -1, tl.int32)
    code = tl.full((), 0, tl.int32)
    theirs = tl.full((), 0, tl.int64)
    for i in tl.static_range(G):
        if bad < 0:
            line = _member_line(ws_base, i, MEMBERS)
            seen = f.wait(line, epoch.to(tl.int64), start)
            other = tl.load(line + 1 + epoch % 2, volatile=True)
            why = tl.where(flags.timed_out(seen), TIMEOUT,
                           tl.where(flags.poisoned(seen), PEER_FAILED, tl.where(other != sig, MISMATCH, 0)))
            bad = tl.where(why != 0, i, bad)
            code = tl.where(why != 0, why, code)
            theirs = tl.where(why == MISMATCH, other, theirs)
    if bad >= 0:
        if code == PEER_FAILED:
            culprit, other = _differing(group_ptr, ws_base, epoch, sig, G, MEMBERS)
            code = tl.where(culprit >= 0, MISMATCH, code)
            bad = tl.where(culprit >= 0, culprit, bad)
            theirs = tl.where(culprit >= 0, other, theirs)
        _give_up(f, group_ptr, ws_base, epoch, sig, code, bad, theirs, G, MEMBERS)
    tl.debug_barrier()


@triton.jit
def _wait_tile(f, group_ptr, ws_base, epoch, sig, flag, member, G: tl.constexpr, MEMBERS: tl.constexpr):
    """Waits until member `member`'s tile flag `flag` (in my heap) reached `epoch`, then a CTA
    barrier; a timeout gives up (_give_up) naming it."""
    if flags.timed_out(f.wait(flag, epoch, global_timer())):
        _give_up(f, group_ptr, ws_base, epoch, sig, TIMEOUT, member, 0, G, MEMBERS)
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
def _pull(ctx, ptrs, rank, ROW_BYTES: tl.constexpr):
    """Loads the tile at my-heap pointers `ptrs` from `rank`'s heap, as 16-byte vectors when
    ROW_BYTES allows. Plain loads: the caller acquired `rank`'s flag and passed a CTA barrier
    first, so the much slower `.cg` loads of peer memory are not needed."""
    if ROW_BYTES % 16 == 0:
        return ctx.load(ptrs, rank, hint=(1, 16))
    else:
        return ctx.load(ptrs, rank)


@triton.jit
def _reduce_tile(f, group_ptr, ws_base, sig, data, tile_flags, t, epoch, offs, out_ptr, pid_m, pid_n, M: tl.constexpr,
                 N: tl.constexpr, G: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, MEMBERS: tl.constexpr):
    """Out tile (pid_m, pid_n) = the sum of every member's published tile `t`, each pulled
    from that member's heap once its flag (in my heap) is up (members in order: every rank
    reducing a tile gets bit-identical results). All flags first, then all loads back to
    back, so the members' transfers overlap; full tiles are stored in 16-byte vectors."""
    ctx = f.ctx
    for i in tl.static_range(G):
        _wait_tile(f, group_ptr, ws_base, epoch, sig, tile_flags + t * G + i, i, G, MEMBERS)
    out_dtype = out_ptr.dtype.element_ty
    item: tl.constexpr = out_dtype.primitive_bitwidth // 8
    total = tl.zeros((BM, BN), dtype=tl.float32)
    for i in tl.static_range(G):
        total += _pull(ctx, _slot(data, t, offs, BN), member_rank(group_ptr, i), BN * item).to(tl.float32)
    if M % BM == 0 and N % BN == 0:
        rows = pid_m * BM + tl.arange(0, BM)
        cols = pid_n * BN + tl.arange(0, BN)
        tl.store(aligned_rows(out_ptr, rows[:, None] * N + cols[None, :], N * item, BN), total.to(out_dtype))
    else:
        store_tile(out_ptr, total.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)


@triton.jit
def matmul_reduce_kernel(context_ptr, group_ptr, a_ptr, b_ptr, out_ptr,
                         M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                         stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr,
                         stride_bn: tl.constexpr, SCATTER: tl.constexpr, G: tl.constexpr,
                         WORLD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         GROUP_M: tl.constexpr, PREC: tl.constexpr, GEMM_PROGRAMS: tl.constexpr,
                         MEMBERS: tl.constexpr, FLAGS: tl.constexpr, DATA: tl.constexpr,
                         DATA_BYTES: tl.constexpr, POLL_NS: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                         WHAT: tl.constexpr):
    """A is (NB * M) x K with NB = G if SCATTER else 1, B is K x N; C = A @ B is split into NB
    row blocks of M rows. SCATTER=0: out (M x N) = sum over members of C. SCATTER=1: out
    (M x N) = sum over members of C's block `me`.

    Tiles t = l * NB + block (block-interleaved: every block's tile l is made at the same
    time on every rank). GEMM programs (pid < GEMM_PROGRAMS) compute tiles pid, pid + PG, ...
    into slot t of my data buffer and release flag [t][me] into the heap of every member that
    reduces tile t; they never wait, except on their last round of tiles (the tail), which
    they reduce themselves. The other programs (the highest pids, so the simulator runs them
    last) reduce every earlier tile that this rank outputs (all of them, or block `me`'s),
    pulling each member's slot t once its flag is up: the communication runs on its own SMs
    while the GEMM goes on."""
    ctx = Context.initialize(context_ptr, WORLD)
    f = Flags(ctx, TIMEOUT_NS, POLL_NS, WHAT)  # the reducers poll beside the GEMM programs: POLL_NS between reads
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    me = tl.load(group_ptr)
    NB: tl.constexpr = G if SCATTER else 1
    KIND: tl.constexpr = kinds.MATMUL_REDUCE_SCATTER if SCATTER else kinds.MATMUL_ALL_REDUCE
    sig = _signature(KIND, a_ptr.dtype.element_ty, G, NB * M, N, K)
    ws_base, epoch_ptr, epoch = _prologue(ctx, group_ptr, G)
    if pid == 0:
        _announce(f, group_ptr, ws_base, epoch, sig, G, MEMBERS)
    data = tl.cast(ws_base + DATA + (epoch % 2).to(tl.uint64) * DATA_BYTES, out_ptr.dtype)
    tile_flags = tl.cast(ws_base + FLAGS, tl.pointer_type(tl.int32))
    tiles_m = tl.cdiv(M, BM)
    tiles_n = tl.cdiv(N, BN)
    TB = tiles_m * tiles_n
    T = NB * TB
    PG: tl.constexpr = GEMM_PROGRAMS
    # tiles from `tail` on are each GEMM program's last round (all tiles when nobody else reduces)
    tail = (tl.cdiv(T, PG) - 1) * PG if programs > PG else 0
    offs = tl.arange(0, BM)[:, None] * BN + tl.arange(0, BN)[None, :]
    out_dtype = out_ptr.dtype.element_ty
    if pid < PG:
        for t in range(pid, T, PG):
            block = t % NB
            l = t // NB
            pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
            acc = tile_gemm(a_ptr + block * M * stride_am, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak,
                            stride_bk, stride_bn, BM, BN, BK, K % BK == 0, PREC, False)
            tl.store(_slot(data, t, offs, BN), acc.to(out_dtype))
            tl.debug_barrier()
            if SCATTER:  # tile t is there: tell the member that reduces it
                f.set(tile_flags + t * G + me, epoch, member_rank(group_ptr, block))
            else:
                for i in tl.static_range(G):
                    f.set(tile_flags + t * G + me, epoch, member_rank(group_ptr, i))
            owner = block if SCATTER else me  # the member that outputs tile t
            if (t >= tail) & (owner == me):
                _check_members(f, group_ptr, ws_base, epoch, sig, G, MEMBERS)
                _reduce_tile(f, group_ptr, ws_base, sig, data, tile_flags, t, epoch, offs, out_ptr, pid_m, pid_n,
                             M, N, G, BM, BN, MEMBERS)
    else:
        C = programs - PG
        _check_members(f, group_ptr, ws_base, epoch, sig, G, MEMBERS)
        for l in range(pid - PG, TB, C):
            t = l * NB + me * SCATTER
            if t < tail:
                pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
                _reduce_tile(f, group_ptr, ws_base, sig, data, tile_flags, t, epoch, offs, out_ptr, pid_m, pid_n,
                             M, N, G, BM, BN, MEMBERS)
    flags.write_epoch(epoch_ptr, epoch)


@triton.jit
def all_gather_matmul_kernel(context_ptr, group_ptr, a_ptr, b_ptr, out_ptr,
                             M: tl.constexpr, N: tl.constexpr, K: tl.constexpr,
                             stride_am: tl.constexpr, stride_ak: tl.constexpr, stride_bk: tl.constexpr,
                             stride_bn: tl.constexpr, G: tl.constexpr, WORLD: tl.constexpr,
                             BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, BKC: tl.constexpr,
                             GROUP_M: tl.constexpr, PREC: tl.constexpr, COMM: tl.constexpr,
                             MEMBERS: tl.constexpr, FLAGS: tl.constexpr, DATA: tl.constexpr,
                             DATA_BYTES: tl.constexpr, POLL_NS: tl.constexpr, TIMEOUT_NS: tl.constexpr,
                             WHAT: tl.constexpr):
    """A is my M x K block, B is K x N; out ((G * M) x N) = [A_0; ...; A_{G-1}] @ B.

    Every rank's data buffer holds the gathered A ((G * M) x K, row-major); flag
    [source member][row tile] says that row tile of that member has arrived."""
    ctx = Context.initialize(context_ptr, WORLD)
    f = Flags(ctx, TIMEOUT_NS, POLL_NS, WHAT)  # the compute programs poll beside the GEMM: POLL_NS between reads
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    me = tl.load(group_ptr)
    sig = _signature(kinds.ALL_GATHER_MATMUL, a_ptr.dtype.element_ty, G, M, N, K)
    ws_base, epoch_ptr, epoch = _prologue(ctx, group_ptr, G)
    if pid == 0:
        _announce(f, group_ptr, ws_base, epoch, sig, G, MEMBERS)
    gathered = tl.cast(ws_base + DATA + (epoch % 2).to(tl.uint64) * DATA_BYTES, a_ptr.dtype)
    tile_flags = tl.cast(ws_base + FLAGS, tl.pointer_type(tl.int32))
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
                            _push(ctx, dst, value, member_rank(group_ptr, j),
                                  K * (a_ptr.dtype.element_ty.primitive_bitwidth // 8), mask)
                tl.debug_barrier()
                for j in tl.static_range(G):
                    if j != me:
                        f.set(tile_flags + me * tiles_m + i, epoch, member_rank(group_ptr, j))
    # 2. my own block, from my A directly: every program, no waiting
    for l in range(pid, TB, programs):
        pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
        acc = tile_gemm(a_ptr, b_ptr, pid_m, pid_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                        BM, BN, BK, K % BK == 0, PREC, False)
        store_tile(out_ptr + me * M * N, acc.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
    # 3. the peers' blocks, as their row tiles arrive: compute programs only
    if G > 1:
        if pid >= COMM:
            _check_members(f, group_ptr, ws_base, epoch, sig, G, MEMBERS)
            for bi in range(1, G):
                s = (me + bi) % G
                a_s = gathered + s * M * K
                for l in range(pid - COMM, TB, programs - COMM):
                    pid_m, pid_n = tile_coords(l, tiles_m, tiles_n, GROUP_M)
                    _wait_tile(f, group_ptr, ws_base, epoch, sig, tile_flags + s * tiles_m + pid_m, s, G, MEMBERS)
                    acc = tile_gemm(a_s, b_ptr, pid_m, pid_n, M, N, K, K, 1, stride_bk, stride_bn,
                                    BM, BN, BK, K % BK == 0, PREC, True)
                    store_tile(out_ptr + s * M * N, acc.to(out_dtype), pid_m, pid_n, M, N, N, 1, BM, BN)
    flags.write_epoch(epoch_ptr, epoch)


def _flag_constants(layout: FusedLayout, poll_ns: int, timeout_ns: int, what: str) -> dict:
    return dict(MEMBERS=layout.members, FLAGS=layout.flags, DATA=layout.data, DATA_BYTES=layout.data_bytes,
                POLL_NS=poll_ns, TIMEOUT_NS=timeout_ns, WHAT=what)


def reduce_constants(*, M: int, N: int, K: int, scatter: bool, G: int, world: int, gemm: GemmConfig,
                     gemm_programs: int, layout: FusedLayout, poll_ns: int, timeout_ns: int, what: str) -> dict:
    """matmul_reduce_kernel's constexprs for row-major A ((G if scatter else 1) * M x K) and B
    (K x N): what iris_jax.ops launches (matmul_all_reduce, matmul_reduce_scatter) and
    benchmarks/kernel_ptx.py and benchmarks/fused_probe.py compile. `layout`: the fused
    workspace's; poll_ns, timeout_ns: the flag protocol's waits; `what`: the op a fault names."""
    faults.matmul_shapes((G if scatter else 1) * M, N, K)  # their names (a cached compile runs no _signature)
    return kernel_constants(matmul_reduce_kernel, M=M, N=N, K=K, stride_am=K, stride_ak=1, stride_bk=N, stride_bn=1,
                            SCATTER=int(scatter), G=G, WORLD=world, GEMM_PROGRAMS=gemm_programs,
                            **_flag_constants(layout, poll_ns, timeout_ns, what), **gemm.constants())


def push_columns(K: int) -> int:
    """all_gather_matmul's BKC: the columns of A pushed at a time, K's next power of two within
    [MIN_PUSH_COLUMNS, MAX_PUSH_COLUMNS]."""
    return min(MAX_PUSH_COLUMNS, max(MIN_PUSH_COLUMNS, 1 << (K - 1).bit_length()))


def gather_constants(*, M: int, N: int, K: int, G: int, world: int, gemm: GemmConfig, comm_programs: int,
                     layout: FusedLayout, poll_ns: int, timeout_ns: int, what: str = "all_gather_matmul") -> dict:
    """all_gather_matmul_kernel's constexprs for row-major A (M x K, my block) and B (K x N):
    what iris_jax.ops.all_gather_matmul launches and benchmarks/kernel_ptx.py compiles;
    `comm_programs`: the programs that push A's rows."""
    faults.matmul_shapes(M, N, K)  # their names (a cached compile runs no _signature)
    return kernel_constants(all_gather_matmul_kernel, M=M, N=N, K=K, stride_am=K, stride_ak=1, stride_bk=N,
                            stride_bn=1, G=G, WORLD=world, BKC=push_columns(K), COMM=comm_programs,
                            **_flag_constants(layout, poll_ns, timeout_ns, what), **gemm.constants())
