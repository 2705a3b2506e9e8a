"""An SVG timeline of a trace-event file (``kn.profile``'s ``kaun_ir.trace.json.gz``): one row per
thread that ran kernels, one box per kernel, labelled with its name (the layer path).

    python -m kaun_ir.tools.viz.trace PROFILE_DIR/kaun_ir.trace.json.gz -o trace.html --png trace.png

For a look at a trace where Perfetto is out of reach; ``--png`` takes a picture of the page with
a headless Chromium (Playwright), as the ``kaun-ir viz`` screenshot helper does.
"""

from __future__ import annotations

import argparse
import gzip
import html
import json
import os
import sys

from kaun_ir.fileio import atomic_write

_UNNAMED = "(no layer path)"


def _layer(event: dict) -> str:
    """The layer of a kernel renamed by ``kn.profile`` (its op name without the op), or
    ``_UNNAMED`` for a kernel XLA added itself (a copy, a layout change)."""
    op_name = (event.get("args") or {}).get("kaun_ir.op_name")
    return op_name.rsplit("/", 1)[0] if op_name else _UNNAMED


def _events(path: str) -> tuple[list[dict], dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    threads = {
        (e.get("pid"), e.get("tid")): e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    kernels = [e for e in events if e.get("ph") == "X" and "hlo_op" in (e.get("args") or {})]
    return kernels, threads


def render(path: str, width: int = 1400, row_height: int = 34, last_us: float | None = None) -> str:
    """An HTML page holding the SVG timeline of the kernels in the trace ``path`` (the last
    ``last_us`` microseconds when given)."""
    kernels, threads = _events(path)
    if not kernels:
        raise ValueError(f"{path}: no kernel events (events with an hlo_op argument)")
    end = max(e["ts"] + e.get("dur", 0) for e in kernels)
    start = min(e["ts"] for e in kernels) if last_us is None else end - last_us
    kernels = [e for e in kernels if e["ts"] + e.get("dur", 0) >= start]
    rows = sorted({(e["pid"], e["tid"]) for e in kernels}, key=lambda key: threads.get(key, str(key)))
    label_w, top = 220, 30
    scale = (width - label_w - 10) / max(end - start, 1e-9)
    layers = sorted({_layer(e) for e in kernels})
    named = [name for name in layers if name != _UNNAMED]
    color = {name: f"hsl({int(360 * i / max(len(named), 1))}, 60%, 50%)" for i, name in enumerate(named)}
    color[_UNNAMED] = "#bbbbbb"
    height = top + row_height * len(rows) + 30 + 18 * ((len(layers) + 3) // 4)
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif">',
        f'<text x="8" y="18" font-size="13">{html.escape(os.path.basename(path))}: '
        f"{len(kernels)} kernels over {(end - start) / 1000:.2f} ms</text>",
    ]
    for r, key in enumerate(rows):
        y = top + r * row_height
        parts.append(
            f'<text x="8" y="{y + row_height / 2 + 4}" font-size="11">'
            f"{html.escape(threads.get(key, str(key)))[:30]}</text>"
        )
        parts.append(
            f'<line x1="{label_w}" x2="{width}" y1="{y + row_height}" y2="{y + row_height}" stroke="#ddd"/>'
        )
        for e in kernels:
            if (e["pid"], e["tid"]) != key:
                continue
            x = label_w + (max(e["ts"], start) - start) * scale
            w = max(e.get("dur", 0) * scale, 1.0)
            layer = _layer(e)
            name = html.escape(e["name"])
            parts.append(
                f'<rect x="{x:.1f}" y="{y + 3}" width="{w:.1f}" height="{row_height - 6}" '
                f'fill="{color[layer]}">'
                f"<title>{name} {e.get('dur', 0):.1f} us</title></rect>"
            )
            if w > 60:
                parts.append(
                    f'<text x="{x + 3:.1f}" y="{y + row_height / 2 + 4}" font-size="10" fill="white">'
                    f"{name[: int(w / 6)]}</text>"
                )
    y = top + row_height * len(rows) + 20
    for i, name in enumerate(layers):
        lx, ly = 8 + (i % 4) * 300, y + (i // 4) * 18
        parts.append(f'<rect x="{lx}" y="{ly - 10}" width="12" height="12" fill="{color[name]}"/>')
        parts.append(f'<text x="{lx + 18}" y="{ly}" font-size="12">{html.escape(name)}</text>')
    parts.append("</svg>")
    return f"<!doctype html><html><body style='margin:0;background:white'>{''.join(parts)}</body></html>"


def main(argv: list[str] | None = None) -> int:
    """Write the timeline page (and with ``--png`` a picture of it)."""
    parser = argparse.ArgumentParser(prog="python -m kaun_ir.tools.viz.trace", description=__doc__)
    parser.add_argument("trace", help="a trace-event file (.json or .json.gz)")
    parser.add_argument("-o", "--output", required=True, metavar="PAGE.html")
    parser.add_argument(
        "--png", metavar="FILE.png", help="also save a screenshot (needs Playwright and Chromium)"
    )
    parser.add_argument("--last-us", type=float, default=None, help="show only the last N microseconds")
    args = parser.parse_args(argv)
    try:
        page = render(args.trace, last_us=args.last_us)
        atomic_write(args.output, page)
    except (OSError, ValueError) as err:  # a missing, unreadable or kernel-less trace
        print(f"viz.trace: error: {err}", file=sys.stderr)
        return 1
    if args.png:
        try:
            _picture(args.output, args.png)
        except RuntimeError as err:
            print(f"viz.trace: error: {err} (the page {args.output} was written)", file=sys.stderr)
            return 1
    return 0


def _picture(page_path: str, png_path: str) -> None:
    """Save a full-page screenshot of ``page_path``; ``RuntimeError`` in one line when Playwright
    or a Chromium is missing or the browser cannot start."""
    from kaun_ir.tools.viz.screenshot import BROWSER_ENV, find_browser  # noqa: PLC0415 - only for --png

    try:
        from playwright.sync_api import Error, sync_playwright  # noqa: PLC0415 - only for --png
    except ImportError:
        raise RuntimeError("--png needs Playwright: pip install playwright") from None
    browser_path = find_browser()
    if browser_path is None:
        raise RuntimeError(f"--png found no Chromium: install chromium or set ${BROWSER_ENV}")
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=browser_path)
            try:
                page_view = browser.new_page(viewport={"width": 1400, "height": 200})
                page_view.goto("file://" + os.path.abspath(page_path))
                page_view.screenshot(path=png_path, full_page=True)
            finally:
                browser.close()
    except Error as err:  # Playwright's own: the browser would not start, or died
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise RuntimeError(f"--png could not drive {browser_path}: {first}") from None


if __name__ == "__main__":
    sys.exit(main())
