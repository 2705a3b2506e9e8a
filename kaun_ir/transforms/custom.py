"""``kn.custom_vjp`` and ``kn.custom_jvp``: functions whose derivative the user defines.

The API follows ``jax.custom_vjp`` / ``jax.custom_jvp``::

    @kn.custom_vjp
    def clip_gradient(x):
        return x

    def fwd(x):
        return x, ()                       # output, residuals

    def bwd(residuals, g):
        return (kn.clip(g, -1.0, 1.0),)    # one cotangent per argument

    clip_gradient.defvjp(fwd, bwd)

Each call traces the function (and its rules) at the argument types into the regions of one
``custom_vjp`` / ``custom_jvp`` node (``kaun_ir/ops/custom.py``), so the function stays one
node of the IR with its derivative attached. The functions must not close over values of an
enclosing trace (pass them as arguments); Python scalars and other non-array arguments are
static.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from kaun_ir import tree
from kaun_ir.errors import CustomDerivativeError
from kaun_ir.ir.builder import Builder, current_builder
from kaun_ir.ir.core import Graph, TensorType
from kaun_ir.surface.function import jit
from kaun_ir.surface.tensor import Tensor, apply, to_value, type_of
from kaun_ir.surface.trace import is_array_leaf


def _leaf_types(args) -> tuple[list[TensorType], list[int], Any, list]:
    leaves, treedef = tree.flatten(args)
    positions = [i for i, leaf in enumerate(leaves) if is_array_leaf(leaf)]
    return [type_of(leaves[i]) for i in positions], positions, treedef, leaves


def _trace_region(fn: Callable, in_types: list[TensorType], name: str, what: str) -> tuple[Graph, Any]:
    """Trace ``fn(*tensors)`` into a graph; returns the graph and the output tree structure."""
    with Builder(record_source=False) as builder:
        args = [Tensor(builder.add_input(t), builder) for t in in_types]
        out = fn(*args)
        leaves, out_def = tree.flatten(out)
        outputs = [to_value(builder, leaf) for leaf in leaves]
    if builder.captures:
        raise CustomDerivativeError(
            f"{what} of {name} uses a value of an enclosing trace ({builder.captures[0].type}); pass "
            "it as an argument instead of closing over it"
        )
    return builder.finish(outputs, name=what), out_def


class _Custom:
    def __init__(self, fun: Callable):
        self.fun = fun
        self.name = getattr(fun, "__name__", "custom")
        if not self.name.isidentifier():
            self.name = "custom"
        self.__doc__ = getattr(fun, "__doc__", None)
        self.__name__ = self.name
        self._jitted = None
        self._in_rules = False

    def _rules(self, fn: Callable, in_types, what: str):
        """Trace a rule region; calls of the function inside it are plain calls."""
        self._in_rules = True
        try:
            return _trace_region(fn, in_types, self.name, what)
        finally:
            self._in_rules = False

    def _symbolic(self, args: tuple, in_types):
        """A function of the flat array leaves that calls ``fn`` with ``args``' structure."""
        _, positions, treedef, leaves = _leaf_types(args)

        def rebuild(tensors):
            full = list(leaves)
            for i, t in zip(positions, tensors):
                full[i] = t
            return tree.unflatten(treedef, full)

        return rebuild

    def __call__(self, *args):
        if self._in_rules:
            # the rules call the function itself (``return f(x), ...``): there it is the plain
            # function, as in jax (its derivative inside a rule is never taken)
            return self.fun(*args)
        if current_builder() is None:  # concrete arguments: compile (once per signature)
            if self._jitted is None:
                self._jitted = jit(self._traced)
            return self._jitted(*args)
        return self._traced(*args)


def _check_cotangents(result, args: tuple, in_types, rebuild_positions, name: str, what: str) -> list:
    """Flat cotangents / tangents, one per array leaf, from a tuple with one tree per argument
    (None: zero)."""
    if not isinstance(result, (tuple, list)) or len(result) != len(args):
        raise CustomDerivativeError(
            f"{what} of {name} must return a tuple with one entry per argument "
            f"({len(args)}), got {type(result).__name__}"
            + (f" of length {len(result)}" if isinstance(result, (tuple, list)) else "")
        )
    flat = []
    for i, (arg, ct) in enumerate(zip(args, result)):
        arg_leaves, arg_def = tree.flatten(arg)
        if ct is None:
            ct_leaves = [None] * len(arg_leaves)
        else:
            ct_leaves, ct_def = tree.flatten(ct, is_leaf=lambda x: x is None)
            if len(ct_leaves) != len(arg_leaves):
                raise CustomDerivativeError(
                    f"{what} of {name}: the entry for argument {i} must have the argument's tree structure"
                )
        for leaf, c in zip(arg_leaves, ct_leaves):
            if not is_array_leaf(leaf):
                continue
            t = type_of(leaf)
            if c is None:
                c = apply(
                    "broadcast_in_dim",
                    apply("constant", value=np.zeros((), t.dtype)),
                    shape=t.shape,
                    broadcast_dimensions=(),
                )
            elif not isinstance(c, Tensor):  # a concrete value: a constant of the argument's type
                c = apply("constant", value=np.broadcast_to(np.asarray(c, t.dtype), t.shape).copy())
            if c.type != t:
                raise CustomDerivativeError(
                    f"{what} of {name} returned {c.type} for argument {i} of type {t}"
                )
            flat.append(c)
    return flat


class custom_vjp(_Custom):  # noqa: N801 - a decorator, named like jax's
    """Decorate ``fun`` to give it a user-defined VJP; then call ``fun.defvjp(fwd, bwd)``.

    - ``fwd(*args) -> (output, residuals)``: the output must be ``fun``'s (same structure,
      shapes and dtypes); ``residuals`` is any tree of arrays.
    - ``bwd(residuals, g) -> tuple``: ``g`` has the output's structure; returns one entry per
      argument of ``fun``, each shaped like that argument (``None`` for a zero cotangent).
    ``fun`` runs when nothing is differentiated; ``fwd`` / ``bwd`` when reverse mode (``kn.grad``,
    ``kn.vjp``) or forward mode (``kn.jvp``, derived from it) needs the derivative.
    """

    def __init__(self, fun: Callable):
        super().__init__(fun)
        self.fwd = self.bwd = None

    def defvjp(self, fwd: Callable, bwd: Callable) -> custom_vjp:
        """Set the rules; returns the decorated function."""
        self.fwd, self.bwd = fwd, bwd
        return self

    def _traced(self, *args):
        if self.fwd is None:
            raise CustomDerivativeError(
                f"custom_vjp function {self.name} has no rules: call {self.name}.defvjp(fwd, bwd) first"
            )
        in_types, positions, _, leaves = _leaf_types(args)
        rebuild = self._symbolic(args, in_types)
        primal, out_def = _trace_region(lambda *t: self.fun(*rebuild(t)), in_types, self.name, "primal")
        res_def = []

        def fwd_flat(*t):
            result = self.fwd(*rebuild(t))
            if not (isinstance(result, tuple) and len(result) == 2):
                raise CustomDerivativeError(f"fwd of {self.name} must return (output, residuals)")
            out, residuals = result
            out_leaves, d = tree.flatten(out)
            if d != out_def:
                raise CustomDerivativeError(
                    f"fwd of {self.name} must return an output structured like {self.name}'s"
                )
            res_leaves, rd = tree.flatten(residuals)
            res_def.append(rd)
            return list(out_leaves) + list(res_leaves)

        fwd, _ = self._rules(fwd_flat, in_types, "fwd")
        n_out = len(primal.outputs)
        if tuple(fwd.output_types[:n_out]) != tuple(primal.output_types):
            got = ", ".join(map(str, fwd.output_types[:n_out]))
            want = ", ".join(map(str, primal.output_types))
            raise CustomDerivativeError(
                f"fwd of {self.name} returns an output of types ({got}) but {self.name} returns ({want})"
            )
        res_types = list(fwd.output_types[n_out:])

        def bwd_flat(*t):
            residuals = tree.unflatten(res_def[0], list(t[: len(res_types)]))
            g = tree.unflatten(out_def, list(t[len(res_types) :]))
            return _check_cotangents(self.bwd(residuals, g), args, in_types, positions, self.name, "bwd")

        bwd, _ = self._rules(bwd_flat, res_types + list(primal.output_types), "bwd")
        operands = [leaves[i] for i in positions]
        outs = apply("custom_vjp", *operands, regions=(primal, fwd, bwd), name=self.name, num_outputs=n_out)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tree.unflatten(out_def, list(outs))


class custom_jvp(_Custom):  # noqa: N801 - a decorator, named like jax's
    """Decorate ``fun`` to give it a user-defined JVP; then set the rule with ``fun.defjvp``.

    The rule is ``jvp(primals, tangents) -> (output, tangent_output)``, ``primals`` and
    ``tangents`` being tuples with one entry per argument; it must be linear in the tangents.
    Forward mode uses it directly; reverse mode uses its transpose (built by reverse mode), so a
    ``custom_jvp`` function can be differentiated both ways.
    """

    def __init__(self, fun: Callable):
        super().__init__(fun)
        self.rule = None

    def defjvp(self, rule: Callable) -> Callable:
        """Set the JVP rule (usable as a decorator); returns the rule."""
        self.rule = rule
        return rule

    def _traced(self, *args):
        if self.rule is None:
            raise CustomDerivativeError(
                f"custom_jvp function {self.name} has no rule: decorate one with @{self.name}.defjvp"
            )
        in_types, positions, _, leaves = _leaf_types(args)
        rebuild = self._symbolic(args, in_types)
        primal, out_def = _trace_region(lambda *t: self.fun(*rebuild(t)), in_types, self.name, "primal")
        n_in = len(in_types)

        def rule_flat(*t):
            primals, tangents = rebuild(t[:n_in]), rebuild(t[n_in:])
            result = self.rule(tuple(primals), tuple(tangents))
            if not (isinstance(result, tuple) and len(result) == 2):
                raise CustomDerivativeError(f"the jvp rule of {self.name} must return (output, tangent)")
            out, tangent = result
            out_leaves, d1 = tree.flatten(out)
            t_leaves, d2 = tree.flatten(tangent)
            if d1 != out_def or d2 != out_def:
                raise CustomDerivativeError(
                    f"the jvp rule of {self.name} must return an output and a "
                    f"tangent structured like {self.name}'s output"
                )
            return list(out_leaves) + list(t_leaves)

        rule, _ = self._rules(rule_flat, in_types + in_types, "jvp")
        outs_t = primal.output_types
        if tuple(rule.output_types) != tuple(outs_t) + tuple(outs_t):
            got = ", ".join(map(str, rule.output_types))
            raise CustomDerivativeError(
                f"the jvp rule of {self.name} returns ({got}); expected the output "
                f"types ({', '.join(map(str, outs_t))}) twice (output, tangent)"
            )
        operands = [leaves[i] for i in positions]
        outs = apply("custom_jvp", *operands, regions=(primal, rule), name=self.name)
        outs = outs if isinstance(outs, tuple) else (outs,)
        return tree.unflatten(out_def, list(outs))


__all__ = ["custom_vjp", "custom_jvp", "CustomDerivativeError"]
