"""kaun_ir: a graph-compiling deep-learning framework.

Functions trace into kaun_ir's own SSA IR, passes transform it, and the result is lowered to
StableHLO and run by XLA. ``import kaun_ir as kn``; see README.md and docs/.

Every ``kn.NAME`` is loaded on first use (PEP 562 ``__getattr__``): ``import kaun_ir`` itself
imports nothing, so the ``kaun-ir`` command answers ``--help`` at once and a program pays only for
what it touches. The tables below say where each public name is defined; the tree of the package
is described in docs/architecture.md. The slots by which upper layers serve lower ones are filled
by :mod:`kaun_ir.wiring` when first needed; this file registers it with :mod:`kaun_ir.hooks`.
"""

import importlib as _importlib

from kaun_ir import hooks as _hooks
from kaun_ir.version import __version__ as __version__


def _install() -> None:
    """Fill the lower layers' slots (kaun_ir.wiring); run by kaun_ir.hooks on first need."""
    from kaun_ir import wiring  # noqa: PLC0415 - the composition root loads the runtime: only when needed

    wiring.install()


_hooks.set_installer(_install)

# subpackages and modules: kn.NAME -> the module
_MODULES = {
    "checkpoint": "kaun_ir.checkpoint",
    "data": "kaun_ir.data",
    "datasets": "kaun_ir.datasets",
    "debug": "kaun_ir.debug",
    "dtypes": "kaun_ir.dtypes",
    "errors": "kaun_ir.errors",
    "ir": "kaun_ir.ir",
    "layer": "kaun_ir.layer",
    "models": "kaun_ir.models",
    "ops": "kaun_ir.ops",
    "optim": "kaun_ir.optim",
    "passes": "kaun_ir.passes",
    "precision": "kaun_ir.precision",
    "ptree": "kaun_ir.ptree",
    "rng": "kaun_ir.rng",
    "runtime": "kaun_ir.runtime",
    # the graph-level halves of vmap and jvp, spelled so in docs/transforms.md
    "batching": "kaun_ir.transforms.vmap",
    "forward": "kaun_ir.transforms.jvp",
    "sharding": "kaun_ir.sharding",
    "testing": "kaun_ir.testing",
    "train": "kaun_ir.train",
    "distributed": "kaun_ir.sharding.processes",
    "fn": "kaun_ir.nn.fn",
    "init": "kaun_ir.nn.init",
    "loss": "kaun_ir.nn.loss",
    "metric": "kaun_ir.nn.metric",
    "primitives": "kaun_ir.surface.primitives",
    "random": "kaun_ir.surface.random",
    # NumPy's and JAX's linalg spelling: kn.linalg.solve, kn.linalg.cholesky ...
    "linalg": "kaun_ir.surface.decompositions",
    "interop": "kaun_ir.runtime.interop",
}
# functions, classes and constants: the module that defines each (names separated by spaces)
_DEFINED_IN = {
    "kaun_ir.runtime": "jit",
    "kaun_ir.surface.tensor": "Tensor",
    "kaun_ir.ir.core": "Graph TensorType",
    "kaun_ir.surface.trace": "ShapeDtype trace",
    "kaun_ir.transforms.autodiff": "grad value_and_grad vjp",
    "kaun_ir.transforms.jvp": "jvp linearize",
    "kaun_ir.transforms.jacobian": "jacfwd jacrev hessian hvp",
    "kaun_ir.transforms.vmap": "vmap",
    "kaun_ir.surface.control": "scan while_loop fori_loop",
    "kaun_ir.transforms.custom": "custom_jvp custom_vjp",
    "kaun_ir.transforms.remat": "remat RematPolicy",
    "kaun_ir.errors": (
        "KaunError BatchingError CompileError CustomDerivativeError GradientError IRError NonFiniteError "
        "ParseError ShapeError TracerError"
    ),
    "kaun_ir.dtypes": (
        "bool_ int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 bfloat16 float32 float64"
    ),
    "kaun_ir.surface.promotion": "astype broadcast_shapes broadcast_to dtype_of promote shape_of",
    "kaun_ir.surface.elementwise": (
        "stop_gradient abs add arctan2 bitwise_and bitwise_or bitwise_xor ceil clip cos divide equal erf exp "
        "expm1 floor floor_divide greater greater_equal invert left_shift less less_equal log log1p "
        "logical_not maximum minimum mod multiply negative not_equal power reciprocal remainder right_shift "
        "round rsqrt sigmoid sign sin sqrt square subtract tanh true_divide where"
    ),
    "kaun_ir.surface.shapes": "concatenate expand_dims reshape squeeze stack transpose",
    "kaun_ir.surface.creation": "arange full full_like ones ones_like zeros zeros_like",
    "kaun_ir.surface.reductions": (
        "sum mean max min prod var std argmax argmin logsumexp softmax log_softmax all any"
    ),
    "kaun_ir.surface.linalg": "matmul dot tensordot einsum outer",
    "kaun_ir.surface.ein": "ein",
    "kaun_ir.surface.take": "take take_along_axis one_hot",
    "kaun_ir.surface.dynamic_slice": "dynamic_slice dynamic_update_slice",
    "kaun_ir.surface.indexing": "getitem advanced_getitem",
    "kaun_ir.surface.sorting": "sort argsort top_k",
    # profiling (kn.profile)
    "kaun_ir.runtime.profiling": "profile",
    "kaun_ir.train.memory": "memory_report",
}

_WHERE = {name: module for module, names in _DEFINED_IN.items() for name in names.split()}


def __getattr__(name: str):
    """Load ``kn.NAME`` from the module that defines it (once; later lookups hit the global)."""
    if name in _MODULES:
        value = _importlib.import_module(_MODULES[name])
    elif name in _WHERE:
        value = getattr(_importlib.import_module(_WHERE[name]), name)
    else:
        raise AttributeError(f"module 'kaun_ir' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# The public surface of ``kn.*``, written out so that an import added to a module never widens it
# (tests/test_public_surface.py checks it against the modules' own ``__all__`` lists).
__all__ = [
    # subpackages and modules
    "checkpoint",
    "data",
    "datasets",
    "debug",
    "distributed",
    "dtypes",
    "errors",
    "fn",
    "init",
    "ir",
    "layer",
    "linalg",
    "loss",
    "metric",
    "models",
    "ops",
    "optim",
    "passes",
    "precision",
    "primitives",
    "ptree",
    "random",
    "rng",
    "runtime",
    "sharding",
    "testing",
    "train",
    "interop",
    # tracing, transformations, compilation
    "Tensor",
    "TracerError",
    "Graph",
    "TensorType",
    "ShapeDtype",
    "trace",
    "jit",
    "grad",
    "value_and_grad",
    "vjp",
    "stop_gradient",
    "GradientError",
    "jvp",
    "linearize",
    "jacfwd",
    "jacrev",
    "hessian",
    "hvp",
    "vmap",
    "BatchingError",
    "scan",
    "while_loop",
    "fori_loop",
    "custom_jvp",
    "custom_vjp",
    "CustomDerivativeError",
    "remat",
    "RematPolicy",
    "memory_report",
    # errors
    "KaunError",
    "CompileError",
    "IRError",
    "NonFiniteError",
    "ParseError",
    "ShapeError",
    # dtypes
    "bool_",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    # the NumPy-style functions (elementwise, promotion, shapes, creation, indexing)
    "abs",
    "add",
    "arange",
    "arctan2",
    "astype",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "broadcast_shapes",
    "broadcast_to",
    "ceil",
    "clip",
    "concatenate",
    "cos",
    "divide",
    "dtype_of",
    "equal",
    "erf",
    "exp",
    "expand_dims",
    "expm1",
    "floor",
    "floor_divide",
    "full",
    "full_like",
    "getitem",
    "greater",
    "greater_equal",
    "invert",
    "left_shift",
    "less",
    "less_equal",
    "log",
    "log1p",
    "logical_not",
    "maximum",
    "minimum",
    "mod",
    "multiply",
    "negative",
    "not_equal",
    "ones",
    "ones_like",
    "power",
    "promote",
    "reciprocal",
    "remainder",
    "reshape",
    "right_shift",
    "round",
    "rsqrt",
    "shape_of",
    "sigmoid",
    "sign",
    "sin",
    "sqrt",
    "square",
    "squeeze",
    "stack",
    "subtract",
    "tanh",
    "transpose",
    "true_divide",
    "where",
    "zeros",
    "zeros_like",
    # reductions
    "sum",
    "mean",
    "max",
    "min",
    "prod",
    "var",
    "std",
    "argmax",
    "argmin",
    "logsumexp",
    "softmax",
    "log_softmax",
    "all",
    "any",
    # linalg
    "matmul",
    "dot",
    "tensordot",
    "einsum",
    "outer",
    "ein",
    # indexing and sorting
    "take",
    "take_along_axis",
    "one_hot",
    "dynamic_slice",
    "dynamic_update_slice",
    "advanced_getitem",
    "sort",
    "argsort",
    "top_k",
    # profiling
    "profile",
]
