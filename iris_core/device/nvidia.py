"""NVIDIA hardware registers and an acquiring flag load (inline PTX), with simulator equivalents.

Under the interpreter there is no SM and no global timer: `sm_id` is the program id and
`global_timer` reads the host clock (nanoseconds), which keeps traces meaningful.
"""

import time

import triton
import triton.language as tl

from iris_core.compat import interpreting

# the simulator: how long a flag read first yields the core, doubling up to _MAX_POLL_S
# while the same flag keeps its value (ranks outnumber cores in tests, and a rank spinning
# in the interpreter takes the core from the one that would set its flag)
_POLL_S, _MAX_POLL_S = 50e-6, 2e-3

if interpreting():

    def peer_timeout(what, rank, REPORT=True):
        from iris_core.errors import PeerTimeoutError

        raise PeerTimeoutError(f"iris {what}: timed out waiting for rank {int(rank)} (it never arrived)")

    def peer_failed(what, rank):
        from iris_core.errors import PeerFailedError

        raise PeerFailedError(
            f"iris {what}: rank {int(rank)} gave up on an earlier collective of this group (a timeout), so "
            "the group's flags no longer agree and no later collective of it can be trusted. Start again: "
            "iris_jax.shutdown() then init() on the simulator, new processes on GPUs")

    def sm_id():
        return tl.program_id(0)

    def global_timer():
        return tl.full((), time.time_ns(), tl.int64)

    _last_poll = {"flag": None, "value": None, "misses": 0}

    def load_acquire(ptr):
        # the simulator's ranks share host memory; a flag read is a poll, so it lets the
        # ranks that would set the flag run first
        flag = ptr.handle.data.tobytes()
        again = flag == _last_poll["flag"]
        time.sleep(min(_POLL_S * 2 ** _last_poll["misses"], _MAX_POLL_S) if again else _POLL_S)
        value = tl.load(ptr, volatile=True)
        seen = value.handle.data.tobytes()
        unchanged = again and seen == _last_poll["value"]
        _last_poll.update(flag=flag, value=seen, misses=min(_last_poll["misses"] + 1, 16) if unchanged else 0)
        return value

    def nanosleep(ns):
        time.sleep(int(ns) * 1e-9)

else:

    @triton.jit
    def peer_timeout(what: tl.constexpr, rank, REPORT: tl.constexpr = True):
        """Reports a peer that never arrived and aborts the kernel (the launch fails).

        REPORT=False aborts without printing. Kernels with tensor-core GEMMs must pass it: the
        print is an extern call (`vprintf`), and ptxas then serializes every wgmma of the
        kernel (each waits for the previous one), which costs the GEMM much of its speed
        (benchmarks/fused_probe.py shows where)."""
        if REPORT:
            tl.device_print("iris: timed out waiting for a peer rank in", rank)
        tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def peer_failed(what: tl.constexpr, rank):
        """Reports a peer that gave up on an earlier collective and aborts the kernel."""
        tl.device_print("iris: a peer gave up on an earlier collective of this group:", rank)
        tl.inline_asm_elementwise("trap;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def sm_id():
        """Index of the streaming multiprocessor running this program (%smid)."""
        return tl.inline_asm_elementwise(
            "mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def global_timer():
        """Nanoseconds from the GPU's global timer (%globaltimer), comparable across SMs."""
        return tl.inline_asm_elementwise(
            "mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def nanosleep(ns):
        """Suspends the thread for about `ns` nanoseconds (an int32; at most ~1 ms), e.g.
        between two reads of a flag, so that programs waiting beside busy ones issue fewer
        L2 requests and draw less of the power budget."""
        tl.inline_asm_elementwise("nanosleep.u32 $1; mov.u32 $0, 0;", "=r,r", [tl.full((), 0, tl.int32) + ns],
                                  dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def load_acquire(ptr):
        """Reads a flag (int32 or int64, one address) with acquire semantics at system scope:
        every later read of this thread sees what the writer released before the flag.
        (`tl.atomic_add(flag, 0, sem="acquire")` after a polling loop does not do this when
        its result is unused: Triton drops it. A `fence.acq_rel.sys` after the wait would
        order the reads too, at the cost of a fence per wait.)"""
        if ptr.dtype.element_ty.primitive_bitwidth == 64:
            return tl.inline_asm_elementwise("ld.acquire.sys.global.b64 $0, [$1];", "=l,l", [ptr],
                                             dtype=ptr.dtype.element_ty, is_pure=False, pack=1)
        else:
            return tl.inline_asm_elementwise("ld.acquire.sys.global.b32 $0, [$1];", "=r,l", [ptr],
                                             dtype=ptr.dtype.element_ty, is_pure=False, pack=1)
