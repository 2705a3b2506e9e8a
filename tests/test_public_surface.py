"""The public surface: every ``__all__`` is a literal list, ``kn.*`` is exactly its ``__all__``,
and every public name carries a docstring (read from the source, so a docstring assigned at
run time does not count: editors and ``pydoc`` of the file do not see those)."""

from __future__ import annotations

import ast
import importlib
import pathlib
import pkgutil
import types
import typing

import kaun_ir as kn

ROOT = pathlib.Path(__file__).resolve().parents[1]
# the source folders of the package (pyproject maps passes/, runtime/, tools/ into kaun_ir)
SOURCES = {
    "kaun_ir": ROOT / "kaun_ir",
    "passes": ROOT / "passes",
    "runtime": ROOT / "runtime",
    "tools": ROOT / "tools",
}
LIBRARY = ("kaun_ir", "passes", "runtime")  # the importable API; tools/ holds the command line


def _files(folders):
    for folder in folders:
        yield from sorted(SOURCES[folder].rglob("*.py"))


def _is_private(path: pathlib.Path) -> bool:
    parts = path.relative_to(ROOT).parts
    return any(p.startswith("_") and p != "__init__.py" for p in parts)


def test_every_all_is_a_literal_list_of_strings():
    bad = []
    for path in _files(SOURCES):
        tree = ast.parse(path.read_text(), str(path))
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AugAssign, ast.AnnAssign))
                else []
            )
            if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                continue
            literal = (
                isinstance(node, ast.Assign)
                and isinstance(node.value, (ast.List, ast.Tuple))
                and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.value.elts)
            )
            if not literal:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, f"__all__ not written as one literal list of names: {bad}"


def test_kn_namespace_is_its_all():
    names = kn.__all__
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(hasattr(kn, n) for n in names), [n for n in names if not hasattr(kn, n)]
    # every public function, class and constant of kn.* is listed: an import added to
    # kaun_ir/__init__.py (or a star import) cannot widen the surface unnoticed. Submodules
    # appear as attributes whenever they are imported; only the listed ones are API.
    public = {
        n for n in dir(kn) if not n.startswith("_") and not isinstance(getattr(kn, n), types.ModuleType)
    }
    listed = {n for n in names if not isinstance(getattr(kn, n), types.ModuleType)}
    assert public == listed, {"not in __all__": sorted(public - listed), "missing": sorted(listed - public)}


def _public_modules():
    """kn itself and its listed subpackages and modules, with their public submodules."""
    seen = {"kaun_ir": kn}
    for name in kn.__all__:
        module = getattr(kn, name)
        if not isinstance(module, types.ModuleType):
            continue
        seen[module.__name__] = module
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), module.__name__ + "."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            try:
                seen[info.name] = importlib.import_module(info.name)
            except ImportError as err:  # an optional extra (PyTorch, transformers) is missing
                assert not err.name or not err.name.startswith("kaun_ir"), err
    return seen


def _needs_docstring(obj) -> bool:
    return isinstance(obj, (types.FunctionType, type, types.ModuleType)) or (
        callable(obj) and not isinstance(obj, (typing._GenericAlias, types.GenericAlias))
    )


def test_every_name_in_a_public_all_has_a_docstring():
    missing = []
    for module_name, module in _public_modules().items():
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            if _needs_docstring(obj) and not (getattr(obj, "__doc__", None) or "").strip():
                missing.append(f"{module_name}.{name}")
    assert not missing, f"public names without a docstring: {missing}"


def test_every_public_definition_has_a_docstring_in_the_source():
    missing = []
    for path in _files(LIBRARY):
        if _is_private(path):
            continue
        tree = ast.parse(path.read_text(), str(path))
        where = path.relative_to(ROOT)
        if not ast.get_docstring(tree):
            missing.append(f"{where}: module")
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if node.name.startswith("_"):
                continue
            if not ast.get_docstring(node):
                missing.append(f"{where}:{node.lineno} {node.name}")
            if isinstance(node, ast.ClassDef):
                for method in node.body:
                    if (
                        isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef))
                        and not method.name.startswith("_")
                        and not ast.get_docstring(method)
                        and not any(_is_property(d) for d in method.decorator_list)
                    ):
                        missing.append(f"{where}:{method.lineno} {node.name}.{method.name}")
    assert not missing, f"public definitions without a docstring: {missing}"


def _is_property(decorator) -> bool:
    """``@property`` (its getter documents the attribute by its name) or a ``@x.setter``."""
    return (isinstance(decorator, ast.Name) and decorator.id in ("property", "cached_property")) or (
        isinstance(decorator, ast.Attribute) and decorator.attr in ("setter", "deleter", "cached_property")
    )
