"""What ``dir()`` shows of a public namespace: its ``__all__``.

Not the modules and helpers it imported: ``dir(kn.ptree)`` lists no ``np``, ``math`` or ``Any``,
and tab completion offers the public names only."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["public_dir"]


def public_dir(names: Sequence[str]) -> Callable[[], list[str]]:
    """A module's ``__dir__``: ``__dir__ = public_dir(__all__)`` makes ``dir(module)`` the
    sorted public names (read at each call, so names added to ``__all__`` later show too)."""

    def __dir__() -> list[str]:
        return sorted(names)

    return __dir__
