"""Jacobians and Hessians: ``kn.jacfwd``, ``kn.jacrev``, ``kn.hessian``, ``kn.hvp``.

``jacfwd`` maps ``kn.jvp`` over the standard basis of the input (one column per input element)
and ``jacrev`` maps the VJP over the standard basis of the output (one row per output
element), both with ``kn.vmap``, so a Jacobian is one batched graph, not a Python loop.
``hessian`` is ``jacfwd(jacrev(f))``; ``hvp`` is forward over reverse, ``jvp`` of ``grad``.

Shapes follow ``jax``: the Jacobian of an output leaf of shape ``O`` w.r.t. an input leaf of
shape ``I`` has shape ``O + I``; for a tree argument each output leaf holds a tree shaped like
the argument.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from kaun_ir import tree
from kaun_ir.ir.builder import current_builder
from kaun_ir.surface.creation import zeros_like
from kaun_ir.surface.function import jit, op_function
from kaun_ir.surface.shapes import reshape
from kaun_ir.surface.tensor import type_of
from kaun_ir.surface.trace import is_array_leaf, trace_flat
from kaun_ir.transforms.autodiff import GradientError, _vjp_traced, differentiable, grad
from kaun_ir.transforms.autodiff import (
    _normalize_argnums as _argnums,  # one argnums rule for grad and the Jacobians
)
from kaun_ir.transforms.jvp import jvp
from kaun_ir.transforms.vmap import vmap


def _float_leaves(x, what: str) -> tuple[list, object]:
    leaves, treedef = tree.flatten(x)
    for path, leaf in tree.paths(x):
        t = type_of(leaf)
        if not differentiable(t):
            where = f"{what}" + (f" leaf {path!r}" if path else "")
            raise GradientError(
                f"cannot take a Jacobian with respect to {where} of type {t}: only "
                "floating-point arrays have derivatives"
            )
    return leaves, treedef


def _basis(types, dtype) -> list[np.ndarray]:
    """The standard basis of the flattened leaves, split back into one ``[n, *shape]`` per leaf."""
    n = sum(t.size for t in types)
    eye = np.eye(n, dtype=dtype)
    pieces, start = [], 0
    for t in types:
        pieces.append(eye[:, start : start + t.size].reshape((n,) + t.shape))
        start += t.size
    return pieces


def _eager(inner: Callable, name: str) -> Callable:
    inner.__name__ = name
    return op_function(inner)


def jacfwd(f: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Jacobian of ``f`` w.r.t. ``argnums`` by forward mode (a ``jvp`` per input element)."""

    def inner(*args):
        nums, single = _argnums(argnums, len(args))
        results = []
        for a in nums:
            leaves, treedef = _float_leaves(args[a], f"argument {a}")
            types = [type_of(x) for x in leaves]
            basis = _basis(types, types[0].dtype if types else np.float32)

            def column(*tangent_leaves, a=a, treedef=treedef):
                tangents = tuple(
                    tree.unflatten(treedef, list(tangent_leaves)) if k == a else _zero_tangent(args[k])
                    for k in range(len(args))
                )
                return jvp(f, args, tangents)[1]

            columns = vmap(column, out_axes=-1)(*basis)  # each output leaf: O + (n,)
            results.append(_split_last(columns, types, treedef))
        return results[0] if single else tuple(results)

    return _eager(inner, f"jacfwd_{getattr(f, '__name__', 'f')}")


def _zero_tangent(arg):
    """Zero tangents for an argument that is not differentiated (its primal's own types)."""
    leaves, treedef = tree.flatten(arg)
    return tree.unflatten(treedef, [zeros_like(x) if is_array_leaf(x) else x for x in leaves])


def _split_last(out, types, treedef):
    """Each output leaf ``O + (n,)`` split into one block ``O + shape`` per input leaf."""

    def split(leaf):
        blocks, start = [], 0
        base = tuple(leaf.shape[:-1])
        for t in types:
            piece = leaf[(slice(None),) * len(base) + (slice(start, start + t.size),)]
            blocks.append(reshape(piece, base + t.shape))
            start += t.size
        return tree.unflatten(treedef, blocks)

    leaves, out_def = tree.flatten(out)
    return tree.unflatten(out_def, [split(x) for x in leaves])


def jacrev(f: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Jacobian of ``f`` w.r.t. ``argnums`` by reverse mode (a VJP per output element)."""

    def inner(*args):
        nums, single = _argnums(argnums, len(args))
        for a in nums:
            _float_leaves(args[a], f"argument {a}")
        traced = trace_flat(f, args, {})
        out_types = list(traced.graph.output_types)
        for k, t in enumerate(out_types):
            if not differentiable(t):
                raise GradientError(f"jacrev: output {k} of type {t} is not floating point")
        basis = _basis(out_types, out_types[0].dtype if out_types else np.float32)

        def row(*ct_leaves):
            cotangent = tree.unflatten(traced.out_treedef, list(ct_leaves))
            cts = _vjp_traced(f, args, cotangent)
            return tuple(cts[a] for a in nums)

        rows = vmap(row)(*basis)  # per argument: leaves of shape (n_out,) + leaf shape
        results = [_split_first(r, out_types, traced.out_treedef) for r in rows]
        return results[0] if single else tuple(results)

    return _eager(inner, f"jacrev_{getattr(f, '__name__', 'f')}")


def _split_first(rows_of_arg, out_types, out_treedef):
    """Leaves ``(n_out,) + I`` of one argument -> an output-shaped tree whose every leaf holds the
    argument's tree of blocks ``O + I``."""
    arg_leaves, arg_def = tree.flatten(rows_of_arg)
    per_output, start = [], 0
    for t in out_types:
        blocks = [
            reshape(leaf[start : start + t.size], t.shape + tuple(leaf.shape[1:])) for leaf in arg_leaves
        ]
        per_output.append(tree.unflatten(arg_def, blocks))
        start += t.size
    return tree.unflatten(out_treedef, per_output)


def hessian(f: Callable, argnums: int | Sequence[int] = 0) -> Callable:
    """The Hessian of scalar ``f``: ``jacfwd(jacrev(f))`` (forward over reverse)."""
    return jacfwd(jacrev(f, argnums), argnums)


def hvp(f: Callable, primals: Sequence, tangents: Sequence):
    """The Hessian-vector product of scalar ``f`` at ``primals`` along ``tangents``, forward over
    reverse (``jvp`` of ``grad``), without forming the Hessian. Returns the gradient's tangent,
    structured like ``primals`` (a tuple, one entry per argument)."""
    primals = tuple(primals)
    gradient = grad(f, argnums=tuple(range(len(primals))))
    if current_builder() is None:
        return jit(lambda p, t: jvp(gradient, p, t)[1])(primals, tuple(tangents))
    return jvp(gradient, primals, tuple(tangents))[1]
