"""``torch.export`` of a user's module, with its failures told in the user's terms: the module,
the construct that stopped the export (data-dependent Python control flow, example inputs that
do not fit the module, ...) and the line of the module's source, as a :class:`TorchImportError`
instead of torch's own exception from deep inside its tracer.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import traceback

from kaun_ir.errors import TorchImportError
from kaun_ir.runtime.interop.torch_program import quiet_torch_warnings

__all__ = ["export"]

# torch's loggers print a whole traceback (an op whose shapes do not fit) or the traced graph (a
# data-dependent guard) before raising the exception we translate; the exception says it once
_NOISY_LOGGERS = ("torch._subclasses.fake_tensor", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def _quiet_loggers():
    saved = [(logging.getLogger(name), logging.getLogger(name).level) for name in _NOISY_LOGGERS]
    for logger, _ in saved:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in saved:
            logger.setLevel(level)


def _our_directories() -> tuple[str, ...]:
    """The folders of kaun_ir's own packages (the namespace and the runtime it maps)."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # the runtime package
    package = sys.modules.get("kaun_ir")
    top = os.path.dirname(os.path.realpath(package.__file__)) if package and package.__file__ else here
    return (here + os.sep, top + os.sep)


def _user_line(err: BaseException, torch_dir: str) -> str:
    """``file:line: source`` of the innermost frame of ``err``'s traceback outside torch and
    kaun_ir (the module's own code, run by the non-strict export as ordinary Python)."""
    skip = (torch_dir, *_our_directories())
    frames = [
        f
        for f in traceback.extract_tb(err.__traceback__)
        if not os.path.realpath(f.filename).startswith(skip) and "<frozen" not in f.filename
    ]
    if not frames:
        return ""
    frame = frames[-1]
    text = f"{os.path.basename(frame.filename)}:{frame.lineno}"
    return f"{text}: {frame.line.strip()}" if frame.line else text


def _construct(err: BaseException) -> str:
    """What in the module the failure is about, in a user's words."""
    kind = type(err).__name__
    text = str(err)
    if "DataDependent" in kind or "data-dependent" in text:
        return (
            "data-dependent Python control flow (an `if`, `while` or `int()` on a tensor's value); "
            "make it depend on shapes only, or write it with torch.where"
        )
    if isinstance(err, RuntimeError | ValueError | IndexError) and ("shape" in text or "dim" in text):
        return "the example inputs do not fit the module (check their shapes)"
    return "torch.export could not trace the module"


def export(torch, module, example: tuple):
    """``torch.export.export(module, example)``, or a :class:`TorchImportError` naming the
    module class, the construct and the module's line."""
    # torch prints the partial graph of a failed export on stderr; on success, what the module's
    # own forward printed is passed on
    out, err_text = io.StringIO(), io.StringIO()
    try:
        with (
            quiet_torch_warnings(),
            _quiet_loggers(),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err_text),
        ):
            program = torch.export.export(module, example)
        sys.stdout.write(out.getvalue())
        sys.stderr.write(err_text.getvalue())
        return program
    except Exception as err:  # noqa: BLE001 - every failure of the export is translated
        torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
        line = _user_line(err, torch_dir)
        shapes = ", ".join(str(list(getattr(a, "shape", ()))) for a in example)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TorchImportError(
            f"torch_function: cannot export {type(module).__name__} at example input shapes [{shapes}]"
            f"{' (' + line + ')' if line else ''}: {_construct(err)} [torch: {type(err).__name__}: {first}]"
        ) from err
