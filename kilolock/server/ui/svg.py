"""Open drift over a state's versions and observations as an inline SVG line chart, drawn on the server: no script,
no external file, readable by a screen reader through its title and description."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from markupsafe import Markup, escape

_W, _H = 640, 200
_LEFT, _RIGHT, _TOP, _BOTTOM = 44, 12, 14, 30


def _ceiling(n: int) -> int:
    """A round top for the y axis: 1, 2, 5, 10, 20, 50, ..."""
    decade = 1
    while True:
        for m in (1, 2, 5):
            if decade * m >= n:
                return decade * m
        decade *= 10


def summary(points: Sequence[Mapping[str, Any]], hidden: int = 0) -> str:
    """HIDDEN: open records that ignore rules hide, which POINTS leave out (as the open drift badge
    does); said apart, so that none is forgotten."""
    if not points:
        return "No versions yet."
    first, last = points[0], points[-1]
    peak = max(points, key=lambda p: p["open"])
    trend = "growing" if last["open"] > first["open"] else "shrinking" if last["open"] < first["open"] else "steady"
    apart = f" Not counted: {hidden} hidden by ignore rules." if hidden else ""
    return (f"Open drift at the last {len(points)} versions ({first['label']} to {last['label']}): "
            f"{first['open']} then {last['open']}, {trend}; at most {peak['open']} ({peak['label']}).{apart}")


def drift_chart(points: Sequence[Mapping[str, Any]], chart_id: str = "drift-chart", hidden: int = 0) -> Markup:
    """POINTS: {label, open} oldest first (store.ui_queries.drift_series: Terraform's versions and
    the observations of them, v8, v8.1); HIDDEN as for summary."""
    top = _ceiling(max([p["open"] for p in points] + [1]))
    plot_w, plot_h = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM
    n = len(points)

    def x(i: int) -> float:
        return _LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

    def y(v: int) -> float:
        return _TOP + plot_h - plot_h * v / top

    parts = [(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" class="chart" role="img" '
              f'aria-labelledby="{chart_id}-title {chart_id}-desc" preserveAspectRatio="xMidYMid meet">'),
             f'<title id="{chart_id}-title">Open drift over time</title>',
             f'<desc id="{chart_id}-desc">{escape(summary(points, hidden))}</desc>']
    for v in (0, top // 2, top) if top >= 2 else (0, top):
        parts.append(f'<line class="grid" x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        parts.append(f'<text class="tick" x="{_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v}</text>')
    if points:
        parts.append(f'<text class="tick" x="{_LEFT}" y="{_H - 8}" text-anchor="start">{escape(points[0]["label"])}</text>')
        parts.append(f'<text class="tick" x="{_W - _RIGHT}" y="{_H - 8}" text-anchor="end">{escape(points[-1]["label"])}</text>')
        line = " ".join(f"{x(i):.1f},{y(p['open']):.1f}" for i, p in enumerate(points))
        area = f"{x(0):.1f},{y(0):.1f} {line} {x(n - 1):.1f},{y(0):.1f}"
        parts.append(f'<polygon class="area" points="{area}"/>')
        parts.append(f'<polyline class="line" points="{line}"/>')
        if n <= 60:
            for i, p in enumerate(points):
                parts.append(f'<circle class="dot" cx="{x(i):.1f}" cy="{y(p["open"]):.1f}" r="2.5">'
                             f'<title>{escape(p["label"])}: {p["open"]} open</title></circle>')
    parts.append("</svg>")
    return Markup("".join(parts))
