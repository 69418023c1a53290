"""NVIDIA's device intrinsics (iris_core.platform.NVIDIA): hardware registers, an acquiring flag
load, stores to host memory and how a thread stops, as inline PTX. The simulator's are
iris_core.sim.intrinsics.
"""

import triton
import triton.language as tl


@triton.jit
def store_to_host(address, value):
    """Stores the int64 `value` at `address` (an integer: pinned host memory mapped into the
    device), bypassing the caches. Every thread that calls it stores (no predicate)."""
    tl.inline_asm_elementwise("st.volatile.global.b64 [$1], $2; mov.u32 $0, 0;", "=r,l,l",
                              [address.to(tl.uint64), tl.full((), 0, tl.int64) + value], dtype=tl.int32,
                              is_pure=False, pack=1)


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
