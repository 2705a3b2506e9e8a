"""The exceptions raised by kaun_ir."""


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
