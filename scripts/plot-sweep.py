#!/usr/bin/env python3
"""Plot scripts/size-sweep.sh's CSV as an SVG: goodput (GB/s) and CPU time
per GB against message size (log scale), one line per operation, TCP
beside roxe. Standard library only.

usage: plot-sweep.py SWEEP.csv OUT.svg
"""
import csv
import math
import sys
from html import escape

COLOURS = {"write": "#1f77b4", "read": "#2ca02c", "send": "#ff7f0e", "tcp": "#7f7f7f"}
LABELS = {"write": "roxe WRITE", "read": "roxe READ", "send": "roxe SEND", "tcp": "iperf3 TCP"}
W, H = 460, 320  # one panel
LEFT, RIGHT, TOP, BOTTOM = 60, 20, 30, 50


def size_label(s):
    for unit, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if s >= n and s % n == 0:
            return f"{s // n} {unit}"
    return f"{s} B"


def nice_max(v):
    if v <= 0:
        return 1.0
    e = 10 ** math.floor(math.log10(v))
    for m in (1, 2, 2.5, 5, 10):
        if m * e >= v:
            return m * e
    return 10 * e


def panel(x0, title, series, sizes, key, log_y=False):
    out = []
    values = [r[key] for rows in series.values() for r in rows]
    lo, hi = math.log2(min(sizes)), math.log2(max(sizes))
    span = max(hi - lo, 1)
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(s):
        return x0 + LEFT + (math.log2(s) - lo) / span * pw

    if log_y:
        # Decades covering every positive value.
        ylo = math.floor(math.log10(min(v for v in values if v > 0)))
        yhi = max(math.ceil(math.log10(max(values))), ylo + 1)
        ticks = [10.0**e for e in range(ylo, yhi + 1)]

        def py(v):
            v = max(v, 10.0**ylo)
            return TOP + ph - (math.log10(v) - ylo) / (yhi - ylo) * ph

    else:
        ymax = nice_max(max(values))
        ticks = [ymax * k / 4 for k in range(5)]

        def py(v):
            return TOP + ph - v / ymax * ph

    out.append(f'<text x="{x0 + W / 2}" y="18" text-anchor="middle" font-weight="bold">{escape(title)}</text>')
    out.append(f'<rect x="{x0 + LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#000"/>')
    for v in ticks:
        y = py(v)
        out.append(f'<line x1="{x0 + LEFT}" y1="{y:.1f}" x2="{x0 + LEFT + pw}" y2="{y:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{x0 + LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="11">{v:g}</text>')
    for s in sizes:
        x = px(s)
        out.append(f'<line x1="{x:.1f}" y1="{TOP + ph}" x2="{x:.1f}" y2="{TOP + ph + 4}" stroke="#000"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 17}" text-anchor="middle" font-size="11">{size_label(s)}</text>')
    out.append(f'<text x="{x0 + LEFT + pw / 2}" y="{H - 8}" text-anchor="middle" font-size="12">message size</text>')
    for op, rows in series.items():
        pts = " ".join(f"{px(r['size']):.1f},{py(r[key]):.1f}" for r in rows)
        dash = ' stroke-dasharray="6 4"' if op == "tcp" else ""
        out.append(f'<polyline points="{pts}" fill="none" stroke="{COLOURS.get(op, "#000")}" stroke-width="2"{dash}/>')
        for r in rows:
            out.append(
                f'<circle cx="{px(r["size"]):.1f}" cy="{py(r[key]):.1f}" r="3" fill="{COLOURS.get(op, "#000")}">'
                f'<title>{escape(LABELS.get(op, op))} {size_label(r["size"])}: {r[key]:.3f}</title></circle>'
            )
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    series = {}
    with open(sys.argv[1], newline="") as f:
        for row in csv.DictReader(f):
            series.setdefault(row["op"], []).append(
                {"size": int(row["size"]), "gbps": float(row["gbytes_per_s"]), "cpu": float(row["cpu_s_per_gb"])}
            )
    if not series:
        sys.exit(f"{sys.argv[1]}: no rows")
    for rows in series.values():
        rows.sort(key=lambda r: r["size"])
    sizes = sorted({r["size"] for rows in series.values() for r in rows})
    total_w = 2 * W
    legend_y = H + 10
    svg = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{H + 40}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{total_w}" height="{H + 40}" fill="#fff"/>',
    ]
    svg += panel(0, "goodput, GB/s (loopback)", series, sizes, "gbps")
    svg += panel(W, "CPU time per GB, both sides, s (log)", series, sizes, "cpu", log_y=True)
    x = LEFT
    for op in series:
        c = COLOURS.get(op, "#000")
        dash = ' stroke-dasharray="6 4"' if op == "tcp" else ""
        svg.append(f'<line x1="{x}" y1="{legend_y + 12}" x2="{x + 24}" y2="{legend_y + 12}" stroke="{c}" stroke-width="2"{dash}/>')
        svg.append(f'<text x="{x + 30}" y="{legend_y + 16}">{escape(LABELS.get(op, op))}</text>')
        x += 140
    svg.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
