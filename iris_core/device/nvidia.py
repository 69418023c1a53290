"""NVIDIA hardware registers, an acquiring flag load, stores to host memory and how a thread stops
(inline PTX), with simulator equivalents where the simulator runs them.

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
    def store_to_host(address, value):
        """Stores the int64 `value` at `address` (an integer: pinned host memory mapped into the
        device), bypassing the caches. Every thread that calls it stores (no predicate)."""
        tl.inline_asm_elementwise("st.volatile.global.b64 [$1], $2; mov.u32 $0, 0;", "=r,l,l",
                                  [address.to(tl.uint64), tl.full((), 0, tl.int64) + value], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def load_from_host(address):
        """The int64 at `address` (see store_to_host), read past the caches."""
        return tl.inline_asm_elementwise("ld.volatile.global.b64 $0, [$1];", "=l,l", [address.to(tl.uint64)],
                                         dtype=tl.int64, is_pure=False, pack=1)

    @triton.jit
    def fence_system():
        """Orders this thread's earlier writes before its later ones, as every device and the host see them."""
        tl.inline_asm_elementwise("fence.sc.sys; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def stop(leave):
        """Ends the thread: `leave` true, by `exit` (the launch completes and the CUDA context
        lives on; a CTA barrier that waits only for exited threads is released); else by `trap`
        (the launch fails, and with it the process's CUDA context)."""
        if leave:
            tl.inline_asm_elementwise("exit; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)
        else:
            tl.inline_asm_elementwise("trap; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)

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
