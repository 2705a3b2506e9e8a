/* kaun-ir viz: the interactive page (inlined into the .html by tools/viz/html.py).
 *
 * The graph data (see html.page_graph) is embedded as JSON. Every node belongs to a chain of
 * layer groups; a group is either collapsed (one box, its edges aggregated) or expanded (a frame
 * around its ops and sub-groups). Only the visible graph is laid out, recursively: inside every
 * expanded group its units (ops and child groups) get layered ranks (longest path over the edges
 * between them, taken in execution order so that cycles through a collapsed group cannot occur)
 * and are ordered within a rank by the barycentre of their neighbours.
 *
 * The page defines one global, window.kaunViz, for scripting and tests.
 */
(function () {
  "use strict";
  const started = performance.now();
  const DATA = JSON.parse(document.getElementById("kir-data").textContent);
  const parsedAt = performance.now();

  const CHAR_W = 6.6, NODE_H = 34, GROUP_H = 40, GAP_X = 20, GAP_Y = 36, PAD = 12, HEADER = 22;
  const PALETTE = ["#dbeafe", "#dcfce7", "#fef9c3", "#fce7f3", "#ede9fe", "#ffedd5", "#cffafe", "#e0e7ff",
                   "#fee2e2", "#ecfccb"];
  const IO_COLOR = "#e5e7eb", ZERO_COLOR = "#f3f4f6";
  const COST_STOPS = ["#fff7bc", "#fee391", "#fec44f", "#fe9929", "#ec7014", "#cc4c02", "#8c2d04"];
  const READABLE_ZOOM = 0.6;  // below this zoom the labels of the boxes are too small to read
  const MANY_MATCHES = 25;  // up to this many search matches all get their groups expanded
  let NS = null;  // the SVG namespace, read from an element the HTML parser created

  const state = {
    expanded: new Set(),  // keys of expanded groups, shared by the views of a diff
    selected: null,       // {view, item} (item: a node or a group)
    query: "", matches: [], current: -1,
  };

  // ------------------------------------------------------------------ the model

  function buildView(graph, index) {
    const root = {isGroup: true, isRoot: true, index: -1, key: "", name: graph.name, depth: -1, parent: null,
                  children: [], nodes: [], chain: [], uid: "g-1"};
    const groups = graph.groups.map(function (pair, i) {
      return {isGroup: true, index: i, name: pair[1], parentIndex: pair[0], children: [], nodes: [],
              count: 0, ops: {}, cost: [0, 0, 0], added: 0, removed: 0, first: Infinity, uid: "g" + i};
    });
    groups.forEach(function (g) {  // parents come before their children in the list
      g.parent = g.parentIndex < 0 ? root : groups[g.parentIndex];
      g.parent.children.push(g);
      g.depth = g.parent.depth + 1;
      g.key = g.parent.isRoot ? g.name : g.parent.key + "/" + g.name;
      g.chain = g.parent.chain.concat([g]);
      g.top = g.chain[0];
      g.io = g.key === "(inputs)" || g.key === "(outputs)";
    });
    const nodes = graph.nodes.map(function (n, i) {
      const group = n.g < 0 ? root : groups[n.g];
      const node = {isNode: true, index: i, data: n, id: n.id, group: group, chain: group.chain,
                    first: i, uid: "n" + i};
      group.nodes.push(node);
      group.chain.forEach(function (g) {
        g.count += 1;
        g.ops[n.op] = (g.ops[n.op] || 0) + 1;
        g.cost[0] += n.cost[0];
        g.cost[1] += n.cost[1];
        g.cost[2] += n.cost[2] || 0;
        if (n.diff === "added") { g.added += 1; }
        if (n.diff === "removed") { g.removed += 1; }
        if (i < g.first) { g.first = i; }
      });
      return node;
    });
    // the units of a group in execution order: its own nodes and its child groups
    [root].concat(groups).forEach(function (g) {
      g.units = g.nodes.concat(g.children).sort(function (a, b) { return a.first - b.first; });
    });
    const topLevel = root.children.filter(function (g) { return !g.io; });
    const colors = {};
    topLevel.forEach(function (g, k) { colors[g.uid] = PALETTE[k % PALETTE.length]; });
    return {index: index, graph: graph, root: root, groups: groups, nodes: nodes, colors: colors,
            byId: new Map(nodes.map(function (n) { return [n.id, n]; })),
            byKey: new Map(groups.map(function (g) { return [g.key, g]; })),
            tx: 0, ty: 0, k: 1, width: 0, height: 0, elements: new Map(), drawnEdges: [], lastRenderMs: 0};
  }

  function isExpanded(group) { return group.isRoot || state.expanded.has(group.key); }

  /** The box a node is drawn in: the node itself, or its outermost collapsed group. */
  function leafOf(node) {
    const chain = node.chain;
    for (let i = 0; i < chain.length; i++) {
      if (!state.expanded.has(chain[i].key)) { return {leaf: chain[i], depth: i + 1}; }
    }
    return {leaf: node, depth: chain.length};
  }

  /** How many boxes would be visible with the current expanded set. */
  function visibleCount(view) {
    let count = 0;
    (function walk(g) {
      g.units.forEach(function (u) {
        if (u.isGroup && isExpanded(u)) { walk(u); } else { count += 1; }
      });
    })(view.root);
    return count;
  }

  function startsCollapsed(group) { return DATA.startCollapsed.indexOf(group.name) >= 0; }

  /** Start state: expand groups breadth first (in execution order) while at most
   *  DATA.startVisibleLimit boxes are visible; "(inputs)", "(outputs)" and the bookkeeping
   *  groups named in DATA.startCollapsed ("rng" ...) stay collapsed. The views of a diff share
   *  their expanded groups, so a group opens only if it fits in both. Returns the expanded
   *  keys in the order they were expanded. */
  function startExpanded() {
    const visible = views.map(function (v) { return v.root.units.length; });
    const queue = [];
    const order = [];
    const seen = new Set();
    function enqueue(groups) {
      groups.forEach(function (g) {
        if (!g.io && !startsCollapsed(g) && !seen.has(g.key)) { seen.add(g.key); queue.push(g.key); }
      });
    }
    views.forEach(function (v) { enqueue(v.root.children); });
    while (queue.length) {
      const key = queue.shift();
      const after = views.map(function (v, i) {
        const g = v.byKey.get(key);
        return g ? visible[i] - 1 + g.units.length : visible[i];
      });
      if (after.every(function (n) { return n <= DATA.startVisibleLimit; })) {
        state.expanded.add(key);
        order.push(key);
        after.forEach(function (n, i) { visible[i] = n; });
        views.forEach(function (v) { const g = v.byKey.get(key); if (g) { enqueue(g.children); } });
      }
    }
    return order;
  }

  /** Keep the first expansions of the start state (order, as rendered now): as many as leave
   *  the whole drawing readable when fitted to the window (zoom at least READABLE_ZOOM in every
   *  view). A binary search over how many, one layout per step; the top level always stays. */
  function keepReadable(order) {
    const fits = function () { return views.every(function (v) { return fittedZoom(v) >= READABLE_ZOOM; }); };
    function readable(count) {
      state.expanded = new Set(order.slice(0, count));
      renderAll();
      return fits();
    }
    if (fits()) { return; }
    let lo = 0, hi = order.length - 1;  // the answer lies in [lo, hi]
    while (lo < hi) {
      const mid = Math.ceil((lo + hi) / 2);
      if (readable(mid)) { lo = mid; } else { hi = mid - 1; }
    }
    readable(lo);
  }

  // ------------------------------------------------------------------ layout

  function textWidth(text) { return text.length * CHAR_W; }

  function typesLine(n) {
    const text = n.types.join(", ");
    return text.length > 60 ? text.slice(0, 57) + "..." : text;
  }

  function countLabel(g) {
    const noun = g.key === "(inputs)" ? "inputs" : g.key === "(outputs)" ? "outputs" : "ops";
    return g.count + " " + noun;
  }

  /** Edges between visible boxes: per expanded group the edges between its units (for its
   *  layout), and the edges to draw between leaf boxes (aggregated, with a count). */
  function connect(view) {
    view.nodes.forEach(function (n) { const l = leafOf(n); n.leaf = l.leaf; n.leafDepth = l.depth; });
    const levelEdges = new Map();
    const drawn = new Map();
    view.graph.edges.forEach(function (e) {
      const s = view.nodes[e[0]], t = view.nodes[e[1]];
      if (s.leaf === t.leaf) { return; }  // inside one collapsed group
      const cs = s.chain, ct = t.chain, ls = s.leafDepth, lt = t.leafDepth;
      let k = 0;
      while (k < ls && k < lt && cs[k] === ct[k]) { k += 1; }
      const level = k === 0 ? view.root : cs[k - 1];
      const us = k < ls ? cs[k] : s, ut = k < lt ? ct[k] : t;
      let edges = levelEdges.get(level);
      if (!edges) { edges = new Map(); levelEdges.set(level, edges); }
      edges.set(us.uid + ">" + ut.uid, [us, ut]);
      const key = s.leaf.uid + ">" + t.leaf.uid;
      const d = drawn.get(key);
      if (d) {
        d.count += 1;
        if (d.types.length < 4 && d.types.indexOf(e[2]) < 0) { d.types.push(e[2]); }
      } else {
        drawn.set(key, {from: s.leaf, to: t.leaf, count: 1, types: [e[2]]});
      }
    });
    view.levelEdges = levelEdges;
    view.drawnEdges = Array.from(drawn.values());
  }

  /** Sizes and positions (relative to the group's content box) of an expanded group's units. */
  function layoutGroup(view, g) {
    const units = g.units;
    units.forEach(function (u, i) {
      u.ord = i; u.preds = []; u.succs = []; u.rank = 0;
      if (u.isNode) {
        u.w = Math.max(textWidth(u.data.title), textWidth(typesLine(u.data))) + 16;
        u.h = NODE_H;
      } else if (isExpanded(u)) {
        layoutGroup(view, u);
      } else {
        u.w = Math.max(textWidth(u.name) * 1.1, textWidth(countLabel(u))) + 36;
        u.h = GROUP_H;
      }
    });
    // ranks: the longest path over the edges that go forward in execution order
    (view.levelEdges.get(g) || new Map()).forEach(function (pair) {
      const a = pair[0], b = pair[1];
      if (a.ord < b.ord) { b.preds.push(a); a.succs.push(b); }
    });
    units.forEach(function (u) {
      u.preds.forEach(function (p) { if (p.rank + 1 > u.rank) { u.rank = p.rank + 1; } });
    });
    // a source (a parameter, a constant) sits just above its first consumer, not at the top
    for (let i = units.length - 1; i >= 0; i--) {
      const u = units[i];
      if (!u.preds.length && u.succs.length) {
        let first = Infinity;
        u.succs.forEach(function (s) { if (s.rank < first) { first = s.rank; } });
        u.rank = Math.max(0, first - 1);
      }
    }
    const rows = [];
    units.forEach(function (u) { (rows[u.rank] = rows[u.rank] || []).push(u); });
    const filled = rows.filter(function (r) { return r && r.length; });
    filled.forEach(function (row, r) { row.forEach(function (u) { u.rank = r; }); });

    function pack(row) {  // x centres, the row centred on 0
      let width = GAP_X * (row.length - 1);
      row.forEach(function (u) { width += u.w; });
      let x = -width / 2;
      row.forEach(function (u) { u.cx = x + u.w / 2; x += u.w + GAP_X; });
      return width;
    }
    filled.forEach(pack);

    function sweep(order, neighbours) {
      order.forEach(function (row) {
        row.forEach(function (u) {
          const near = u[neighbours];
          if (near.length) {
            let sum = 0;
            near.forEach(function (v) { sum += v.cx; });
            u.bary = sum / near.length;
          } else {
            u.bary = u.cx;
          }
        });
        row.sort(function (a, b) { return a.bary - b.bary; });
        pack(row);
      });
    }
    for (let pass = 0; pass < 2; pass++) {
      sweep(filled.slice(1), "preds");
      sweep(filled.slice(0, -1).reverse(), "succs");
    }
    sweep(filled.slice(1), "preds");

    let width = 0, y = 0;
    const widths = filled.map(pack);
    widths.forEach(function (w) { if (w > width) { width = w; } });
    filled.forEach(function (row) {
      let h = 0;
      row.forEach(function (u) { u.x = u.cx - u.w / 2 + width / 2; u.y = y; if (u.h > h) { h = u.h; } });
      y += h + GAP_Y;
    });
    const header = g.isRoot ? 0 : HEADER;
    g.contentW = width;
    g.w = Math.max(width + 2 * PAD, textWidth(g.name + "  " + countLabel(g)) + 40);
    g.h = header + Math.max(y - GAP_Y, 0) + 2 * PAD;
    g.header = header;
  }

  function place(g, x, y) {
    g.ax = x; g.ay = y;
    const ox = x + (g.w - g.contentW) / 2, oy = y + g.header + PAD;
    g.units.forEach(function (u) {
      if (u.isGroup && isExpanded(u)) {
        place(u, ox + u.x, oy + u.y);
      } else {
        u.ax = ox + u.x;
        u.ay = oy + u.y;
      }
    });
  }

  // ------------------------------------------------------------------ colours

  const overlay = DATA.overlay;  // null, "flops", "bytes" or "comm"
  let costScale = null;

  function makeCostScale() {
    const metric = overlay === "flops" ? 0 : overlay === "bytes" ? 1 : 2;
    let lo = Infinity, hi = 0;
    views.forEach(function (v) {
      v.nodes.forEach(function (n) {
        const c = n.data.cost[metric];
        if (c > 0 && c < lo) { lo = c; }
        if (c > hi) { hi = c; }
      });
      v.groups.forEach(function (g) { if (g.cost[metric] > hi) { hi = g.cost[metric]; } });
    });
    if (!(lo < Infinity)) { lo = 1; hi = 1; }
    return {metric: metric, lo: lo, hi: hi};
  }

  function costColor(value) {
    if (!(value > 0)) { return ZERO_COLOR; }
    const a = Math.log10(costScale.lo), b = Math.log10(costScale.hi);
    const t = b > a ? Math.min(1, Math.max(0, (Math.log10(value) - a) / (b - a))) : 1;
    const pos = t * (COST_STOPS.length - 1), i = Math.min(Math.floor(pos), COST_STOPS.length - 2);
    return mix(COST_STOPS[i], COST_STOPS[i + 1], pos - i);
  }

  function mix(c1, c2, f) {
    const p = function (c, k) { return parseInt(c.slice(1 + 2 * k, 3 + 2 * k), 16); };
    let out = "#";
    for (let k = 0; k < 3; k++) {
      const v = Math.round(p(c1, k) + (p(c2, k) - p(c1, k)) * f);
      out += (v < 16 ? "0" : "") + v.toString(16);
    }
    return out;
  }

  function isDark(color) {
    const channel = function (k) { return parseInt(color.slice(1 + 2 * k, 3 + 2 * k), 16); };
    return 0.299 * channel(0) + 0.587 * channel(1) + 0.114 * channel(2) < 120;
  }

  function fillOf(view, item) {
    if (overlay) {
      return costColor(item.isNode ? item.data.cost[costScale.metric] : item.cost[costScale.metric]);
    }
    const top = item.isNode ? item.chain[0] : item.top;
    return (top && view.colors[top.uid]) || IO_COLOR;
  }

  function human(value) {
    const units = ["", "k", "M", "G", "T", "P"];
    let k = 0;
    while (value >= 1000 && k < units.length - 1) { value /= 1000; k += 1; }
    return (value >= 100 || k === 0 ? Math.round(value) : value.toPrecision(3)) + units[k];
  }

  function drawLegend() {
    const legend = document.getElementById("legend");
    if (!overlay) { return; }
    const what = overlay === "flops" ? "estimated FLOPs" : overlay === "bytes" ? "estimated bytes moved"
      : "bytes sent per device by collectives";
    const mid = Math.sqrt(costScale.lo * costScale.hi);
    legend.innerHTML = "";
    legend.appendChild(el("span", {"class": "what"}, what + " (log scale):"));
    legend.appendChild(el("span", {"class": "zero", style: "background:" + ZERO_COLOR}));
    legend.appendChild(el("span", {}, "0"));
    legend.appendChild(el("span", {"class": "lo"}, human(costScale.lo)));
    legend.appendChild(el("span", {"class": "bar", style: "background: linear-gradient(to right, " +
                                   COST_STOPS.join(", ") + ")"}));
    legend.appendChild(el("span", {"class": "hi"}, human(costScale.hi)));
    legend.setAttribute("title", "middle of the bar: " + human(mid) + "; a collapsed group shows its total");
  }

  // ------------------------------------------------------------------ drawing

  function el(tag, attrs, text) {
    const e = document.createElement(tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function svgEl(tag, attrs, text) {
    const e = document.createElementNS(NS, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) { e.textContent = text; }
    return e;
  }

  function f1(x) { return x.toFixed(1); }

  function drawToggle(parent, x, y, sign, key) {
    const t = svgEl("g", {"class": "toggle", "data-toggle": key});
    t.appendChild(svgEl("rect", {x: f1(x), y: f1(y), width: 14, height: 14, rx: 2}));
    t.appendChild(svgEl("text", {x: f1(x + 7), y: f1(y + 11), "text-anchor": "middle"}, sign));
    t.appendChild(svgEl("title", {}, (sign === "+" ? "expand " : "collapse ") + key));
    parent.appendChild(t);
  }

  function draw(view) {
    const frames = svgEl("g", {"class": "frames"});
    const edges = svgEl("g", {"class": "edges"});
    const leaves = svgEl("g", {"class": "leaves"});
    view.elements = new Map();

    (function frame(g) {
      g.units.forEach(function (u) {
        if (u.isGroup && isExpanded(u)) {
          const e = svgEl("g", {"class": "group expanded", "data-group": u.key, "data-expanded": "true",
                                "data-count": u.count, "data-depth": u.depth});
          e.appendChild(svgEl("rect", {"class": "frame", x: f1(u.ax), y: f1(u.ay), width: f1(u.w),
                                       height: f1(u.h), rx: 6, fill: overlay ? "#f9fafb" : fillOf(view, u)}));
          e.appendChild(svgEl("text", {"class": "title", x: f1(u.ax + 24), y: f1(u.ay + 15)},
                              u.name + "  (" + countLabel(u) + ")"));
          e.appendChild(svgEl("title", {}, u.key));
          drawToggle(e, u.ax + 5, u.ay + 4, "\u2212", u.key);
          frames.appendChild(e);
          view.elements.set(u.uid, e);
          frame(u);
        } else if (u.isGroup) {
          leaves.appendChild(drawGroupBox(view, u));
        } else {
          leaves.appendChild(drawNode(view, u));
        }
      });
    })(view.root);

    view.drawnEdges.forEach(function (d) {
      const a = d.from, b = d.to;
      const x1 = a.ax + a.w / 2, y1 = a.ay + a.h, x2 = b.ax + b.w / 2, y2 = b.ay;
      const back = y2 < y1 + 4;
      const bend = back ? 60 : Math.max((y2 - y1) / 2, 12);
      const path = svgEl("path", {
        "class": back ? "edge back" : "edge", "data-from": a.isNode ? a.id : "group:" + a.key,
        "data-to": b.isNode ? b.id : "group:" + b.key,
        d: "M" + f1(x1) + "," + f1(y1) + " C" + f1(x1) + "," + f1(y1 + bend) + " " + f1(x2) + "," +
           f1(y2 - bend) + " " + f1(x2) + "," + f1(y2),
        "marker-end": "url(#arrow-" + view.index + ")",
        "stroke-width": d.count > 1 ? Math.min(1 + Math.log2(d.count), 5).toFixed(1) : "1"});
      path.appendChild(svgEl("title", {}, (d.count > 1 ? d.count + " values: " : "") + d.types.join(", ") +
                                          (d.types.length < d.count && d.count > 4 ? ", ..." : "")));
      d.element = path;
      edges.appendChild(path);
    });

    const viewport = view.viewport;
    viewport.textContent = "";
    viewport.appendChild(frames);
    viewport.appendChild(edges);
    viewport.appendChild(leaves);
    applyMarks(view);
  }

  function drawNode(view, n) {
    const d = n.data;
    const attrs = {"class": "node", "data-node-id": d.id, "data-op": d.op, "data-path": d.path};
    if (d.diff) { attrs["data-diff"] = d.diff; }
    if (overlay) { attrs["data-cost"] = d.cost[costScale.metric]; }
    const fill = fillOf(view, n);
    const e = svgEl("g", attrs);
    if (isDark(fill)) { e.classList.add("dark"); }
    e.appendChild(svgEl("title", {}, d.title + (d.path ? " @ " + d.path : "")));
    e.appendChild(svgEl("rect", {x: f1(n.ax), y: f1(n.ay), width: f1(n.w), height: NODE_H,
                                 rx: d.op === "input" || d.op === "output" ? 12 : 4, fill: fill}));
    const mid = f1(n.ax + n.w / 2);
    e.appendChild(svgEl("text", {"class": "title", x: mid, y: f1(n.ay + 14), "text-anchor": "middle"}, d.title));
    e.appendChild(svgEl("text", {"class": "types", x: mid, y: f1(n.ay + 27), "text-anchor": "middle"}, typesLine(d)));
    if (d.diff) {
      e.appendChild(svgEl("text", {"class": "badge " + d.diff, x: f1(n.ax + n.w + 3), y: f1(n.ay + 10)},
                          d.diff === "added" ? "+" : "\u2212"));
    }
    view.elements.set(n.uid, e);
    return e;
  }

  function drawGroupBox(view, g) {
    const fill = fillOf(view, g);
    const attrs = {"class": "group collapsed", "data-group": g.key, "data-expanded": "false",
                   "data-count": g.count, "data-depth": g.depth};
    if (g.added) { attrs["data-added"] = g.added; }
    if (g.removed) { attrs["data-removed"] = g.removed; }
    if (overlay) { attrs["data-cost"] = g.cost[costScale.metric]; }
    const e = svgEl("g", attrs);
    if (isDark(fill)) { e.classList.add("dark"); }
    e.appendChild(svgEl("title", {}, g.key + ": " + countLabel(g) + " (double-click or + to expand)"));
    const w = f1(g.w), mid = f1(g.ax + g.w / 2 + 8);  // text centred right of the toggle
    const box = {x: f1(g.ax), y: f1(g.ay), width: w, height: GROUP_H, rx: 6};
    e.appendChild(svgEl("rect", Object.assign({}, box, {"class": "shadow", x: f1(g.ax + 3), y: f1(g.ay + 3)})));
    e.appendChild(svgEl("rect", Object.assign({}, box, {"class": "box", fill: fill})));
    e.appendChild(svgEl("text", {"class": "title", x: mid, y: f1(g.ay + 16), "text-anchor": "middle"}, g.name));
    e.appendChild(svgEl("text", {"class": "count", x: mid, y: f1(g.ay + 31), "text-anchor": "middle"},
                        countLabel(g)));
    drawToggle(e, g.ax + 5, g.ay + 13, "+", g.key);
    let bx = g.ax + g.w + 5;
    if (g.added) {
      e.appendChild(svgEl("text", {"class": "badge added", x: f1(bx), y: f1(g.ay + 12)}, "+" + g.added));
    }
    if (g.removed) {
      e.appendChild(svgEl("text", {"class": "badge removed", x: f1(bx), y: f1(g.ay + 26)},
                          "\u2212" + g.removed));
    }
    view.elements.set(g.uid, e);
    return e;
  }

  /** Selection, search matches and near edges: classes on the drawn elements. */
  function applyMarks(view) {
    view.elements.forEach(function (e) { e.classList.remove("selected", "match", "current", "has-match"); });
    view.viewport.querySelectorAll(".badge.match").forEach(function (b) { b.remove(); });
    const perGroup = new Map();
    state.matches.forEach(function (m, i) {
      if (m.view !== view) { return; }
      const leaf = m.node.leaf;
      const e = view.elements.get(leaf.uid);
      if (!e) { return; }
      if (leaf.isNode) {
        e.classList.add("match");
        if (i === state.current) { e.classList.add("current"); }
      } else {
        e.classList.add("has-match");
        perGroup.set(leaf, (perGroup.get(leaf) || 0) + 1);
      }
    });
    perGroup.forEach(function (count, g) {
      view.elements.get(g.uid).appendChild(svgEl("text", {"class": "badge match", x: f1(g.ax + g.w - 4),
                                                          y: f1(g.ay - 3), "text-anchor": "end"},
                                                 count + (count === 1 ? " match" : " matches")));
    });
    const sel = state.selected && state.selected.view === view ? state.selected.item : null;
    const selLeaf = sel ? (sel.isNode ? sel.leaf : sel) : null;
    if (selLeaf && view.elements.get(selLeaf.uid)) { view.elements.get(selLeaf.uid).classList.add("selected"); }
    view.drawnEdges.forEach(function (d) {
      d.element.classList.toggle("near", selLeaf !== null && (d.from === selLeaf || d.to === selLeaf));
    });
  }

  function render(view) {
    const t = performance.now();
    connect(view);
    layoutGroup(view, view.root);
    place(view.root, 0, 0);
    draw(view);
    view.width = view.root.w;
    view.height = view.root.h;
    view.lastRenderMs = performance.now() - t;
  }

  function renderAll() {
    views.forEach(render);
    updateCount();
  }

  // ------------------------------------------------------------------ pan and zoom

  function applyTransform(view) {
    view.viewport.setAttribute("transform", "translate(" + f1(view.tx) + "," + f1(view.ty) + ") scale(" +
                               view.k.toFixed(4) + ")");
  }

  function viewSize(view) {
    const r = view.svg.getBoundingClientRect();
    return {w: r.width || 800, h: r.height || 600};
  }

  function zoomAt(view, factor, px, py) {
    const k = Math.min(4, Math.max(0.02, view.k * factor));
    view.tx = px - (px - view.tx) * (k / view.k);
    view.ty = py - (py - view.ty) * (k / view.k);
    view.k = k;
    applyTransform(view);
  }

  /** The zoom at which the whole drawing fits into the window (at most 1.5). */
  function fittedZoom(view) {
    const s = viewSize(view), margin = 20;
    return Math.min(1.5, (s.w - 2 * margin) / Math.max(view.width, 1),
                    (s.h - 2 * margin) / Math.max(view.height, 1));
  }

  function fit(view, limits) {
    const s = viewSize(view), margin = 20;
    const k = fittedZoom(view);
    if (limits && k < READABLE_ZOOM) {  // too small to read: show the top at a readable size instead
      view.k = READABLE_ZOOM;
      view.tx = (s.w - view.width * view.k) / 2;
      view.ty = margin;
    } else {
      view.k = Math.max(k, 0.02);
      view.tx = (s.w - view.width * view.k) / 2;
      view.ty = (s.h - view.height * view.k) / 2;
    }
    applyTransform(view);
  }

  function centreOn(view, item) {
    const s = viewSize(view);
    if (item.isGroup && isExpanded(item)) {  // a frame: its top, as wide as fits (but readable)
      view.k = Math.min(1, Math.max(0.6, (s.w - 40) / item.w));
      view.tx = s.w / 2 - (item.ax + item.w / 2) * view.k;
      view.ty = 30 - item.ay * view.k;
    } else {
      if (view.k < 0.7) { view.k = 1; }
      const cx = item.ax + item.w / 2, cy = item.ay + (item.isNode ? NODE_H : GROUP_H) / 2;
      view.tx = s.w / 2 - cx * view.k;
      view.ty = s.h / 2 - cy * view.k;
    }
    applyTransform(view);
  }

  function attachPanZoom(view) {
    const svg = view.svg;
    let drag = null;
    svg.addEventListener("pointerdown", function (ev) {
      if (ev.button !== 0) { return; }
      drag = {x: ev.clientX, y: ev.clientY, tx: view.tx, ty: view.ty, moved: false, id: ev.pointerId};
    });
    svg.addEventListener("pointermove", function (ev) {
      if (!drag) { return; }
      const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
      if (!drag.moved && Math.abs(dx) + Math.abs(dy) > 4) {
        drag.moved = true;
        svg.classList.add("panning");
        svg.setPointerCapture(drag.id);
      }
      if (drag.moved) {
        view.tx = drag.tx + dx;
        view.ty = drag.ty + dy;
        applyTransform(view);
      }
    });
    function end() {
      if (drag && drag.moved) { view.suppressClick = true; }
      drag = null;
      svg.classList.remove("panning");
    }
    svg.addEventListener("pointerup", end);
    svg.addEventListener("pointercancel", end);
    svg.addEventListener("wheel", function (ev) {
      ev.preventDefault();
      const r = svg.getBoundingClientRect();
      zoomAt(view, Math.exp(-ev.deltaY * 0.0015), ev.clientX - r.left, ev.clientY - r.top);
    }, {passive: false});
    svg.addEventListener("click", function (ev) {
      if (view.suppressClick) { view.suppressClick = false; return; }
      const toggle = ev.target.closest("[data-toggle]");
      if (toggle) { toggleGroup(view, toggle.getAttribute("data-toggle")); return; }
      const hit = ev.target.closest("[data-node-id], .group");
      if (!hit) { return; }
      if (hit.hasAttribute("data-node-id")) {
        select(view, view.byId.get(hit.getAttribute("data-node-id")));
      } else {
        select(view, view.byKey.get(hit.getAttribute("data-group")));
      }
    });
    svg.addEventListener("dblclick", function (ev) {
      const hit = ev.target.closest(".group");
      if (hit && !ev.target.closest("[data-toggle]")) { toggleGroup(view, hit.getAttribute("data-group")); }
    });
  }

  // ------------------------------------------------------------------ actions

  function toggleGroup(view, key, expand) {
    const want = expand === undefined ? !state.expanded.has(key) : expand;
    if (want) { state.expanded.add(key); } else { collapseKey(key); }
    renderAll();
    const g = view.byKey.get(key);
    if (g) { centreOn(view, g); select(view, g); }
  }

  function collapseKey(key) {
    // collapsing a group also collapses everything inside it, so it opens again one level at a time
    Array.from(state.expanded).forEach(function (k) {
      if (k === key || k.indexOf(key + "/") === 0) { state.expanded.delete(k); }
    });
  }

  function expandAll() {
    views.forEach(function (v) { v.groups.forEach(function (g) { state.expanded.add(g.key); }); });
    renderAll();
    views.forEach(function (v) { fit(v, true); });
  }

  function collapseAll() {
    state.expanded.clear();
    renderAll();
    views.forEach(function (v) { fit(v, true); });
  }

  function expandTo(node) { node.chain.forEach(function (g) { state.expanded.add(g.key); }); }

  function select(view, item) {
    state.selected = item ? {view: view, item: item} : null;
    views.forEach(applyMarks);
    showDetails(view, item);
  }

  function row(table, key, value) {
    const tr = el("tr", {"data-key": key});
    tr.appendChild(el("td", {"class": "k"}, key));
    tr.appendChild(el("td", {"class": "v"}, String(value)));
    table.appendChild(tr);
  }

  function showDetails(view, item) {
    const details = document.getElementById("details");
    details.textContent = "";
    if (!item) {
      details.appendChild(el("p", {"class": "hint"}, "Click a node or group for its details."));
      return;
    }
    const table = el("table", {});
    const where = views.length > 1 ? (view.index === 0 ? "A: " : "B: ") + view.graph.stage : view.graph.stage;
    if (item.isNode) {
      const n = item.data;
      details.appendChild(el("h3", {}, n.title));
      details.setAttribute("data-selected-node", n.id);
      details.removeAttribute("data-selected-group");
      row(table, "id", n.id);
      row(table, "op", n.op);
      if (where) { row(table, "stage", where); }
      if (n.diff) { row(table, "diff", n.diff); }
      row(table, "layer path", n.path || "(none)");
      row(table, "result types", n.types.join(", "));
      const byTarget = view.graph.edges.filter(function (e) { return e[1] === item.index; })
        .sort(function (a, b) { return a[4] - b[4]; });
      byTarget.forEach(function (e) {
        const src = view.nodes[e[0]].data;
        row(table, "operand " + e[4], src.title + " (" + src.id + (e[3] ? "#" + e[3] : "") + ") : " + e[2]);
      });
      const users = view.graph.edges.filter(function (e) { return e[0] === item.index; });
      users.slice(0, 20).forEach(function (e) {
        const dst = view.nodes[e[1]].data;
        row(table, "used by", dst.title + " (" + dst.id + ") operand " + e[4]);
      });
      if (users.length > 20) { row(table, "used by", "... " + (users.length - 20) + " more"); }
      Object.keys(n.attrs).forEach(function (k) { row(table, k, n.attrs[k]); });
      if (n.op !== "input" && n.op !== "output") {
        row(table, "est. FLOPs", n.cost[0].toLocaleString("en-US"));
        row(table, "est. bytes", n.cost[1].toLocaleString("en-US"));
      }
      row(table, "source", n.source || "(unknown)");
    } else {
      details.appendChild(el("h3", {}, item.name));
      details.setAttribute("data-selected-group", item.key);
      details.removeAttribute("data-selected-node");
      row(table, "group", item.key);
      if (where) { row(table, "stage", where); }
      row(table, "nodes", item.count);
      row(table, "state", isExpanded(item) ? "expanded" : "collapsed (double-click or + to expand)");
      if (item.added || item.removed) {
        row(table, "diff", "+" + item.added + " added, \u2212" + item.removed + " removed");
      }
      row(table, "est. FLOPs", item.cost[0].toLocaleString("en-US"));
      row(table, "est. bytes", item.cost[1].toLocaleString("en-US"));
      Object.keys(item.ops).sort(function (a, b) { return item.ops[b] - item.ops[a]; }).forEach(function (op) {
        row(table, "op " + op, item.ops[op]);
      });
    }
    details.appendChild(table);
  }

  // ------------------------------------------------------------------ search

  function search(query) {
    const q = query.trim().toLowerCase();
    state.query = query.trim();
    state.matches = [];
    state.current = -1;
    if (q) {
      views.forEach(function (view) {
        view.nodes.forEach(function (node) {
          const n = node.data;
          const hay = (n.title + "\n" + n.op + "\n" + n.id + "\n" + n.path + "\n" +
                       node.chain.map(function (g) { return g.key; }).join("\n")).toLowerCase();
          if (hay.indexOf(q) >= 0) { state.matches.push({view: view, node: node}); }
        });
      });
    }
    if (state.matches.length && state.matches.length <= MANY_MATCHES) {
      state.matches.forEach(function (m) { expandTo(m.node); });
    }
    if (state.matches.length) {
      goTo(0);
    } else {
      renderAll();
    }
  }

  function goTo(i) {
    const n = state.matches.length;
    if (!n) { return; }
    state.current = ((i % n) + n) % n;
    const m = state.matches[state.current];
    expandTo(m.node);
    renderAll();
    centreOn(m.view, m.node);
    select(m.view, m.node);
  }

  function updateCount() {
    const count = document.getElementById("count");
    if (!state.query) {
      const v = views[0];
      const nodes = v.graph.nodes.filter(function (n) { return n.op !== "input" && n.op !== "output"; }).length;
      count.textContent = views.length > 1 ? "" : nodes + " nodes, " + visibleCount(v) + " boxes shown";
    } else if (!state.matches.length) {
      count.textContent = "no match";
    } else {
      count.textContent = (state.current + 1) + " / " + state.matches.length +
                          (state.matches.length === 1 ? " match" : " matches");
    }
    count.setAttribute("data-matches", state.matches.length);
  }

  function attachToolbar() {
    const input = document.getElementById("search");
    let timer = null;
    input.addEventListener("input", function () {
      clearTimeout(timer);
      timer = setTimeout(function () { if (input.value.trim() !== state.query) { search(input.value); } }, 250);
    });
    input.addEventListener("keydown", function (ev) {
      if (ev.key !== "Enter") { return; }
      clearTimeout(timer);
      if (input.value.trim() !== state.query) {
        search(input.value);
      } else {
        goTo(state.current + (ev.shiftKey ? -1 : 1));
      }
    });
    const on = function (id, fn) { document.getElementById(id).addEventListener("click", fn); };
    on("search-next", function () { goTo(state.current + 1); });
    on("search-prev", function () { goTo(state.current - 1); });
    on("expand-all", expandAll);
    on("collapse-all", collapseAll);
    on("fit", function () { views.forEach(function (v) { fit(v, false); }); });
    const zoomAll = function (factor) {
      views.forEach(function (v) { const s = viewSize(v); zoomAt(v, factor, s.w / 2, s.h / 2); });
    };
    on("zoom-in", function () { zoomAll(1.25); });
    on("zoom-out", function () { zoomAll(0.8); });
  }

  // ------------------------------------------------------------------ start

  const container = document.getElementById("views");
  const views = DATA.graphs.map(function (graph, i) {
    const view = buildView(graph, i);
    const section = el("section", {"class": "view", "data-view": i});
    const label = DATA.mode === "diff" ? (i === 0 ? "A: " : "B: ") : "";
    const ops = graph.nodes.filter(function (n) { return n.op !== "input" && n.op !== "output"; }).length;
    const stage = graph.stage ? " \u00b7 " + graph.stage : "";
    section.appendChild(el("div", {"class": "view-title"},
                           label + "@" + graph.name + stage + " \u00b7 " + ops + " nodes"));
    // the HTML parser puts an inline <svg> into the SVG namespace; everything drawn inside uses it
    const holder = document.createElement("div");
    holder.innerHTML = '<svg class="canvas"><defs><marker id="arrow-' + i + '" viewBox="0 0 10 10" refX="10" ' +
      'refY="5" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#6b7280"/>' +
      '</marker></defs><g class="viewport"></g></svg>';
    view.svg = holder.firstChild;
    NS = view.svg.namespaceURI;
    view.viewport = view.svg.querySelector(".viewport");
    section.appendChild(view.svg);
    container.appendChild(section);
    return view;
  });
  const built = performance.now();
  if (overlay) { costScale = makeCostScale(); drawLegend(); }
  const startOrder = startExpanded();
  document.getElementById("graph-title").textContent = "@" + DATA.graphs[0].name;
  if (DATA.mode === "diff") {
    const d = DATA.diff, box = document.getElementById("diff-summary");
    box.appendChild(el("span", {}, "A " + DATA.graphs[0].stage + ": " + d.a + " \u00b7 B " + DATA.graphs[1].stage +
                                   ": " + d.b + " (inputs, nodes, outputs) \u00b7 "));
    box.appendChild(el("span", {"class": "removed", id: "diff-removed"}, String(d.removed)));
    box.appendChild(el("span", {}, " removed \u00b7 "));
    box.appendChild(el("span", {"class": "added", id: "diff-added"}, String(d.added)));
    box.appendChild(el("span", {}, " added"));
  }
  const layoutStart = performance.now();
  renderAll();
  const layoutEnd = performance.now();
  keepReadable(startOrder);  // the start view shows the whole drawing, fitted, at a readable size
  views.forEach(function (v) { fit(v, true); attachPanZoom(v); });
  attachToolbar();
  showDetails(null, null);

  function viewWith(key) { return views[0].byKey.has(key) ? views[0] : views[views.length - 1]; }

  window.kaunViz = Object.freeze({
    ready: true,
    timings: Object.freeze({parseMs: parsedAt - started, buildMs: built - parsedAt,
                            firstRenderMs: layoutEnd - layoutStart, totalMs: performance.now() - started}),
    views: function () {
      return views.map(function (v) {
        return {stage: v.graph.stage, nodes: v.nodes.length, groups: v.groups.length, visible: visibleCount(v),
                lastRenderMs: v.lastRenderMs, zoom: v.k};
      });
    },
    expanded: function () { return Array.from(state.expanded).sort(); },
    expand: function (key) { toggleGroup(viewWith(key), key, true); },
    collapse: function (key) { toggleGroup(viewWith(key), key, false); },
    expandAll: expandAll,
    collapseAll: collapseAll,
    search: search,
    select: function (id, viewIndex) { const v = views[viewIndex || 0]; select(v, v.byId.get(id)); },
  });
})();
