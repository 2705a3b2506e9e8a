"""kaun_ir: a graph-compiling deep-learning framework.

Functions trace into kaun_ir's own SSA IR, passes transform it, and the result is lowered to
StableHLO and run by XLA. ``import kaun_ir as kn``; see README.md and docs/.
"""

from . import dtypes, ir, ops, tree
from .dtypes import (bfloat16, bool_, float16, float32, float64, int8, int16, int32, int64, uint8,
                     uint16, uint32, uint64)
from .errors import CompileError, IRError, KaunError, NonFiniteError, ParseError, ShapeError
from .ir.core import Graph, TensorType
from .numeric import *  # noqa: F401,F403 - the NumPy-style surface
from .indexing import *  # noqa: F401,F403
from .linalg import *  # noqa: F401,F403
from .reductions import *  # noqa: F401,F403
from .sorting import argsort, sort, top_k  # noqa: F401
from .ein import ein
from .control import fori_loop, scan, while_loop
from .autodiff import GradientError, grad, stop_gradient, value_and_grad, vjp
from .batching import BatchingError, vmap  # noqa: E402
from .forward import jvp, linearize  # noqa: E402
from .jacobian import hessian, hvp, jacfwd, jacrev  # noqa: E402
from .custom import CustomDerivativeError, custom_jvp, custom_vjp  # noqa: E402
from . import fn, random  # noqa: E402
from .rematerialize import RematPolicy, remat  # noqa: E402
from . import precision  # noqa: E402
from .tensor import Tensor, TracerError
from .trace import ShapeDtype, trace

from . import passes, runtime  # noqa: E402  (both build on the core above)
from .runtime import jit
from . import debug  # noqa: E402
from . import primitives, testing  # noqa: E402  (user-defined ops and their test helper)
from . import checkpoint, data, datasets, ptree  # noqa: E402
from . import loss, metric, optim  # noqa: E402
from . import init, layer, rng, train  # noqa: E402
from . import distributed, sharding  # noqa: E402
from . import models  # noqa: E402

__version__ = "0.1.0"
