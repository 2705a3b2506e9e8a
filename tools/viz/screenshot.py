"""A PNG screenshot of the interactive ``kaun-ir viz`` page, taken with a headless Chromium.

    python -m kaun_ir.tools.viz.screenshot kaun_ir.tools.examples:transformer_train_step \\
        --stage optimized --collapse-all --expand 1.block/0.residual --expand 1.block \\
        -o docs/viz_transformer_train_step.png

The page is written exactly as ``kaun-ir viz SPEC -o page.html`` writes it (to a temporary
directory), opened in Chromium through Playwright (``pip install playwright``; the browser is
``$KAUN_IR_CHROMIUM`` or the first of chromium, chromium-browser, google-chrome on the PATH),
with ``--collapse-all`` every group is collapsed, the ``--expand`` groups (``/`` between nested
layers, as in the page's ``data-group``) are expanded in order (a group inside a collapsed one
opens with its parent), the view shows the top of the last one, ``--select`` shows a node's
details in the side panel, and the window is saved as PNG.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import sys
import tempfile

BROWSER_ENV = "KAUN_IR_CHROMIUM"
BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    """The Chromium to drive: ``$KAUN_IR_CHROMIUM`` or the first one on the PATH (None if none)."""
    explicit = os.environ.get(BROWSER_ENV)
    if explicit:
        return explicit
    for name in BROWSER_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def screenshot(
    page_path: str,
    png_path: str,
    expand: list[str] = (),
    width: int = 1400,
    height: int = 900,
    select: str | None = None,
    collapse_all: bool = False,
) -> dict:
    """Open the page ``page_path`` (``collapse_all``: collapse every group first), expand the
    groups ``expand``, show the node ``select`` in the side panel and save the window to
    ``png_path``. Returns the page's ``kaunViz.views()`` (node counts, visible boxes)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise RuntimeError("the screenshot needs Playwright: pip install playwright") from None
    browser_path = find_browser()
    if browser_path is None:
        raise RuntimeError(f"no Chromium found: install chromium or set ${BROWSER_ENV}")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("pageerror", lambda err: errors.append(str(err)))
            page.goto("file://" + os.path.abspath(page_path))
            page.wait_for_function("window.kaunViz && window.kaunViz.ready")
            if collapse_all:
                page.click("#collapse-all")
            for key in expand:  # a group inside a collapsed one opens when its parent does
                page.evaluate("key => window.kaunViz.expand(key)", key)
            for key in expand:
                if page.locator(f'.group[data-group="{key}"]').count() == 0:
                    raise RuntimeError(
                        f"--expand {key!r}: no such group on the page (or a group around it is collapsed)"
                    )
            if select:  # after the expansions, so that the view stays where they put it
                page.evaluate("id => window.kaunViz.select(id)", select)
            if errors:
                raise RuntimeError(f"the page reported errors: {errors}")
            page.screenshot(path=png_path)
            return page.evaluate("window.kaunViz.views()")
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    """Write a PNG of the interactive page of a model (a headless Chromium through Playwright)."""
    from kaun_ir.tools import cli

    parser = argparse.ArgumentParser(
        prog="python -m kaun_ir.tools.viz.screenshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "spec", metavar="SPEC", help="what kaun-ir viz draws (module:function or a .kir file)"
    )
    parser.add_argument("-o", "--output", required=True, metavar="FILE.png")
    parser.add_argument("--stage", default=None, help="the IR stage (as kaun-ir viz --stage)")
    parser.add_argument("--collapse-all", action="store_true", help="collapse every group before expanding")
    parser.add_argument(
        "--expand",
        action="append",
        default=[],
        metavar="GROUP",
        help="a group to expand, e.g. 1.block or 1.block/0.residual (repeatable)",
    )
    parser.add_argument("--select", default=None, metavar="NODE_ID", help="a node to show in the side panel")
    parser.add_argument("--size", default="1400x900", help="window size WIDTHxHEIGHT (default 1400x900)")
    args = parser.parse_args(argv)
    try:
        width, height = (int(v) for v in args.size.lower().split("x"))
    except ValueError:
        parser.error(f"--size {args.size!r}: expected WIDTHxHEIGHT, e.g. 1400x900")
    with tempfile.TemporaryDirectory() as tmp:
        page = os.path.join(tmp, "page.html")
        viz_args = ["viz", args.spec, "-o", page] + (["--stage", args.stage] if args.stage else [])
        messages = io.StringIO()
        with contextlib.redirect_stderr(messages):  # "wrote <temporary file>" is of no use here
            rc = cli.main(viz_args)
        if rc:
            sys.stderr.write(messages.getvalue())
            return rc
        try:
            views = screenshot(page, args.output, args.expand, width, height, args.select, args.collapse_all)
        except RuntimeError as err:
            print(f"viz_screenshot: error: {err}", file=sys.stderr)
            return 1
    shown = views[0]
    print(f"wrote {args.output} ({shown['nodes']} nodes, {shown['visible']} boxes shown)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
