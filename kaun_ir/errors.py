"""The exceptions raised by kaun_ir: every public error class, each under :class:`KaunError`.

A class also derives from the builtin exception that code written against NumPy or JAX expects
(``ValueError``, ``TypeError`` ...), so ``except ValueError`` keeps working. The modules that
raise an error re-export it where it was spelled before (``kn.rng.NoScopeError``,
``kn.passes.PipelineError``); docs/errors.md lists them all. ``tests/test_errors.py`` checks that
no exception class is defined anywhere else.
"""

__all__ = [
    "KaunError",
    "IRError",
    "ShapeError",
    "GradientError",
    "ParseError",
    "CheckpointError",
    "CompileError",
    "NonFiniteError",
    "TracerError",
    "BatchingError",
    "CustomDerivativeError",
    "PrimitiveError",
    "EinSpecError",
    "NoScopeError",
    "InternalError",
    "RewriteError",
    "PipelineError",
    "PassOptionError",
    "PassCrash",
    "PassVerificationError",
    "StableHLOImportError",
    "ModelSpecError",
    "ProfilerError",
    "DistributedError",
    "TorchImportError",
    "BackendError",
]


class KaunError(Exception):
    """Base class of kaun_ir's own errors."""


class IRError(KaunError):
    """A graph breaks an invariant (names the node and the invariant)."""


class ShapeError(KaunError, ValueError):
    """An op got operands whose shapes it cannot take (names the op, the shapes, the layer path)."""


class GradientError(KaunError, TypeError):
    """A derivative was requested that does not exist (integer input, op without a derivative)."""


class ParseError(KaunError, ValueError):
    """Textual IR that does not parse; carries ``line`` and ``column`` (1-based)."""

    def __init__(self, message: str, line: int, column: int, text_line: str = ""):
        self.line, self.column, self.reason = line, column, message
        pointer = f"\n  {text_line}\n  {' ' * (column - 1)}^" if text_line else ""
        super().__init__(f"line {line}, column {column}: {message}{pointer}")


class CheckpointError(KaunError, ValueError):
    """A checkpoint file that cannot be read (a directory, empty, truncated, not SafeTensors);
    the message names the file and what is wrong with it."""


class CompileError(KaunError):
    """XLA rejected a lowered module; the message names a repro file holding the StableHLO."""


class NonFiniteError(KaunError, FloatingPointError):
    """A checked computation produced a NaN or an Inf (``kn.debug.check_finite``); the message
    names the first op that made one: op, forward or backward pass, layer path and source line."""


# --- tracing and transformations -------------------------------------------------------------


class TracerError(KaunError, TypeError):
    """A symbolic tensor was used where a concrete value is needed (``bool(t)``, ``np.asarray(t)``)."""


class BatchingError(KaunError, ValueError):
    """``kn.vmap`` was given axes or arguments that do not fit together, or an op cannot be batched."""


class CustomDerivativeError(KaunError, TypeError):
    """A custom derivative rule returned something that does not fit the function."""


class PrimitiveError(KaunError, TypeError):
    """A primitive declaration is incomplete or clashes with an existing op."""


class EinSpecError(KaunError, ValueError):
    """A ``kn.ein`` spec that is malformed or that the operands cannot satisfy.

    ``reason`` is the complaint, ``spec`` the spec and ``position`` the 0-based character offset
    of the offending item; the message shows the spec with a caret under it, after the layer
    ``path`` when the spec was used inside a model.
    """

    def __init__(self, message: str, spec: str, position: int, path: str = ""):
        self.reason, self.spec, self.position = message, spec, position
        where = f"{path}: " if path else ""
        super().__init__(f"{where}ein: {message}\n  {spec}\n  {' ' * max(position, 0)}^")


class NoScopeError(KaunError, RuntimeError):
    """``rng.next_key()`` (or ``layer.init``) was called outside every ``rng.scope`` / ``rng.run``."""


# --- passes ------------------------------------------------------------------------------------


class InternalError(KaunError, RuntimeError):
    """kaun_ir broke one of its own rules: a bug to report, not a problem with the input.

    The pass manager treats these as crashes (it writes a reproducer and raises
    :class:`PassCrash`) rather than as diagnostics about the graph.
    """


class RewriteError(InternalError):
    """A rewrite-rule table misbehaved: it did not converge, or a rule replaced a value by one of
    another type (a bug in the rules, not in the graph)."""


class PipelineError(KaunError, ValueError):
    """A malformed pipeline string, an unknown pass or option, or a badly typed option value."""


class PassOptionError(PipelineError):
    """A pass option with a value the pass does not accept: of another type, out of its declared
    bounds or not one of its choices (a user error, found when the pipeline is read, not a crash)."""


class PassCrash(KaunError):
    """A pass raised an unexpected exception; ``reproducer`` is the ``.kir`` file written for it."""

    def __init__(self, message: str, pass_name: str, index: int, reproducer: str | None):
        super().__init__(message)
        self.pass_name, self.index, self.reproducer = pass_name, index, reproducer


class PassVerificationError(IRError):
    """The IR failed ``Graph.verify()`` after a pass (``verify_each``); names the pass."""

    def __init__(self, message: str, pass_name: str | None, index: int):
        super().__init__(message)
        self.pass_name, self.index = pass_name, index


# --- runtime and tools ---------------------------------------------------------------------------


class StableHLOImportError(KaunError, ValueError):
    """A StableHLO module that cannot be imported: the message names the op and its location."""


class ModelSpecError(KaunError, ValueError):
    """The model named on the ``kaun-ir`` command line cannot be loaded or traced (a user error)."""


class ProfilerError(KaunError, RuntimeError):
    """``kn.profile`` could not start or stop a trace (e.g. another profile is already running)."""


# --- multi-process runs ---------------------------------------------------------------------


class DistributedError(KaunError, RuntimeError):
    """A multi-process run that cannot start or go on: the coordinator cannot be reached within
    the timeout, the processes disagree on ``num_processes``; the message names the address or
    the process."""


class TorchImportError(KaunError, ValueError):
    """A PyTorch program that cannot be imported: the message names the ATen op and the module path."""


class BackendError(KaunError, ValueError):
    """A compiler backend (IREE beside XLA) that cannot take the program or is not there: an
    unknown backend name, a device the runtime does not find, the extra not installed, or an op or
    feature the backend does not support (the message names the op or feature and the backend)."""
