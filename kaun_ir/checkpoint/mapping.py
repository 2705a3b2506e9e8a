"""Loading checkpoints written under other naming and layout conventions (PyTorch, Hugging Face).

``checkpoint.load(path, like=params, rename=..., transpose=...)`` and
``checkpoint.from_state_dict(state_dict, like=params, rename=..., transpose=...)`` read tensors
whose names and layouts differ from kaun_ir's:

- ``rename``: how a *source* key becomes a kaun_ir dotted path. Either a list of
  ``(regex, replacement)`` pairs (or a dict of them), tried in order, the first ``re.fullmatch``
  wins (``\\1`` refers to groups; a replacement of ``None`` drops the key), or a function
  ``source_key -> path or None``. Keys no rule matches keep their names.
- ``transpose``: which kaun_ir paths hold the source tensor with its axes reversed (a PyTorch
  ``nn.Linear`` weight ``[out, in]`` is kaun_ir's ``[in, out]``): a list of regexes matched
  against the path, or a function ``path -> bool``.

The conventions that differ between PyTorch and kaun_ir (see docs/interop.md):

=====================  ==========================  ==========================  ==================
what                   PyTorch                     kaun_ir                     load with
=====================  ==========================  ==========================  ==================
linear weight          ``weight [out, in]``        ``weight [in, out]``        transpose
linear bias            ``bias [out]``              ``bias [out]``              -
conv weight            ``weight [O, I, kh, kw]``   ``weight [O, I, kh, kw]``   -
layer / RMS norm       ``weight``, ``bias``        ``scale``, ``bias``         rename weight
batch norm params      ``weight``, ``bias``        ``scale``, ``bias``         rename weight
batch norm state       ``running_mean/var``        state ``running_mean/var``  drop
                       ``num_batches_tracked``     (none)                      ``num_batches_tracked``
batch norm momentum    ``0.1`` (weight of new)     ``0.9`` (weight of old)     ``1 - m``
embedding              ``weight [V, D]``           ``weight [V, D]``           -
sequential children    ``0.weight``                ``0.weight``                -
=====================  ==========================  ==========================  ==================
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from kaun_ir.surface.tensor import from_foreign, is_foreign_array

Rename = (
    Callable[[str], "str | None"] | Mapping[str, "str | None"] | Iterable[tuple[str, "str | None"]] | None
)
Transpose = Callable[[str], bool] | Iterable[str] | None


def rename_function(rename: Rename) -> Callable[[str], str | None]:
    """``rename`` (see the module docstring) as a function ``source_key -> path or None``."""
    if rename is None:
        return lambda key: key
    if callable(rename):
        return rename
    if not isinstance(rename, Mapping | list | tuple):
        raise TypeError(
            f"rename must be a function key -> path, a {{regex: replacement}} mapping or (regex, "
            f"replacement) pairs, got {type(rename).__name__}"
        )
    rules = list(rename.items()) if isinstance(rename, Mapping) else list(rename)
    compiled = []
    for rule in rules:
        if not (isinstance(rule, tuple) and len(rule) == 2 and isinstance(rule[0], str)):
            raise TypeError(f"rename rules are (regex, replacement) pairs, got {rule!r}")
        try:
            compiled.append((re.compile(rule[0]), rule[1]))
        except re.error as err:
            raise ValueError(f"rename: bad regex {rule[0]!r}: {err}") from None

    def apply(key: str) -> str | None:
        for pattern, replacement in compiled:
            match = pattern.fullmatch(key)
            if match:
                return None if replacement is None else match.expand(replacement)
        return key

    return apply


def transpose_function(transpose: Transpose) -> Callable[[str], bool]:
    """``transpose`` (see the module docstring) as a predicate on kaun_ir paths."""
    if transpose is None:
        return lambda path: False
    if callable(transpose):
        return transpose
    if isinstance(transpose, str):
        transpose = [transpose]
    if not isinstance(transpose, list | tuple | set) or not all(isinstance(p, str) for p in transpose):
        raise TypeError(
            f"transpose must be a predicate on paths or regular expressions (str), got {transpose!r}"
        )
    patterns = [re.compile(p) for p in transpose]
    return lambda path: any(p.fullmatch(path) for p in patterns)


class MappedSource:
    """Tensors by kaun_ir path, read from a source keyed by its own names (``keys`` and
    ``get(source_key) -> np.ndarray``), renamed and transposed on the way."""

    def __init__(
        self,
        keys: Iterable[str],
        get: Callable[[str], np.ndarray],
        rename: Rename = None,
        transpose: Transpose = None,
        where: str = "checkpoint",
    ):
        to_path = rename_function(rename)
        self._transpose = transpose_function(transpose)
        self._get = get
        self.where = where
        self.path = where
        self.source_of: dict[str, str] = {}
        for key in sorted(keys):
            path = to_path(key)
            if path is None:
                continue
            if path in self.source_of:
                raise ValueError(
                    f"{where}: keys {self.source_of[path]!r} and {key!r} are both renamed to {path!r}"
                )
            self.source_of[path] = key
        self.keys = set(self.source_of)

    def get(self, path: str) -> np.ndarray:
        """The array stored under the (renamed) ``path``; ``ValueError`` naming some keys when none is."""
        if path not in self.source_of:
            near = sorted(self.keys)[:8]
            raise ValueError(
                f"checkpoint: {self.where} has no tensor for {path!r} after renaming "
                f"(renamed keys: {', '.join(map(repr, near))}{', ...' if len(self.keys) > 8 else ''})"
            )
        arr = self._get(self.source_of[path])
        return np.ascontiguousarray(np.transpose(arr)) if self._transpose(path) else arr

    def close(self) -> None:
        """Nothing to release: the arrays are held in memory."""
        pass


def state_dict_arrays(state_dict: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Host arrays of a ``{name: tensor}`` mapping (PyTorch tensors through DLPack, NumPy, jax)."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"checkpoint: state_dict must be a mapping {{name: tensor}} (e.g. model.state_dict()), got "
            f"{type(state_dict).__name__}"
        )
    out = {}
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(
                f"checkpoint: state_dict key {key!r} is a {type(key).__name__}; keys are names (str)"
            )
        if is_foreign_array(value):
            value = from_foreign(value)
        if isinstance(value, Mapping):
            raise TypeError(
                f"checkpoint: state_dict[{key!r}] is a mapping; a state_dict maps flat dotted names "
                "to tensors"
            )
        if not (hasattr(value, "dtype") or isinstance(value, int | float | list | tuple)) or isinstance(
            value, bool
        ):
            raise TypeError(f"checkpoint: state_dict[{key!r}] is a {type(value).__name__}, not a tensor")
        array = np.asarray(value)
        if array.dtype.kind not in "biufc":
            raise TypeError(f"checkpoint: state_dict[{key!r}] has dtype {array.dtype}, not a numeric tensor")
        out[key] = array
    return out
