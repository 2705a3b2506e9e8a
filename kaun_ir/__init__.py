"""kaun_ir: a graph-compiling deep-learning framework.

Functions trace into kaun_ir's own SSA IR, passes transform it, and the result is lowered to
StableHLO and run by XLA. ``import kaun_ir as kn``; see README.md and docs/.
"""

import os as _os
import sys as _sys

__version__ = "0.1.0"


def _command_is_starting() -> bool:
    """Whether this process is the ``kaun-ir`` command, before it has chosen what to run."""
    argv0 = getattr(_sys, "argv", None) and _sys.argv[0]
    return bool(argv0) and _os.path.splitext(_os.path.basename(argv0))[0] == "kaun-ir"


def _load_all() -> None:
    """Import the whole ``kn.*`` surface now, if it was deferred (see below); idempotent."""
    global _DEFER
    if _DEFER:
        _DEFER = False
        import importlib

        importlib.reload(_sys.modules[__name__])


# Importing kaun_ir imports the whole framework (about a second). The ``kaun-ir`` command needs
# none of it to print its --help, so while it starts this waits: tools/cli.py calls _load_all()
# once the command line is parsed, before any command runs. Everything else gets it all at once.
_DEFER = globals().get("_DEFER", _command_is_starting())

if not _DEFER:
    from . import (
        checkpoint,
        data,
        datasets,
        debug,
        distributed,
        dtypes,
        fn,
        init,
        ir,
        layer,
        loss,
        metric,
        models,
        ops,
        optim,
        passes,
        precision,
        primitives,
        ptree,
        random,
        rng,
        runtime,
        sharding,
        testing,
        train,
    )
    from .autodiff import GradientError, grad, stop_gradient, value_and_grad, vjp
    from .batching import BatchingError, vmap
    from .control import fori_loop, scan, while_loop
    from .custom import CustomDerivativeError, custom_jvp, custom_vjp
    from .dtypes import (
        bfloat16,
        bool_,
        float16,
        float32,
        float64,
        int8,
        int16,
        int32,
        int64,
        uint8,
        uint16,
        uint32,
        uint64,
    )
    from .ein import ein
    from .errors import CompileError, IRError, KaunError, NonFiniteError, ParseError, ShapeError
    from .forward import jvp, linearize
    from .indexing import (
        advanced_getitem,
        dynamic_slice,
        dynamic_update_slice,
        one_hot,
        take,
        take_along_axis,
    )
    from .ir.core import Graph, TensorType
    from .jacobian import hessian, hvp, jacfwd, jacrev
    from .linalg import dot, einsum, matmul, outer, tensordot
    from .numeric import (
        abs,
        add,
        arange,
        arctan2,
        astype,
        bitwise_and,
        bitwise_or,
        bitwise_xor,
        broadcast_shapes,
        broadcast_to,
        ceil,
        clip,
        concatenate,
        cos,
        divide,
        dtype_of,
        equal,
        erf,
        exp,
        expand_dims,
        expm1,
        floor,
        floor_divide,
        full,
        full_like,
        getitem,
        greater,
        greater_equal,
        invert,
        left_shift,
        less,
        less_equal,
        log,
        log1p,
        logical_not,
        maximum,
        minimum,
        mod,
        multiply,
        negative,
        not_equal,
        ones,
        ones_like,
        power,
        promote,
        reciprocal,
        remainder,
        reshape,
        right_shift,
        round,
        rsqrt,
        shape_of,
        sigmoid,
        sign,
        sin,
        sqrt,
        square,
        squeeze,
        stack,
        subtract,
        tanh,
        transpose,
        true_divide,
        where,
        zeros,
        zeros_like,
    )
    from .reductions import (
        all,
        any,
        argmax,
        argmin,
        log_softmax,
        logsumexp,
        max,
        mean,
        min,
        prod,
        softmax,
        std,
        sum,
        var,
    )
    from .rematerialize import RematPolicy, remat
    from .runtime import jit
    from .sorting import argsort, sort, top_k
    from .tensor import Tensor, TracerError
    from .trace import ShapeDtype, trace

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
    "fn",
    "init",
    "ir",
    "layer",
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
    # numeric (the NumPy-style functions)
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
]
