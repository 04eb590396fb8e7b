"""Charts drawn on the server as inline SVG: no script, no library, the page is complete
as it arrives."""

import math
from decimal import Decimal

from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe

WIDTH, HEIGHT, PAD_LEFT, PAD_BOTTOM, PAD_TOP = 640, 180, 84, 22, 10


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^n at or above ``value`` (the axis' top)."""
    if value <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(value))
    return next(step * magnitude for step in (1, 2, 2.5, 5, 10) if step * magnitude >= value)


def bars(points: list[tuple[str, Decimal | float]], *, unit: str, title: str) -> SafeString:
    """A bar chart of ``points`` (label, value), with a labelled top and bottom of the axis,
    each bar's value in its tooltip, and ``title`` for screen readers."""
    top = _nice_ceiling(float(max((v for _, v in points), default=0)))
    inner_w, inner_h = WIDTH - PAD_LEFT - 4, HEIGHT - PAD_BOTTOM - PAD_TOP
    slot = inner_w / max(len(points), 1)
    parts = [
        format_html(
            '<line x1="{}" y1="{}" x2="{}" y2="{}" class="axis"/>',
            PAD_LEFT,
            PAD_TOP + inner_h,
            WIDTH - 4,
            PAD_TOP + inner_h,
        ),
        format_html(
            '<text x="{}" y="{}" class="tick" text-anchor="end">{} {}</text>',
            PAD_LEFT - 4,
            PAD_TOP + 8,
            f"{top:g}",
            unit,
        ),
        format_html(
            '<text x="{}" y="{}" class="tick" text-anchor="end">0</text>',
            PAD_LEFT - 4,
            PAD_TOP + inner_h,
        ),
    ]
    for i, (label, value) in enumerate(points):
        h = inner_h * float(value) / top
        x = PAD_LEFT + i * slot + slot * 0.15
        parts.append(
            format_html(
                '<rect x="{}" y="{}" width="{}" height="{}" class="bar">'
                "<title>{}: {} {}</title></rect>",
                f"{x:.1f}",
                f"{PAD_TOP + inner_h - h:.1f}",
                f"{slot * 0.7:.1f}",
                f"{h:.1f}",
                label,
                f"{float(value):.2f}",
                unit,
            )
        )
        if i % max(1, len(points) // 10) == 0:
            parts.append(
                format_html(
                    '<text x="{}" y="{}" class="tick" text-anchor="middle">{}</text>',
                    f"{x + slot * 0.35:.1f}",
                    HEIGHT - 6,
                    label,
                )
            )
    body = "".join(parts)
    # Every value above went through format_html; the title is escaped here.
    return mark_safe(
        f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" '
        f'aria-label="{escape(title)}">{body}</svg>'
    )
