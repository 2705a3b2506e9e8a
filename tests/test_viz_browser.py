"""The interactive ``kaun-ir viz`` page in a real headless Chromium (driven by Playwright).

Skipped, with the reason, only when Playwright is not installed or no Chromium can be found or
started; the browser is ``$KAUN_IR_CHROMIUM`` or the first of chromium, chromium-browser,
google-chrome on the PATH. Every expectation is computed here from the graph itself (layer
paths, op counts, node_cost), not read back from the page's data.
"""

import os
import re
import shutil
import time
from collections import Counter

import pytest

from kaun_ir.ir.core import path_components
from kaun_ir.tools import cli, dump, spec

MLP = "kaun_ir.tools.examples:mlp"
BLOCK = "kaun_ir.tools.examples:transformer_block"


def find_chromium():
    explicit = os.environ.get("KAUN_IR_CHROMIUM")
    if explicit:
        return explicit
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(
            "Playwright is not installed (pip install playwright); the page is not tested in a browser"
        )
    executable = find_chromium()
    if executable is None:
        pytest.skip(
            "no Chromium found (install chromium or set KAUN_IR_CHROMIUM); "
            "the page is not tested in a browser"
        )
    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=executable)
    except Exception as err:  # a browser that cannot start here (missing libraries, sandbox)
        playwright.stop()
        pytest.skip(f"cannot start {executable}: {str(err).splitlines()[0]}")
    yield chromium
    chromium.close()
    playwright.stop()


class Page:
    """A page of ``kaun-ir viz`` open in the browser, collecting console errors and page errors."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1400, "height": 900})
        self.errors = []
        self.page.on("console", lambda msg: self.errors.append(msg.text) if msg.type == "error" else None)
        self.page.on("pageerror", lambda err: self.errors.append(str(err)))
        start = time.perf_counter()
        self.page.goto(path.as_uri())
        self.page.wait_for_function("window.kaunViz && window.kaunViz.ready")
        self.load_seconds = time.perf_counter() - start

    def attrs(self, selector, name):
        return self.page.eval_on_selector_all(selector, f"els => els.map(e => e.getAttribute({name!r}))")

    def count(self, selector):
        return self.page.locator(selector).count()

    def close(self):
        self.page.close()


def write_page(tmp_path, name, *args):
    path = tmp_path / f"{name}.html"
    assert cli.main(["viz", *args, "-o", str(path)]) == 0
    return path


def top_level_groups(graph):
    """The page's top-level groups: the first layer of every node's path (plus "(inputs)" /
    "(outputs)" when a graph has more than 16 of them, as docs/visualisation.md says)."""
    groups = {path_components(node.path)[0] for node in graph.nodes if node.path}
    if len(graph.inputs) > 16:
        groups.add("(inputs)")
    if len(graph.outputs) > 16:
        groups.add("(outputs)")
    return groups


# ------------------------------------------------------------------ the MLP page


def test_mlp_page(browser, tmp_path):
    graph = spec.resolve(MLP).stage_graph("traced")
    page = Page(browser, write_page(tmp_path, "mlp", MLP))
    try:
        # a small graph that fits the window readably starts fully expanded: every input, op and
        # output is a box
        assert page.count("[data-node-id]") == len(graph.inputs) + len(graph.nodes) + len(graph.outputs)

        # the page adds exactly one global (compared with an empty page from the same kind of origin)
        empty = tmp_path / "empty.html"
        empty.write_text("<!DOCTYPE html><title>empty</title>")
        blank = browser.new_page()
        blank.goto(empty.as_uri())
        baseline = set(blank.evaluate("Object.keys(window)"))
        blank.close()
        assert set(page.page.evaluate("Object.keys(window)")) - baseline == {"kaunViz"}

        # collapse all: one box per top-level layer, only the inputs and outputs stay nodes
        page.page.click("#collapse-all")
        expected = top_level_groups(graph)
        assert sorted(page.attrs('.group[data-depth="0"]', "data-group")) == sorted(expected)
        assert set(page.attrs(".group", "data-expanded")) == {"false"}
        assert page.count("[data-node-id]") == len(graph.inputs) + len(graph.outputs)
        counts = Counter(path_components(n.path)[0] for n in graph.nodes if n.path)
        for key, shown in zip(page.attrs(".group", "data-group"), page.attrs(".group", "data-count")):
            assert int(shown) == counts[key]

        # expanding a group shows its ops
        page.page.click('[data-toggle="1.relu"]')
        assert page.attrs('[data-group="1.relu"]', "data-expanded") == ["true"]
        relu_ops = sorted(n.op for n in graph.nodes if n.path == "1.relu")
        assert sorted(page.attrs('.node[data-path="1.relu"]', "data-op")) == relu_ops
        assert page.count("[data-node-id]") == len(graph.inputs) + len(graph.outputs) + len(relu_ops)

        # search by op name: the group of the match opens, the match is highlighted and centred
        page.page.click("#collapse-all")
        page.page.fill("#search", "dot_general")
        page.page.press("#search", "Enter")
        matches = sum(1 for n in graph.nodes if n.op == "dot_general")
        assert page.page.text_content("#count") == f"1 / {matches} matches"
        current = page.page.locator(".node.current")
        assert current.get_attribute("data-op") == "dot_general"
        first = next(n for n in graph.nodes if n.op == "dot_general")
        assert current.get_attribute("data-path") == first.path
        box, svg = current.bounding_box(), page.page.locator(".canvas").bounding_box()
        assert abs(box["x"] + box["width"] / 2 - (svg["x"] + svg["width"] / 2)) < 5
        assert abs(box["y"] + box["height"] / 2 - (svg["y"] + svg["height"] / 2)) < 5
        page.page.press("#search", "Enter")  # Enter again: the next match
        assert page.page.text_content("#count") == f"2 / {matches} matches"

        # search by input name (inputs are named by argument and parameter path) and by layer path
        page.page.fill("#search", "params.2.weight")
        page.page.press("#search", "Enter")
        assert page.page.locator(".node.current").get_attribute("data-op") == "input"
        page.page.fill("#search", "2.linear")
        page.page.press("#search", "Enter")
        in_layer = sum(n.path == "2.linear" for n in graph.nodes)
        assert page.page.text_content("#count") == f"1 / {in_layer} matches"

        # clicking a node shows its op, types, attributes, layer path and source line
        page.page.fill("#search", "")
        page.page.press("#search", "Enter")
        page.page.click("#fit")  # the whole graph in view, so the click below hits what a user sees
        node_index = [n.op for n in graph.nodes].index("dot_general")
        node = graph.nodes[node_index]
        page.page.locator(f'[data-node-id="n{node_index}"]').click()
        details = page.page.locator("#details")
        assert details.get_attribute("data-selected-node") == f"n{node_index}"

        def cell(key):
            return details.locator(f'tr[data-key="{key}"] td.v').text_content()

        assert cell("op") == "dot_general"
        assert cell("layer path") == node.path
        assert cell("result types") == ", ".join(str(t) for t in node.types)
        assert cell("lhs_contracting") == "[1]" and cell("rhs_contracting") == "[0]"
        assert cell("source") == node.source and re.fullmatch(r".+\.py:\d+", node.source)
        assert page.count(".edge.near") == len(node.inputs) + 1  # its operands and its one user
        assert page.errors == []
    finally:
        page.close()


def test_nested_groups_and_pan_zoom(browser, tmp_path):
    graph = spec.resolve(BLOCK).stage_graph("traced")
    page = Page(browser, write_page(tmp_path, "block", BLOCK))
    try:
        page.page.click("#collapse-all")
        page.page.dblclick('[data-group="0.residual"]')  # double-click expands too
        inside = [path_components(n.path) for n in graph.nodes if n.path.startswith("0.residual")]
        direct = sum(1 for parts in inside if len(parts) == 1)
        children = {"0.residual/" + parts[1] for parts in inside if len(parts) > 1}
        assert page.count('.node[data-path="0.residual"]') == direct
        subgroups = page.attrs('.group[data-depth="1"]', "data-group")
        assert set(subgroups) == children
        assert set(page.attrs('.group[data-depth="1"]', "data-expanded")) == {"false"}  # sub-groups collapsed

        # zoom with the buttons and the wheel, pan by dragging
        def zoom():
            return page.page.evaluate("kaunViz.views()[0].zoom")

        before = zoom()
        page.page.click("#zoom-in")
        assert zoom() == pytest.approx(before * 1.25)
        svg = page.page.locator(".canvas").bounding_box()
        page.page.mouse.move(svg["x"] + 300, svg["y"] + 300)
        page.page.mouse.wheel(0, 200)
        assert zoom() < before * 1.25
        viewport = page.page.locator(".viewport")
        start = viewport.get_attribute("transform")
        page.page.mouse.down()
        page.page.mouse.move(svg["x"] + 400, svg["y"] + 350, steps=5)
        page.page.mouse.up()
        moved = viewport.get_attribute("transform")
        tx0, ty0 = map(float, re.match(r"translate\(([-\d.]+),([-\d.]+)\)", start).groups())
        tx1, ty1 = map(float, re.match(r"translate\(([-\d.]+),([-\d.]+)\)", moved).groups())
        assert (tx1 - tx0, ty1 - ty0) == (pytest.approx(100, abs=1), pytest.approx(50, abs=1))

        page.page.click("#expand-all")
        assert page.count("[data-node-id]") == len(graph.inputs) + len(graph.nodes) + len(graph.outputs)
        assert page.errors == []
    finally:
        page.close()


# ------------------------------------------------------------------ --diff


def signature(graph, kind, i):
    """What a node is compared by (docs/visualisation.md): op, layer path, attributes, result
    and operand types; graph inputs by name and type, outputs by index and type."""
    from kaun_ir.ir.text import format_attr

    if kind == "input":
        return ("input", graph.input_names[i] if graph.input_names else str(i), str(graph.inputs[i].type))
    if kind == "output":
        return ("output", i, str(graph.outputs[i].type))
    n = graph.nodes[i]
    return (
        n.op,
        n.path,
        tuple((k, v if isinstance(v, str) else format_attr(v)) for k, v in n.attrs),
        tuple(map(str, n.types)),
        tuple(str(v.type) for v in n.inputs),
        tuple(r.text() for r in n.regions),
    )


def all_signatures(graph):
    return (
        [signature(graph, "input", i) for i in range(len(graph.inputs))]
        + [signature(graph, "node", k) for k in range(len(graph.nodes))]
        + [signature(graph, "output", i) for i in range(len(graph.outputs))]
    )


def test_diff_page(browser, tmp_path):
    subject = spec.resolve(BLOCK)
    a, b = subject.stage_graph("traced"), subject.stage_graph("optimized")
    sig_a, sig_b = Counter(all_signatures(a)), Counter(all_signatures(b))
    removed, added = sum((sig_a - sig_b).values()), sum((sig_b - sig_a).values())
    assert removed > 0  # the optimizer changes this block, so the marks below mean something
    page = Page(browser, write_page(tmp_path, "diff", BLOCK, "--diff", "traced", "optimized"))
    try:
        assert page.count(".view") == 2
        assert int(page.page.text_content("#diff-removed")) == removed
        assert int(page.page.text_content("#diff-added")) == added
        page.page.click("#expand-all")
        assert page.count('[data-view="0"] [data-diff="removed"]') == removed
        assert page.count('[data-view="1"] [data-diff="added"]') == added
        assert page.count('[data-view="0"] [data-diff="added"]') == 0
        assert page.count('[data-view="1"] [data-diff="removed"]') == 0
        # collapsed, every top-level layer reports how many of its ops were removed
        per_layer = Counter(
            path_components(sig[1])[0]
            for sig in (sig_a - sig_b).elements()
            if sig[0] not in ("input", "output") and sig[1]
        )
        page.page.click("#collapse-all")
        shown = dict(
            zip(
                page.attrs('[data-view="0"] .group', "data-group"),
                page.attrs('[data-view="0"] .group', "data-removed"),
            )
        )
        layer_counts = {key: int(count) for key, count in shown.items() if count and key in per_layer}
        assert layer_counts == dict(per_layer)
        top = page.count('[data-view="0"] .node[data-diff="removed"]')
        assert sum(int(count or 0) for count in shown.values()) + top == removed
        assert page.errors == []
    finally:
        page.close()


# ------------------------------------------------------------------ --overlay


def luminance(color):
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return 0.299 * r + 0.587 * g + 0.114 * b


def test_overlay_page(browser, tmp_path):
    graph = spec.resolve("kaun_ir.tools.examples:cnn").stage_graph("traced")
    page = Page(
        browser, write_page(tmp_path, "cnn_flops", "kaun_ir.tools.examples:cnn", "--overlay", "flops")
    )
    try:
        page.page.click("#expand-all")  # every op drawn (the page may start with groups collapsed)
        legend = page.page.locator("#legend")
        assert legend.is_visible() and "FLOPs" in legend.text_content()
        assert legend.locator(".bar").count() == 1
        flops = {f"n{k}": dump.node_cost(n)[0] for k, n in enumerate(graph.nodes)}
        ids = page.attrs(".node[data-cost]", "data-node-id")
        costs = page.attrs(".node[data-cost]", "data-cost")
        fills = page.page.eval_on_selector_all(
            ".node[data-cost] rect", "els => els.map(e => e.getAttribute('fill'))"
        )
        shown = {i: (int(c), f) for i, c, f in zip(ids, costs, fills) if i.startswith("n")}
        assert {i: c for i, (c, _) in shown.items()} == flops
        # a log scale: a costlier node is never lighter, and there are several shades
        ordered = sorted(shown.values())
        assert all(luminance(f1) >= luminance(f2) for (_, f1), (_, f2) in zip(ordered, ordered[1:]))
        assert len({f for _, f in ordered if _ > 0}) >= 4
        assert page.errors == []
    finally:
        page.close()


def test_comm_overlay_page(browser, tmp_path):
    from kaun_ir.ir.text import parse
    from kaun_ir.tools.viz.html import render_html

    graph = parse(
        'graph @step(%0: f32[8@data,16] "x", %1: f32[16,4@model] "w") -> (f32[8@data,4@model]) {\n'
        "  %2 = dot_general %0, %1 {lhs_batch = [], lhs_contracting = [1], preferred_dtype = none, "
        'rhs_batch = [], rhs_contracting = [0]} : f32[8@data,4@model] loc("0.linear")\n'
        '  %3 = tanh %2 : f32[8@data,4@model] loc("1.tanh")\n'
        '  %4 = add %3, %3 : f32[8@data,4@model] loc("1.tanh")\n'
        "  return %4\n"
        "}\n"
    )
    comm = {"n0": 4096.0, "n2": 16.0}  # bytes the nodes' collectives send (an input of the page)
    path = tmp_path / "comm.html"
    path.write_text(render_html(graph, "partitioned", "comm", comm), encoding="utf-8")
    page = Page(browser, path)
    try:
        page.page.click("#expand-all")
        assert "collectives" in page.page.locator("#legend").text_content()
        ids = page.attrs(".node[data-cost]", "data-node-id")
        costs = page.attrs(".node[data-cost]", "data-cost")
        shown = {i: float(c) for i, c in zip(ids, costs) if i.startswith("n")}
        assert shown == {"n0": 4096.0, "n1": 0.0, "n2": 16.0}
        assert page.errors == []
    finally:
        page.close()


# ------------------------------------------------------------------ the start state


def drawing_fits(page) -> bool:
    """Whether the whole drawing lies inside the canvas (the view is fitted to the window)."""
    drawing = page.page.locator(".canvas .viewport").bounding_box()
    canvas = page.page.locator(".canvas").bounding_box()
    return (
        drawing["x"] >= canvas["x"] - 1
        and drawing["y"] >= canvas["y"] - 1
        and drawing["x"] + drawing["width"] <= canvas["x"] + canvas["width"] + 1
        and drawing["y"] + drawing["height"] <= canvas["y"] + canvas["height"] + 1
    )


@pytest.mark.parametrize("example", ["train_step_mlp", "transformer_train_step"])
def test_a_training_step_opens_on_the_model_fitted_to_the_window(browser, tmp_path, example):
    """The random-key and optimiser groups a training step adds start collapsed (at every depth:
    each layer derives its own keys too), the model's layers open, and the view is fitted."""
    target = f"kaun_ir.tools.examples:{example}"
    graph = spec.resolve(target).stage_graph("autodiff")
    page = Page(browser, write_page(tmp_path, example, target, "--stage", "autodiff"))
    try:
        groups = page.attrs(".group", "data-group")
        expanded = dict(zip(groups, page.attrs(".group", "data-expanded")))
        bookkeeping = {g for g in groups if g.rsplit("/", 1)[-1] in ("rng", "optimizer")}
        assert "rng" in bookkeeping and "optimizer" in bookkeeping
        assert {expanded[g] for g in bookkeeping} == {"false"}, expanded
        layers = {path_components(n.path)[0] for n in graph.nodes if n.path} - {
            "rng",
            "optimizer",
            "loss",
        }
        assert any(expanded.get(g) == "true" for g in layers), expanded
        assert drawing_fits(page)
        assert page.page.evaluate("kaunViz.views()[0].zoom") >= 0.6  # and readable
        assert page.errors == []
    finally:
        page.close()


# ------------------------------------------------------------------ a big graph


def test_big_graph_loads_collapsed(browser, tmp_path, record_property):
    """The 12-block transformer's training step (tens of thousands of nodes) starts with its
    top-level groups collapsed; the load time is reported, not asserted."""
    from kaun_ir.tools.viz import html as viz_html

    subject = spec.resolve("kaun_ir.tools.examples:transformer_train_step_12")
    graph = subject.stage_graph("autodiff")
    path = tmp_path / "big.html"
    path.write_text(viz_html.render_html(graph, "autodiff"))
    page = Page(browser, path)
    try:
        total = len(graph.inputs) + len(graph.nodes) + len(graph.outputs)
        timings = page.page.evaluate("kaunViz.timings")
        record_property("nodes", total)
        record_property("load_seconds", round(page.load_seconds, 3))
        print(
            f"\n{total} nodes ({path.stat().st_size / 1e6:.1f} MB page): loaded in "
            f"{page.load_seconds:.2f} s (parse {timings['parseMs']:.0f} ms, "
            f"first layout and drawing {timings['firstRenderMs']:.0f} ms)"
        )
        expected = top_level_groups(graph)
        assert sorted(page.attrs('.group[data-depth="0"]', "data-group")) == sorted(expected)
        groups = page.attrs(".group", "data-group")
        expanded = {g for g, e in zip(groups, page.attrs(".group", "data-expanded")) if e == "true"}
        # the start rule opens top-level groups in execution order only while at most 200 boxes
        # show: most transformer blocks stay closed, and so do the gathered inputs and outputs
        blocks = [g for g in groups if "/" not in g and g.endswith(".block")]
        assert len(blocks) == 12 and sum(g in expanded for g in blocks) <= 6, expanded
        assert "(inputs)" not in expanded and "(outputs)" not in expanded
        assert page.count("[data-node-id]") + page.count('.group[data-expanded="false"]') <= 200
        shown = 0
        for n in graph.nodes:
            parts = path_components(n.path)
            shown += all("/".join(parts[: i + 1]) in expanded for i in range(len(parts)))
        assert page.count("[data-node-id]") == shown  # inputs and outputs are in their groups
        # a search opens the groups of its match
        page.page.fill("#search", "5.block")
        page.page.press("#search", "Enter")
        assert page.page.locator(".node.current").get_attribute("data-path").startswith("5.block")
        assert page.errors == []
    finally:
        page.close()
