"""Helpers shared by the pass tests: random inputs with special values, bit-exact comparison,
snapshots that show a pass did not modify its input, and small graph-building shortcuts."""

from __future__ import annotations

import numpy as np

from kaun_ir import dtypes
from kaun_ir.ir.core import Graph
from kaun_ir.surface.tensor import apply

SPECIAL_FLOATS = (0.0, -0.0, np.nan, np.inf, -np.inf, 1.0, -1.0)


def random_array(rng: np.random.Generator, type_, special: bool | float = True) -> np.ndarray:
    """Random data of a TensorType; floats get some -0.0, NaN, inf, ... sprinkled in.

    ``special``: the share of special values (True: 0.2); ``"zeros"``: only +0.0 and -0.0.
    """
    dt, shape = np.dtype(type_.dtype), type_.shape
    if dt == dtypes.bool_:
        return rng.random(shape) < 0.5
    if dt in dtypes.INTEGERS:
        low = 0 if dtypes.is_unsigned(dt) else -5
        return rng.integers(low, 6, size=shape).astype(dt)
    if special == "zeros":  # signed zeros only: what sign-of-zero mistakes show up on
        return np.where(rng.random(shape) < 0.5, -0.0, 0.0).astype(dt)
    out = rng.standard_normal(shape).astype(dt)
    share = 0.2 if special is True else float(special)
    if share and out.size:
        flat = out.reshape(-1)
        for i in range(out.size):
            if rng.random() < share:
                flat[i] = SPECIAL_FLOATS[rng.integers(len(SPECIAL_FLOATS))]
    return out


def random_inputs(graph: Graph, rng: np.random.Generator, special: bool | float | str = True) -> list:
    return [random_array(rng, v.type, special) for v in graph.inputs]


def bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view(np.uint8) if a.dtype == dtypes.bool_ else a.view(f"u{a.dtype.itemsize}")


def assert_bit_identical(got: np.ndarray, want: np.ndarray, what: str = "") -> None:
    """Equal dtype, shape and bits; every NaN counts as equal to every NaN (payloads may differ)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, (
        f"{what}: {got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    )
    if dtypes.is_float(got.dtype):
        g_nan, w_nan = np.isnan(got.astype(np.float64)), np.isnan(want.astype(np.float64))
        assert np.array_equal(g_nan, w_nan), f"{what}: NaNs at different positions\n{got}\n{want}"
        same = bits(got)[~g_nan] == bits(want)[~w_nan]
    else:
        same = bits(got) == bits(want)
    assert np.all(same), f"{what}: results differ bitwise\ngot  {got!r}\nwant {want!r}"


def assert_close(got, want, what: str = "", rtol: float = 1e-5, atol: float = 1e-6) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.dtype == want.dtype and got.shape == want.shape, what
    if dtypes.is_float(got.dtype):
        np.testing.assert_allclose(
            got.astype(np.float64),
            want.astype(np.float64),
            rtol=rtol,
            atol=atol,
            equal_nan=True,
            err_msg=what,
        )
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def snapshot(graph: Graph) -> tuple:
    """Everything a pass could change in place: the text and the identity of every object."""
    nodes = tuple(graph.walk())
    return (
        graph.text(debug=True),
        tuple(id(n) for n in nodes),
        tuple(id(v) for v in graph.inputs),
        tuple(id(v) for v in graph.outputs),
        tuple((n.inputs, n.attrs, n.outputs, n.regions, n.path, n.source) for n in nodes),
    )


def same_snapshot(graph: Graph, before: tuple) -> bool:
    return snapshot(graph) == before  # Values, Nodes and Graphs compare by identity


# -- building graphs --------------------------------------------------------------------------


def const(value, dtype=np.float32):
    """A constant node holding ``value`` (any shape) in ``dtype``."""
    return apply("constant", value=np.asarray(value, dtype=dtype))


def splat(value, shape, dtype=np.float32):
    """``broadcast_in_dim`` of a scalar constant: how traced graphs spell zeros/ones."""
    return apply("broadcast_in_dim", const(value, dtype), shape=tuple(shape), broadcast_dimensions=())
