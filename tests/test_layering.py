"""The package's layers, and a check that every import points down (see docs/architecture.md).

Every import statement of the package is read with ``ast`` (module level and inside functions,
relative imports resolved), each module is placed on a layer by the tables below, and an import
that reaches a higher layer fails the test unless it is on ``ALLOWED_UPWARD`` with its reason.
Module-level import cycles may only shrink: a strongly connected component that is not inside
one of ``KNOWN_CYCLES`` fails.

The tables are the single source of the layer order; ``docs/architecture.md`` carries a copy of
them that a test compares (``python tests/test_layering.py --write-doc`` rewrites it), and
``python tests/test_layering.py`` prints the current upward imports and cycles.
"""

from __future__ import annotations

import ast
import functools
import pathlib
import re
import sys
from typing import NamedTuple

import networkx as nx

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"

# Source folders and the import names pyproject.toml gives them.
SOURCE_DIRS = {
    "kaun_ir": "kaun_ir",
    "passes": "kaun_ir.passes",
    "runtime": "kaun_ir.runtime",
    "tools": "kaun_ir.tools",
}

# Bottom to top; a module may import its own layer and the layers below it.
LAYERS = (
    "foundation",
    "ir",
    "ops",
    "surface",
    "transforms",
    "passes",
    "runtime",
    "api",
    "tools",
    "namespace",
)

LAYER_MEANING = {
    "foundation": "errors, dtypes, atomic files, tree flattening, the late-binding slots: no kaun_ir imports",
    "ir": "the SSA IR: types, nodes, graphs, builder, text form, verifier, interpreter",
    "ops": "the op table: one declaration per op (shape rule, NumPy reference, VJP, emission)",
    "surface": "tracing: Tensor, trace, the NumPy-style functions, random, ein, control flow",
    "transforms": "graph transformations: autodiff, vmap, jvp, Jacobians, custom rules, remat",
    "passes": "Graph -> Graph passes and the pass manager",
    "runtime": "lowering to StableHLO, jaxlib, compile caches, kn.jit, devices, meshes, importers",
    "api": "user API: nn, layers, optimisers, training, data, checkpoints, sharding, models",
    "tools": "the kaun-ir command line, the bench and the viewer",
    "namespace": "the kaun_ir package itself (`import kaun_ir as kn`) and its composition root",
}

# A subpackage entry places every module inside it (a new file there needs no entry): the
# folders are the layers.
SUBPACKAGES = {
    "kaun_ir.ir": "ir",
    "kaun_ir.ops": "ops",
    "kaun_ir.surface": "surface",
    "kaun_ir.transforms": "transforms",
    "kaun_ir.passes": "passes",
    "kaun_ir.runtime": "runtime",
    "kaun_ir.nn": "api",
    "kaun_ir.layer": "api",
    "kaun_ir.optim": "api",
    "kaun_ir.train": "api",
    "kaun_ir.models": "api",
    "kaun_ir.data": "api",
    "kaun_ir.datasets": "api",
    "kaun_ir.checkpoint": "api",
    "kaun_ir.sharding": "api",
    "kaun_ir.tools": "tools",
}

# The modules directly in kaun_ir/: the foundation, a few user-API modules, and the namespace.
MODULES = {
    "kaun_ir": "namespace",
    "kaun_ir.wiring": "namespace",
    # foundation
    "kaun_ir.errors": "foundation",
    "kaun_ir.dtypes": "foundation",
    "kaun_ir.fileio": "foundation",
    "kaun_ir.hooks": "foundation",
    "kaun_ir.names": "foundation",
    "kaun_ir.version": "foundation",
    "kaun_ir.tree": "foundation",
    # user API
    "kaun_ir.ptree": "api",
    "kaun_ir.rng": "api",
    "kaun_ir.precision": "api",
    "kaun_ir.debug": "api",
    "kaun_ir.testing": "api",
}

# Upward imports that stay: (importer, imported, why). None today: a lower layer that needs code
# from above keeps a slot that the composition root fills (kaun_ir/hooks.py, kaun_ir/wiring.py).
# An entry must say why no slot or move serves; the test says which entries are stale.
ALLOWED_UPWARD: list[tuple[str, str, str]] = []

# Module-level import cycles of today; a new cycle, or one that grows, fails the test.
KNOWN_CYCLES: list[frozenset[str]] = []

# Imports inside functions that close an import cycle (importer, imported, why). With these left
# out, the graph of every import of the package, module level and inside functions, has no cycle
# at all: a function-level import that closes a new cycle fails the test. Every other import sits
# at the top of its file (ruff's PLC0415) or loads something heavy or optional on first need (jax,
# jaxlib, torch, safetensors, networkx, the runtime from the composition root). The list only
# shrinks; a module's own package wiring its pieces together (kaun_ir/ir/__init__.py,
# kaun_ir/surface/__init__.py, kaun_ir/layer/__init__.py) is how two modules avoid an entry here.
CYCLE_EDGES: list[tuple[str, str, str]] = []


class Import(NamedTuple):
    importer: str
    imported: str
    path: str
    line: int
    module_level: bool


class Package(NamedTuple):
    modules: dict[str, pathlib.Path]
    imports: list[Import]


def _module_name(directory: str, path: pathlib.Path) -> tuple[str, bool]:
    """The import name of a source file, and whether it is a package's ``__init__``."""
    parts = list(path.relative_to(ROOT / directory).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join([SOURCE_DIRS[directory], *parts]), is_package


def _resolve(modules: dict, name: str) -> str:
    """The package module an import name refers to: the longest prefix that is a module."""
    parts = name.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts)


def _import_nodes(node: ast.AST, module_level: bool = True):
    """``(import statement, runs at import time?)`` for every import below ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _import_nodes(child, False)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, module_level
        yield from _import_nodes(child, module_level)


def _imports_of(name: str, path: pathlib.Path, is_package: bool, modules: dict) -> list[Import]:
    """The imports of package modules in one source file."""
    where = str(path.relative_to(ROOT))
    here = name.split(".") if is_package else name.split(".")[:-1]
    found = []
    for node, module_level in _import_nodes(ast.parse(path.read_text(encoding="utf-8"), where)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            source = node.module or ""
            if node.level:
                source = ".".join(here[: len(here) - (node.level - 1)] + ([source] if source else []))
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` the package
            targets = [f"{source}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.split(".")[0] == "kaun_ir":
                found.append(Import(name, _resolve(modules, target), where, node.lineno, module_level))
    return found


@functools.cache
def package() -> Package:
    """Every module of the package and every import of another package module, with its place."""
    files = {}
    for directory in SOURCE_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            name, is_package = _module_name(directory, path)
            files[name] = (path, is_package)
    modules = {name: path for name, (path, _) in files.items()}
    imports = [edge for name, spec in files.items() for edge in _imports_of(name, *spec, modules)]
    return Package(modules, imports)


def layer_of(module: str) -> str | None:
    """The layer of a module from the tables, or None when it has no entry."""
    if module in MODULES:
        return MODULES[module]
    owners = [prefix for prefix in SUBPACKAGES if module == prefix or module.startswith(prefix + ".")]
    return SUBPACKAGES[max(owners, key=len)] if owners else None


def upward_imports() -> list[Import]:
    """Imports whose target sits on a higher layer than the importer (any nesting level)."""
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    return [
        edge
        for edge in package().imports
        if layer_of(edge.importer) and layer_of(edge.imported)
        if rank[layer_of(edge.imported)] > rank[layer_of(edge.importer)]
    ]


def import_cycles(module_level_only: bool = True) -> list[set[str]]:
    """Strongly connected components (more than one module) of the import graph, largest first."""
    graph = nx.DiGraph()
    graph.add_edges_from(
        (edge.importer, edge.imported)
        for edge in package().imports
        if edge.importer != edge.imported and (edge.module_level or not module_level_only)
    )
    components = [set(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    return sorted(components, key=lambda c: (-len(c), sorted(c)))


def _describe(edge: Import) -> str:
    where = "module level" if edge.module_level else "in a function"
    return (
        f"{edge.path}:{edge.line}: {edge.importer} ({layer_of(edge.importer)}) imports "
        f"{edge.imported} ({layer_of(edge.imported)}), {where}"
    )


def test_every_module_has_a_layer():
    missing = sorted(name for name in package().modules if layer_of(name) is None)
    assert not missing, (
        "modules without a layer; add each to MODULES in tests/test_layering.py (and run "
        "`python tests/test_layering.py --write-doc`): " + ", ".join(missing)
    )


def test_tables_name_real_layers_and_modules():
    assert set(MODULES.values()) | set(SUBPACKAGES.values()) <= set(LAYERS)
    assert set(LAYER_MEANING) == set(LAYERS)
    gone = sorted(set(MODULES) - set(package().modules)) + sorted(set(SUBPACKAGES) - set(package().modules))
    assert not gone, f"layer table entries for modules that no longer exist: {gone}"


def test_imports_point_down():
    allowed = {(importer, imported) for importer, imported, _ in ALLOWED_UPWARD}
    bad = [_describe(edge) for edge in upward_imports() if (edge.importer, edge.imported) not in allowed]
    assert not bad, (
        "imports that reach a higher layer (see docs/architecture.md for what each layer may import; "
        "move the helper down, or let the lower layer expose a hook the upper one fills):\n" + "\n".join(bad)
    )


def test_allow_list_is_short_current_and_explained():
    current = {(edge.importer, edge.imported) for edge in upward_imports()}
    pairs = [(importer, imported) for importer, imported, _ in ALLOWED_UPWARD]
    assert len(pairs) == len(set(pairs)), "ALLOWED_UPWARD lists an import twice"
    stale = [pair for pair in pairs if pair not in current]
    assert not stale, f"ALLOWED_UPWARD entries that no longer reach upward; delete them: {stale}"
    assert all(why.strip() for _, _, why in ALLOWED_UPWARD), "every allowed upward import says why"


def test_every_import_cycle_is_closed_by_a_listed_edge():
    listed = {(importer, imported) for importer, imported, _ in CYCLE_EDGES + ALLOWED_UPWARD}
    graph = nx.DiGraph()
    graph.add_edges_from(
        (edge.importer, edge.imported)
        for edge in package().imports
        if edge.importer != edge.imported and (edge.importer, edge.imported) not in listed
    )
    cycles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    assert not cycles, (
        "import cycles (counting imports inside functions) not closed by a CYCLE_EDGES entry; move "
        "the shared piece down, or list the function-level import that closes it with its reason: "
        f"{cycles}"
    )


def test_cycle_edges_are_current_and_inside_functions():
    pairs = [(importer, imported) for importer, imported, _ in CYCLE_EDGES]
    assert len(pairs) == len(set(pairs)), "CYCLE_EDGES lists an import twice"
    edges = {}
    for edge in package().imports:
        edges.setdefault((edge.importer, edge.imported), []).append(edge)
    stale = [pair for pair in pairs if pair not in edges]
    assert not stale, f"CYCLE_EDGES entries for imports that no longer exist; delete them: {stale}"
    at_top = [_describe(e) for pair in pairs for e in edges[pair] if e.module_level]
    assert not at_top, f"a cycle-closing import must stay inside its function: {at_top}"
    assert all(why.strip() for *_, why in CYCLE_EDGES), "every cycle edge says why"


def test_module_level_import_cycles_only_shrink():
    new = [sorted(c) for c in import_cycles() if not any(c <= known for known in KNOWN_CYCLES)]
    assert not new, f"new or grown module-level import cycles: {new}"


def render_doc_table() -> str:
    """The layer table of docs/architecture.md, from the tables above."""
    lines = ["| Layer | Holds | Modules |", "|---|---|---|"]
    for layer in reversed(LAYERS):
        names = sorted(name + "/" for name, placed in SUBPACKAGES.items() if placed == layer)
        names += sorted(name for name, placed in MODULES.items() if placed == layer)
        shown = ", ".join(
            f"`{name.removeprefix('kaun_ir.') if name != 'kaun_ir' else name}`" for name in names
        )
        lines.append(f"| {layer} | {LAYER_MEANING[layer]} | {shown} |")
    return "\n".join(lines)


DOC_START = "<!-- layer table: generated by `python tests/test_layering.py --write-doc` -->"
DOC_END = "<!-- end of layer table -->"
TREE_START = "<!-- tree: generated by `python tests/test_layering.py --write-doc` -->"
TREE_END = "<!-- end of tree -->"


def _summary(path: pathlib.Path) -> str:
    """The first sentence of a module's docstring, on one line (what the tree says of it)."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    text = " ".join(doc.split())
    match = re.match(r"(.+?\.)(\s|$)", text)
    return (match.group(1) if match else text).rstrip(".")


def render_tree() -> str:
    """The folder tree of docs/architecture.md: every package folder, and the modules directly in
    ``kaun_ir/``, each with the first sentence of its docstring, the layer order bottom-up."""
    rank = {layer: index for index, layer in enumerate(LAYERS)}
    rows = []
    for name, path in package().modules.items():
        is_folder = path.name == "__init__.py"
        if not is_folder and name.count(".") != 1 or name.startswith("kaun_ir.tools.") and not is_folder:
            continue
        if not is_folder and name.split(".")[1] in ("passes", "runtime", "tools"):
            continue
        directory = next(d for d, pkg in SOURCE_DIRS.items() if name == pkg or name.startswith(pkg + "."))
        rel = path.parent.relative_to(ROOT) if is_folder else path.relative_to(ROOT)
        shown = f"{rel}/" if is_folder else str(rel)
        if name == "kaun_ir":
            continue
        rows.append((rank[layer_of(name)], directory != "kaun_ir", shown, _summary(path)))
    rows.sort()
    width = max(len(shown) for _, _, shown, _ in rows)
    lines = ["```"] + [f"{shown.ljust(width)}  {summary}" for _, _, shown, summary in rows] + ["```"]
    return "\n".join(lines)


def _doc_with_table(text: str) -> str:
    for start, end, body in ((DOC_START, DOC_END, render_doc_table), (TREE_START, TREE_END, render_tree)):
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        text = pattern.sub(lambda _, s=start, e=end, b=body: f"{s}\n{b()}\n{e}", text)
    return text


def test_architecture_doc_has_the_current_layer_table():
    text = DOC.read_text(encoding="utf-8")
    markers = (DOC_START, DOC_END, TREE_START, TREE_END)
    assert all(m in text for m in markers), "docs/architecture.md lost its layer-table or tree markers"
    assert _doc_with_table(text) == text, (
        "docs/architecture.md's layer table or tree differs from the package and tests/test_layering.py; "
        "run `python tests/test_layering.py --write-doc`"
    )


def test_architecture_doc_names_files_that_exist():
    """The tour and the picture name source files; a rename must update them."""
    named = set(
        re.findall(r"`((?:kaun_ir|passes|runtime|tools|tests|docs)/[\w/]+\.(?:py|md))`", DOC.read_text())
    )
    assert named, "docs/architecture.md names no files"
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


def report() -> str:
    """Upward imports and cycles of the tree as it stands (for notes and reviews)."""
    up = upward_imports()
    lines = [
        f"modules: {len(package().modules)}, imports of package modules: {len(package().imports)}",
        f"upward imports: {len(up)} ({sum(e.module_level for e in up)} at module level, "
        f"{sum(not e.module_level for e in up)} in functions), "
        f"{len({(e.importer, e.imported) for e in up})} module pairs; allow-list: {len(ALLOWED_UPWARD)}",
    ]
    for label, only in (("module-level", True), ("all", False)):
        cycles = import_cycles(only)
        lines.append(f"{label} import cycles: {len(cycles)}, sizes {[len(c) for c in cycles]}")
    lines += [_describe(edge) for edge in up]
    for cycle in import_cycles():
        lines.append("cycle: " + " ".join(sorted(cycle)))
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-doc"]:
        DOC.write_text(_doc_with_table(DOC.read_text(encoding="utf-8")), encoding="utf-8")
    else:
        print(report())
