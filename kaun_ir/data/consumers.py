"""``kn.data`` consumers: functions that read the rest of a pipeline (:func:`iter`, :func:`fold`,
:func:`to_array`) and :func:`length`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kaun_ir.data.core import Data, check_data, drain


def iter(f: Callable[[Any], Any], d: Data) -> None:  # noqa: A001 - the API name
    """Call ``f(e)`` on each remaining element of ``d``."""
    check_data(d, "iter")
    for element in drain(d):
        f(element)


def fold(f: Callable[[Any, Any], Any], acc: Any, d: Data) -> Any:
    """``f(...f(f(acc, e0), e1)..., eN)`` over the remaining elements of ``d``."""
    check_data(d, "fold")
    for element in drain(d):
        acc = f(acc, element)
    return acc


def to_array(d: Data) -> list:
    """The remaining elements of ``d`` as a Python list (in order)."""
    check_data(d, "to_array")
    return list(drain(d))


def length(d: Data) -> int | None:
    """The number of elements in one pass of ``d``, or ``None`` when unknown."""
    check_data(d, "length")
    return d._length
