"""NVIDIA hardware registers (inline PTX), with simulator equivalents.

Under the interpreter there is no SM and no global timer: `sm_id` is the program id and
`global_timer` reads the host clock (nanoseconds), which keeps traces meaningful.
"""

import time

import triton
import triton.language as tl

from iris_core.device.compat import interpreting

if interpreting():

    def sm_id():
        return tl.program_id(0)

    def global_timer():
        return tl.full((), time.time_ns(), tl.int64)

else:

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
