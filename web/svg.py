"""Small inline SVG charts for the admin, drawn on the server (no script, nothing from outside).

Each bar carries a ``<title>``, which the browser shows as a tooltip, so exact figures are one
hover away without any JavaScript. Text is escaped; numbers are formatted by us.
"""

from __future__ import annotations

from html import escape

from django.utils.safestring import SafeString, mark_safe

GREEN = "#3a9a4e"
RED = "#d9534f"
BLUE = "#417690"
GREY = "#c8c8c8"


def _ago(i: int, n: int) -> str:
    ago = n - 1 - i
    return "this minute" if ago == 0 else f"{ago} min ago"


def _stacked_bar(x: float, bottom: float, width: float, delivered_h: float, failed_h: float, tip: str) -> str:
    """One minute's bar with its tooltip: delivered (green) from ``bottom`` up, failed (red, at least
    1 px so a lone failure shows) on top of it."""
    out = [f"<g><title>{escape(tip)}</title>"]
    if delivered_h > 0:
        out.append(f'<rect x="{x:.1f}" y="{bottom - delivered_h:.1f}" width="{width:.1f}" height="{delivered_h:.1f}" '
                   f'fill="{GREEN}"/>')
    if failed_h > 0:
        out.append(f'<rect x="{x:.1f}" y="{bottom - delivered_h - failed_h:.1f}" width="{width:.1f}" '
                   f'height="{max(failed_h, 1):.1f}" fill="{RED}"/>')
    out.append("</g>")
    return "".join(out)


def _fmt(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:.1f}M"
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    if value >= 1000:
        return f"{value / 1000:.1f}k"
    return f"{value:g}"


def minute_bars(delivered: list[int], failed: list[int], *, width: int = 180, height: int = 30,
                label: str = "") -> SafeString:
    """Sparkline of attempts per minute: delivered (green) with failed stacked on top (red)."""
    n = len(delivered)
    peak = max((d + f for d, f in zip(delivered, failed, strict=True)), default=0) or 1
    step = width / n
    bar = max(step - 1, 1)
    total_d, total_f = sum(delivered), sum(failed)
    title = f"{label}: " if label else ""
    title += f"{total_d:,} delivered, {total_f:,} failed in the last {n} min (peak {peak:,}/min)"
    parts = [
        f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}" stroke="{GREY}"/>',
    ]
    for i, (d, f) in enumerate(zip(delivered, failed, strict=True)):
        if not d and not f:
            continue
        x = i * step
        parts.append(_stacked_bar(x, height - 1, bar, (height - 1) * d / peak, (height - 1) * f / peak,
                                  f"{_ago(i, n)}: {d:,} delivered, {f:,} failed"))
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - built from numbers and escaped text


def line(values: list[int], *, width: int = 120, height: int = 30, label: str = "",
         color: str = BLUE) -> SafeString:
    """Sparkline of a level over time (e.g. the backlog), with its last value as the tooltip."""
    n = len(values)
    peak = max(values, default=0) or 1
    step = width / max(n - 1, 1)
    points = " ".join(f"{i * step:.1f},{height - 1 - (height - 2) * v / peak:.1f}" for i, v in enumerate(values))
    title = f"{label}: " if label else ""
    title += f"now {values[-1] if values else 0:,}, peak {max(values, default=0):,} in the last {n} min"
    return mark_safe(  # noqa: S308 - built from numbers and escaped text
        f'<svg class="spark" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        f'<line x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}" stroke="{GREY}"/>'
        f'<polyline points="{points}" fill="none" stroke="{color}" stroke-width="1.5"/></svg>'
    )


def minute_chart(*, delivered: list[int], failed: list[int], backlog: list[int] | None = None,
                 title: str, width: int = 720, height: int = 210) -> SafeString:
    """The dashboard's main chart: attempts per minute (stacked bars, left axis) and optionally
    the backlog (line, right axis) over the last hour."""
    left, right, top, bottom = 48, 56 if backlog else 12, 44, 22
    pw, ph = width - left - right, height - top - bottom
    n = len(delivered)
    peak = max((d + f for d, f in zip(delivered, failed, strict=True)), default=0) or 1
    step = pw / n
    bar = max(step - 1, 1)
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img" '
        f'aria-label="{escape(title)}"><title>{escape(title)}</title>',
        f'<text x="{left}" y="15" font-size="13" font-weight="bold" fill="#333">{escape(title)}</text>',
    ]
    for frac in (0, 0.5, 1):
        y = top + ph - ph * frac
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + pw}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#666">{_fmt(peak * frac)}</text>')
    for i, label in ((0, f"-{n} min"), (n // 2, f"-{n - n // 2} min"), (n - 1, "now")):
        anchor = "start" if i == 0 else ("end" if i == n - 1 else "middle")
        parts.append(f'<text x="{left + i * step + bar / 2:.1f}" y="{height - 6}" text-anchor="{anchor}" '
                     f'fill="#666">{label}</text>')
    for i, (d, f) in enumerate(zip(delivered, failed, strict=True)):
        if not d and not f:
            continue
        x = left + i * step
        parts.append(_stacked_bar(x, top + ph, bar, ph * d / peak, ph * f / peak,
                                  f"{_ago(i, n)}: {d:,} delivered, {f:,} failed"))
    if backlog:
        bpeak = max(backlog) or 1
        points = " ".join(f"{left + i * step + bar / 2:.1f},{top + ph - ph * v / bpeak:.1f}"
                          for i, v in enumerate(backlog))
        parts.append(f'<polyline points="{points}" fill="none" stroke="{BLUE}" stroke-width="2"/>')
        parts.append(f'<text x="{left + pw + 6}" y="{top + 4}" fill="{BLUE}">{_fmt(bpeak)}</text>')
        parts.append(f'<text x="{left + pw + 6}" y="{top + ph + 4}" fill="{BLUE}">0</text>')
    legend = [(GREEN, "delivered", 80), (RED, "failed (retried or dead)", 160)]
    if backlog:
        legend.append((BLUE, "backlog: queued + in flight (right axis)", 0))
    x = left
    for color, name, advance in legend:
        parts.append(f'<rect x="{x}" y="24" width="10" height="10" fill="{color}"/>'
                     f'<text x="{x + 14}" y="33" fill="#333">{name}</text>')
        x += advance
    parts.append("</svg>")
    return mark_safe("".join(parts))  # noqa: S308 - built from numbers and escaped text
