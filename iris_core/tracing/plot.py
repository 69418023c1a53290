"""Timeline PNG of a trace: one row per (rank, SM or program), colored event spans.

Needs matplotlib (pip install "iris-jax[plots]"). Draws through matplotlib's object API
(no pyplot, no backend change), so it works headless and inside notebooks alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from iris_core.errors import IrisError
from iris_core.tracing.export import chrome_trace, load_chrome_trace

MAX_ROWS = 256  # rows drawn; more are summarized in the title


def plot(source, out_png: str, title: str | None = None, **options) -> str:
    """Draws `source` as a timeline into `out_png`; returns the path.

    Args:
      source: a trace-event JSON path (as written by export), a trace-event dict, or a
        list of RankTrace (converted with `options`: names, track, align).
      out_png: the PNG to write.
    """
    doc = _document(source, options)
    rows, spans = _spans(doc)
    if not spans:
        raise IrisError("the trace holds no events to plot (was tracing enabled and the kernel built "
                        "with tracing=True?)")
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as e:
        raise IrisError('plotting traces needs matplotlib: pip install "iris-jax[plots]"') from e

    shown = rows[:MAX_ROWS]
    row_of = {key: i for i, key in enumerate(shown)}
    names = sorted({s[1] for s in spans})
    palette = _palette(len(names))
    color = dict(zip(names, palette, strict=True))
    end = max(ts + dur for _, _, ts, dur in spans)
    unit, scale = ("ms", 1e-3) if end > 2e4 else ("µs", 1.0)
    spans = [(key, name, ts * scale, dur * scale) for key, name, ts, dur in spans]
    end *= scale
    min_width = max(end, 1e-3) * 2e-3  # keep the shortest events visible

    fig = Figure(figsize=(12, min(2 + 0.32 * len(shown), 40)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for (key, name, ts, dur), depth in sorted(zip(spans, _depths(spans), strict=True), key=lambda s: s[1]):
        if key in row_of:  # nested events: thinner bars drawn over their parents
            height = max(0.8 - 0.22 * depth, 0.2)
            ax.broken_barh([(ts, max(dur, min_width))], (row_of[key] - height / 2, height),
                           facecolors=color[name], edgecolor="none")
    ax.set_yticks(range(len(shown)), _labels(doc, shown))
    ax.set_ylim(len(shown) - 0.5, -0.5)
    ax.set_xlim(0, end * 1.01 if end > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=color[n], label=n) for n in names], loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize="small")
    hidden = f" ({len(rows) - len(shown)} more rows not drawn)" if len(rows) > len(shown) else ""
    ax.set_title((title or "iris device trace: ranks x SMs") + hidden)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    return out_png


def _document(source, options) -> dict:
    if isinstance(source, (str, bytes)) or hasattr(source, "__fspath__"):
        return load_chrome_trace(source)
    if isinstance(source, dict):
        return source
    if isinstance(source, Sequence):
        return chrome_trace(source, **options)
    raise TypeError(f"expected a path, a trace-event dict or a list of RankTrace, got {type(source).__name__}")


def _spans(doc: dict):
    """Sorted (rank, track) rows and (row, name, start µs, duration µs) spans."""
    spans = []
    for e in doc.get("traceEvents", []):
        if e.get("ph") in ("X", "i", "I"):
            spans.append(((e["pid"], e.get("tid", 0)), e["name"], float(e["ts"]), float(e.get("dur", 0.0))))
    rows = sorted({s[0] for s in spans})
    return rows, spans


def _depths(spans) -> list[int]:
    """Nesting depth of each span within its row (0: not inside another span)."""
    depths = [0] * len(spans)
    open_ends: dict = {}
    for i in sorted(range(len(spans)), key=lambda i: (spans[i][0], spans[i][2], -spans[i][3])):
        key, _, ts, dur = spans[i]
        stack = open_ends.setdefault(key, [])
        while stack and stack[-1] <= ts:
            stack.pop()
        depths[i] = len(stack)
        stack.append(ts + dur)
    return depths


def _labels(doc: dict, rows) -> list[str]:
    names = {}
    for e in doc.get("traceEvents", []):
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            names[(e["pid"], e.get("tid", 0))] = e["args"]["name"]
    return [f"rank {pid} · {names.get((pid, tid), f'track {tid}')}" for pid, tid in rows]


def _palette(n: int):
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]
