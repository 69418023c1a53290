"""Device side of event tracing (the host side and export land with the tracing issue).

The context always carries the tracing words (zero when tracing is off), so a kernel
compiled with `tracing=True` decodes safely either way. With `enabled` false every
record call is a compile-time no-op: the kernel is the same as without tracing.
"""

import triton
import triton.language as tl

from iris_core.device.compat import aggregate


@aggregate
class DeviceTracing:
    enabled: tl.constexpr
    words: tl.tensor  # pointer to [trace_enabled, max_events, counter_ptr, op_index_ptr, buffers...]

    @triton.constexpr_function
    def __init__(self, enabled, words):
        self.enabled = tl.constexpr(enabled)
        self.words = words

    @triton.jit
    def record_event_start(self, event_id: tl.constexpr, target_rank, address, pid_m, pid_n, mask=None):
        if self.enabled:
            tl.static_assert(False, "device tracing is not implemented yet; compile with tracing=False")
        return 0

    @triton.jit
    def record_event_end(self, handle):
        if self.enabled:
            tl.static_assert(False, "device tracing is not implemented yet; compile with tracing=False")
