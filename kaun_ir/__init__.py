"""kaun_ir: a graph-compiling deep-learning framework.

Functions trace into kaun_ir's own SSA IR, passes transform it, and the result is lowered to
StableHLO and run by XLA. ``import kaun_ir as kn``; see README.md and docs/.
"""

from . import (  # noqa: E402  # noqa: E402  (both build on the core above)  # noqa: E402  (user-defined ops and their test helper)  # noqa: E402  # noqa: E402  # noqa: E402  # noqa: E402
    checkpoint,
    data,
    datasets,
    debug,  # noqa: E402
    distributed,
    dtypes,
    fn,
    init,
    ir,
    layer,
    loss,
    metric,
    models,  # noqa: E402
    ops,
    optim,
    passes,
    precision,  # noqa: E402
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
from .batching import BatchingError, vmap  # noqa: E402
from .control import fori_loop, scan, while_loop
from .custom import CustomDerivativeError, custom_jvp, custom_vjp  # noqa: E402
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
from .forward import jvp, linearize  # noqa: E402
from .indexing import *  # noqa: F401,F403
from .ir.core import Graph, TensorType
from .jacobian import hessian, hvp, jacfwd, jacrev  # noqa: E402
from .linalg import *  # noqa: F401,F403
from .numeric import *  # noqa: F401,F403 - the NumPy-style surface
from .reductions import *  # noqa: F401,F403
from .rematerialize import RematPolicy, remat  # noqa: E402
from .runtime import jit
from .sorting import argsort, sort, top_k  # noqa: F401
from .tensor import Tensor, TracerError
from .trace import ShapeDtype, trace

__version__ = "0.1.0"
