"""pyproject.toml's setuptools ``packages`` list names every package folder of the source, so a
wheel (not only an editable install, which finds folders by itself) holds every module."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_package_folder_is_listed_in_pyproject():
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    folders = {folder: name for name, folder in setuptools["package-dir"].items()}
    found = set()
    for folder, name in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT / folder).parts
            found.add(".".join((name, *parts)))
    listed = set(setuptools["packages"])
    missing = sorted(found - listed)
    assert not missing, f"add these packages to pyproject.toml's packages list: {missing}"
    assert not listed - found, f"pyproject.toml lists packages that do not exist: {sorted(listed - found)}"
