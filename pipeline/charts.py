"""Small hand-written SVG charts for the report and the notebook (no plotting dependency).

Charts are plain strings: they can be written to ``.svg`` files, inlined in the HTML page
(which therefore works from disk, from the admin link, or attached to an e-mail) and shown in
a notebook with ``IPython.display.SVG``.
"""

from __future__ import annotations

import math
from html import escape

PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f")
WIDTH, HEIGHT = 760, 340
LEFT, RIGHT, TOP, BOTTOM = 90, 20, 40, 100


def _nice_max(value: float) -> float:
    if value <= 0:
        return 1.0
    exp = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if value <= step * exp:
            return step * exp
    return 10 * exp


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value == int(value):
        return str(int(value))
    return f"{value:.1f}"


def _frame(title: str, ymax: float, unit: str) -> list[str]:
    plot_h = HEIGHT - TOP - BOTTOM
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" font-family="sans-serif" font-size="11" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    for i in range(5):
        value = ymax * i / 4
        y = TOP + plot_h - plot_h * i / 4
        parts.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{escape(_fmt(value))}</text>')
    if unit:
        parts.append(f'<text x="14" y="{TOP + plot_h / 2}" transform="rotate(-90 14 {TOP + plot_h / 2})" '
                     f'text-anchor="middle">{escape(unit)}</text>')
    return parts


def _legend(names: list[str]) -> list[str]:
    parts, x = [], LEFT
    for i, name in enumerate(names):
        color = PALETTE[i % len(PALETTE)]
        parts.append(f'<rect x="{x}" y="{HEIGHT - 16}" width="10" height="10" fill="{color}"/>')
        parts.append(f'<text x="{x + 14}" y="{HEIGHT - 7}">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    return parts


NO_DATA = f'<text x="{WIDTH / 2}" y="{TOP + (HEIGHT - TOP - BOTTOM) / 2}" text-anchor="middle">no data</text>'


def _chart_start(title: str, series: list[tuple[str, list[float]]], unit: str) -> tuple[float, list[str], int, int]:
    """The y scale of all series' values, the frame drawn for it, and the plot area's width and height."""
    values = [v or 0 for _, vs in series for v in vs]
    ymax = _nice_max(max(values, default=0))
    return ymax, _frame(title, ymax, unit), WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM


def svg_bar_chart(*, title: str, categories: list[str], series: list[tuple[str, list[float]]],
                  unit: str = "") -> str:
    """Grouped vertical bars: one group per category, one bar per series."""
    ymax, parts, plot_w, plot_h = _chart_start(title, series, unit)
    if not categories:
        parts.append(NO_DATA)
    else:
        group_w = plot_w / len(categories)
        bar_w = max(1.0, group_w * 0.8 / max(1, len(series)))
        for ci, category in enumerate(categories):
            gx = LEFT + ci * group_w + group_w * 0.1
            for si, (name, vs) in enumerate(series):
                value = vs[ci] or 0
                h = plot_h * value / ymax
                parts.append(
                    f'<rect x="{gx + si * bar_w:.1f}" y="{TOP + plot_h - h:.1f}" width="{bar_w:.1f}" '
                    f'height="{h:.1f}" fill="{PALETTE[si % len(PALETTE)]}">'
                    f"<title>{escape(category)} {escape(name)}: {escape(_fmt(value))}</title></rect>"
                )
            label_x = LEFT + ci * group_w + group_w / 2
            parts.append(f'<text x="{label_x:.1f}" y="{TOP + plot_h + 14}" text-anchor="end" '
                         f'transform="rotate(-30 {label_x:.1f} {TOP + plot_h + 14})">{escape(category[:28])}</text>')
    if len(series) > 1 or (series and series[0][0]):
        parts += _legend([name for name, _ in series])
    parts.append("</svg>")
    return "\n".join(parts)


def svg_line_chart(*, title: str, labels: list[str], series: list[tuple[str, list[float]]],
                   unit: str = "") -> str:
    """Lines over an ordered x axis (e.g. hours); at most ~12 x labels are printed."""
    ymax, parts, plot_w, plot_h = _chart_start(title, series, unit)
    n = len(labels)
    if n == 0:
        parts.append(NO_DATA)
    else:
        def x_at(i: int) -> float:
            return LEFT + (plot_w * i / (n - 1) if n > 1 else plot_w / 2)

        for si, (name, vs) in enumerate(series):
            points = " ".join(f"{x_at(i):.1f},{TOP + plot_h - plot_h * (v or 0) / ymax:.1f}" for i, v in enumerate(vs))
            parts.append(f'<polyline fill="none" stroke="{PALETTE[si % len(PALETTE)]}" stroke-width="1.5" '
                         f'points="{points}"><title>{escape(name)}</title></polyline>')
        step = max(1, math.ceil(n / 12))
        for i in range(0, n, step):
            x = x_at(i)
            parts.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 14}" text-anchor="end" '
                         f'transform="rotate(-30 {x:.1f} {TOP + plot_h + 14})">{escape(labels[i])}</text>')
    parts += _legend([name for name, _ in series])
    parts.append("</svg>")
    return "\n".join(parts)


def svg_hbar_chart(*, title: str, items: list[tuple[str, float]], unit: str = "") -> str:
    """Horizontal bars, largest first (rankings such as top failure reasons)."""
    row_h = 22
    height = TOP + row_h * max(1, len(items)) + 30
    label_w = 300
    vmax = _nice_max(max((v for _, v in items), default=0))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
        f'height="{height}" font-family="sans-serif" font-size="11" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        f'<rect width="{WIDTH}" height="{height}" fill="#fff"/>',
        f'<text x="{WIDTH / 2}" y="20" text-anchor="middle" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]
    if not items:
        parts.append(f'<text x="{WIDTH / 2}" y="{TOP + 12}" text-anchor="middle">none</text>')
    for i, (label, value) in enumerate(items):
        y = TOP + i * row_h
        w = (WIDTH - label_w - RIGHT - 50) * value / vmax
        parts.append(f'<text x="{label_w - 6}" y="{y + 14}" text-anchor="end">{escape(label[:48])}</text>')
        parts.append(f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" fill="{PALETTE[2]}">'
                     f"<title>{escape(label)}: {escape(_fmt(value))}</title></rect>")
        parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + 14}">{escape(_fmt(value))} {escape(unit)}</text>')
    parts.append("</svg>")
    return "\n".join(parts)
