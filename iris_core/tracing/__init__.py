"""Host side of device event tracing: trace buffers on the heap, export, timeline plots.

* `Tracer(heap)`: enable / disable / reset, the context's tracing words, read and export;
* `TraceBuffers`, `RankTrace`: the trace area on the heap and one rank's events;
* `chrome_trace`, `write_chrome_trace`: Chrome / Perfetto trace-event JSON;
* `plot(source, out_png)`: a timeline PNG (needs matplotlib);
* `events`: the event ids (the device side is iris_core.device.tracing).
"""

from iris_core.tracing import events
from iris_core.tracing.buffers import DEFAULT_MAX_EVENTS, EVENT_DTYPE, EVENT_FIELDS, RankTrace, TraceBuffers
from iris_core.tracing.export import chrome_trace, load_chrome_trace, write_chrome_trace
from iris_core.tracing.plot import plot
from iris_core.tracing.tracer import Tracer

__all__ = [
    "DEFAULT_MAX_EVENTS", "EVENT_DTYPE", "EVENT_FIELDS", "RankTrace", "TraceBuffers", "Tracer", "chrome_trace",
    "events", "load_chrome_trace", "plot", "write_chrome_trace",
]
