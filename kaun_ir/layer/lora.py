"""LoRA: low-rank adapters on chosen weight matrices of any model (``kn.layer.lora``).

``lora(model, rank, targets)`` is a layer whose parameters are ``{"base": <model's params>,
"lora": {<path>: {"a": [in, rank], "b": [rank, out]}}}``: every targeted matrix ``W`` of the base
model (weights are ``[in, out]`` in kaun_ir) is used as ``W + (alpha / rank) * a @ b``. ``b``
starts at zero, so the adapted model starts as the base model. Train the adapters only by
freezing ``base`` in the optimiser (``optim.freeze(opt, lambda path: path.startswith("base."))``):
the base weights are neither copied nor given optimiser state. :func:`lora_merge` folds the
adapters back into plain variables of the base model; :func:`lora_vars` puts fresh adapters
around loaded (e.g. pretrained) variables.
"""

from __future__ import annotations

import math
import numbers
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kaun_ir import ptree
from kaun_ir.ir.builder import scope
from kaun_ir.layer.construct import make_param
from kaun_ir.layer.core import Layer, Vars, check_layer
from kaun_ir.layer.given import check_given, expected_vars
from kaun_ir.layer.initialise import child_init
from kaun_ir.nn import init as initializers
from kaun_ir.surface.elementwise import add, multiply
from kaun_ir.surface.linalg import matmul
from kaun_ir.surface.promotion import astype, dtype_of, shape_of
from kaun_ir.tree import nested as nested_tree

__all__ = ["lora", "lora_merge", "lora_vars", "lora_frozen"]


@dataclass(frozen=True)
class _Config:
    model: Layer
    rank: int
    scale: float
    matches: Callable[[str], bool]
    describe: str


_CONFIGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _matcher(targets: Any) -> tuple[Callable[[str], bool], str]:
    if callable(targets):
        return targets, getattr(targets, "__name__", "predicate")
    patterns = [targets] if isinstance(targets, str) else targets
    if (
        not isinstance(patterns, (list, tuple))
        or not patterns
        or not all(isinstance(p, str) for p in patterns)
    ):
        raise TypeError(
            "layer.lora: targets must be a regular expression on dotted parameter paths, a list of "
            f"them, or a predicate path -> bool; got {targets!r}"
        )
    try:
        compiled = [re.compile(p) for p in patterns]
    except re.error as err:
        raise ValueError(f"layer.lora: targets {patterns!r}: not a regular expression ({err})") from None
    return (lambda path: any(c.fullmatch(path) for c in compiled)), repr(patterns)


def lora(model: Layer, rank: int, targets: Any, alpha: float | None = None, name: str = "lora") -> Layer:
    """``model`` with rank-``rank`` adapters on the weight matrices ``targets`` selects.

    ``targets``: a regular expression matched in full against dotted parameter paths (e.g.
    ``r"layers\\.\\d+\\.attn\\.(query|value)\\.weight"``), a list of them, or a predicate
    ``path -> bool``; every selected leaf must be 2-D. ``alpha``: the scale is ``alpha / rank``
    (default ``alpha = rank``: scale 1). Adapter ``a`` is drawn He-uniform from the ``kn.rng``
    scope after the base model's parameters (so the base parameters are those of ``model`` for
    the same seed), ``b`` is zero. Layer paths inside are the base model's."""
    check_layer(model, "layer.lora: model")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"layer.lora: rank must be a positive int, got {rank!r}")
    if alpha is not None and not _positive_number(alpha):
        raise ValueError(
            f"layer.lora: alpha must be a finite number > 0 (the adapters' scale is alpha / rank), "
            f"got {alpha!r}; leave it out for scale 1"
        )
    if not isinstance(name, str):
        raise TypeError(f"layer.lora: name must be a str, got {type(name).__name__}")
    scale = float(rank if alpha is None else alpha) / rank
    matches, describe = _matcher(targets)
    config = _Config(model, rank, scale, matches, describe)

    def init_(dt, x=None):
        base = child_init(model, dt, x)
        return Vars({"base": base.params, "lora": _adapters(config, base.params, dt)}, base.state, dt)

    def apply_(params, state, x, *, training, ctx):
        with scope("lora"):
            merged = _merged(config, params)
        return model.apply(merged, state, x, training=training, ctx=ctx)

    adapted = Layer(init_, apply_, name)
    _CONFIGS[adapted] = config
    return adapted


def _positive_number(value: Any) -> bool:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    return ok and math.isfinite(value) and value > 0


def _selected(config: _Config, base: Any) -> list[tuple[str, Any]]:
    chosen = [(path, leaf) for path, leaf in ptree.flatten_with_paths(base) if config.matches(path)]
    if not chosen:
        paths = [path for path, _ in ptree.flatten_with_paths(base)]
        raise ValueError(
            f"layer.lora: targets {config.describe} select no parameter of {config.model.name!r}; its "
            f"paths are {paths[:12]}{' ...' if len(paths) > 12 else ''}"
        )
    for path, leaf in chosen:
        if len(shape_of(leaf)) != 2:
            raise ValueError(
                f"layer.lora: the target {path!r} has shape {list(shape_of(leaf))}; adapters go on "
                "2-D weight matrices [in, out]"
            )
        if config.rank > min(shape_of(leaf)):
            raise ValueError(
                f"layer.lora: rank {config.rank} is larger than the target {path!r} of shape "
                f"{list(shape_of(leaf))}: a rank above min(in, out) = {min(shape_of(leaf))} adds "
                "parameters without adding capacity; choose a smaller rank"
            )
    return chosen


def _adapters(config: _Config, base: Any, dt) -> dict:
    adapters = []
    for path, leaf in _selected(config, base):
        n_in, n_out = shape_of(leaf)
        with scope(f"lora.{path}"):
            a = make_param(initializers.he_uniform(), (n_in, config.rank), dt)
            b = make_param(initializers.zeros, (config.rank, n_out), dt)
        adapters.append((path, {"a": a, "b": b}))
    return nested_tree(adapters)


def _merged(config: _Config, params: Any) -> Any:
    """The base parameters with ``W + scale * a @ b`` at every adapted path."""
    if not isinstance(params, dict) or set(params) != {"base", "lora"}:
        raise ValueError(
            'layer.lora: the parameters must be {"base": ..., "lora": ...} (from layer.init '
            "or layer.lora_vars)"
        )
    found = dict(ptree.flatten_with_paths(params["lora"]))
    leaves, rebuild = ptree.flatten(params["base"])
    out = []
    for (path, w), leaf in zip(ptree.flatten_with_paths(params["base"]), leaves):
        a, b = found.get(f"{path}.a"), found.get(f"{path}.b")
        if a is None:
            out.append(leaf)
            continue
        delta = matmul(a, b)
        if config.scale != 1.0:
            delta = multiply(delta, config.scale)
        out.append(astype(add(w, astype(delta, dtype_of(w))), dtype_of(w)))
    return rebuild(out)


def _config(adapted: Layer, where: str) -> _Config:
    config = _CONFIGS.get(adapted) if isinstance(adapted, Layer) else None
    if config is None:
        raise TypeError(f"layer.{where}: expected a layer made by kn.layer.lora, got {adapted!r}")
    return config


def lora_merge(adapted: Layer, v: Vars) -> Vars:
    """Plain variables of the base model with the adapters folded in (``W + scale * a @ b``):
    ``layer.apply(model, lora_merge(adapted, v), x)`` equals ``layer.apply(adapted, v, x)`` up to
    float rounding, without the per-call adapter product."""
    config = _config(adapted, "lora_merge")
    merged = _merged(config, v.params)
    return Vars(merged, v.state, v.dtype)


def lora_vars(adapted: Layer, base: Vars) -> Vars:
    """Variables of ``adapted`` around the base model's ``base`` (e.g. loaded pretrained weights):
    fresh adapters (``a`` from the current ``kn.rng`` scope, ``b`` zero), base arrays reused."""
    config = _config(adapted, "lora_vars")
    if not isinstance(base, Vars):
        raise TypeError(
            f"layer.lora_vars: base must be the base model's layer.Vars, got {type(base).__name__}"
        )
    want_params, _ = expected_vars(config.model, None, base.dtype)
    check_given(config.model, "layer.lora_vars", "base parameters", want_params, base.params)
    return Vars(
        {"base": base.params, "lora": _adapters(config, base.params, base.dtype)}, base.state, base.dtype
    )


def lora_frozen(path: str) -> bool:
    """The optimiser mask of LoRA fine-tuning: True (frozen) for the base model's parameters,
    for ``optim.freeze(optimizer, layer.lora_frozen)``."""
    if not isinstance(path, str):
        raise TypeError(f"layer.lora_frozen: expected a dotted parameter path (str), got {path!r}")
    return path == "base" or path.startswith("base.")
