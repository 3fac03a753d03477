"""The bench report as an SVG plot, without dependencies: speedups per suite and acceptance by position."""

from __future__ import annotations

import math

from localspec.bench import Row

def svg(rows: list[Row], title: str) -> str:
    """Left: speedup per suite and variant (greedy), with min-max whiskers. Right: acceptance by position."""
    greedy = [r for r in rows if r.temperature == min(x.temperature for x in rows)] if rows else []
    suites = list(dict.fromkeys(r.suite for r in greedy))
    variants = list(dict.fromkeys(r.variant for r in greedy))
    colors = ["#2b8a3e", "#1971c2", "#e8590c", "#862e9c", "#868e96", "#c92a2a", "#5c940d"]
    W, H, pad = 960, 420, 50
    left_w = 560
    top = max([r.speedup_max for r in greedy] + [r.speedup for r in greedy] + [1.5])
    top = math.ceil(top * 2) / 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{W / 2}" y="20" text-anchor="middle" font-size="15" font-weight="bold">{_esc(title)}</text>']
    x0, y0, plot_h = pad, H - pad, H - 2 * pad - 10

    def y(v: float) -> float:
        return y0 - v / top * plot_h

    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0 + left_w - pad}" y2="{y0}" stroke="black"/>')
    out.append(f'<line x1="{x0}" y1="{y0}" x2="{x0}" y2="{y0 - plot_h}" stroke="black"/>')
    for tick in [i / 2 for i in range(int(top * 2) + 1)]:
        out.append(f'<text x="{x0 - 6}" y="{y(tick) + 4}" text-anchor="end">{tick:g}x</text>')
        out.append(f'<line x1="{x0}" y1="{y(tick)}" x2="{x0 + left_w - pad}" y2="{y(tick)}" stroke="#eee"/>')
    out.append(f'<line x1="{x0}" y1="{y(1)}" x2="{x0 + left_w - pad}" y2="{y(1)}" stroke="#999" stroke-dasharray="4"/>')
    group_w = (left_w - pad - 10) / max(1, len(suites))
    bar_w = group_w * 0.8 / max(1, len(variants))
    for si, suite in enumerate(suites):
        gx = x0 + 10 + si * group_w
        out.append(f'<text x="{gx + group_w * 0.4}" y="{y0 + 16}" text-anchor="middle">{_esc(suite)}</text>')
        for vi, variant in enumerate(variants):
            row = next((r for r in greedy if r.suite == suite and r.variant == variant), None)
            if row is None:
                continue
            bx = gx + vi * bar_w
            c = colors[vi % len(colors)]
            out.append(f'<rect x="{bx:.1f}" y="{y(row.speedup):.1f}" width="{bar_w - 2:.1f}" '
                       f'height="{y0 - y(row.speedup):.1f}" fill="{c}"/>')
            mid = bx + (bar_w - 2) / 2
            out.append(f'<line x1="{mid:.1f}" y1="{y(row.speedup_min):.1f}" x2="{mid:.1f}" y2="{y(row.speedup_max):.1f}" '
                       f'stroke="black"/>')
    for vi, variant in enumerate(variants):
        out.append(f'<rect x="{x0 + 10 + vi * 130}" y="32" width="10" height="10" fill="{colors[vi % len(colors)]}"/>'
                   f'<text x="{x0 + 24 + vi * 130}" y="41">{_esc(variant)}</text>')
    out.append(f'<text x="{x0 - 40}" y="{y0 - plot_h / 2}" transform="rotate(-90 {x0 - 40} {y0 - plot_h / 2})" '
               f'text-anchor="middle">speedup over the faster plain (greedy)</text>')

    out += _acceptance_panel(greedy, variants, colors, left_w + 40, W - left_w - 70, y0, plot_h)
    out.append("</svg>")
    return "\n".join(out)


def _acceptance_panel(greedy: list[Row], variants: list[str], colors: list[str], ax0: float, aw: float, y0: float,
                      plot_h: float) -> list[str]:
    """The right panel: acceptance by draft position, over all suites, one line per variant."""
    out: list[str] = []
    out.append(f'<line x1="{ax0}" y1="{y0}" x2="{ax0 + aw}" y2="{y0}" stroke="black"/>')
    out.append(f'<line x1="{ax0}" y1="{y0}" x2="{ax0}" y2="{y0 - plot_h}" stroke="black"/>')
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        yy = y0 - tick * plot_h
        out.append(f'<text x="{ax0 - 6}" y="{yy + 4}" text-anchor="end">{tick:.0%}</text>')
    out.append(f'<text x="{ax0 + aw / 2}" y="{y0 + 30}" text-anchor="middle">draft position (all suites)</text>')
    span = 8
    for i in range(1, span + 1):
        out.append(f'<text x="{ax0 + (i - 0.5) * aw / span:.1f}" y="{y0 + 16}" text-anchor="middle">{i}</text>')
    for vi, variant in enumerate(variants):
        row = next((r for r in greedy if r.suite == "all" and r.variant == variant), None)
        if row is None or not row.acceptance_by_position:
            continue
        pts = [(ax0 + (i + 0.5) * aw / span, y0 - a * plot_h) for i, a in enumerate(row.acceptance_by_position[:span])]
        c = colors[vi % len(colors)]
        out.append('<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>'.format(
            c, " ".join(f"{px:.1f},{py:.1f}" for px, py in pts)))
        out.extend(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{c}"/>' for px, py in pts)
    return out


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
