"""The rtvirt exception tree; the CLI maps it to exit codes.

- ``RtvirtError``: base of everything rtvirt raises on purpose (exit 1).
  - ``InputError``: bad options, malformed files, impossible requests (exit 2). Its message names the
    option, field or file.
  - ``PrivilegeError``: the run needs a privilege it does not have, e.g. SCHED_FIFO (exit 2).
  - ``RunError``: a measurement, VM or simulation failed while running (exit 1).
- ``VerdictFailed`` is not an error: a run completed but missed its requirement (exit 3).
- ``Interrupted``: Ctrl-C or SIGTERM stopped the work; what was done is kept (exit 130, as a shell reports
  SIGINT).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pydantic's import would slow the CLI's start-up
    from pydantic import ValidationError

__all__ = [
    "EXIT_OK",
    "EXIT_FAILURE",
    "EXIT_USAGE",
    "EXIT_VERDICT",
    "EXIT_PARTIAL",
    "EXIT_INTERRUPTED",
    "RtvirtError",
    "InputError",
    "PrivilegeError",
    "RunError",
    "CommandTimeout",
    "VerdictFailed",
    "Interrupted",
    "first_validation_error",
    "stop_on_signals",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_VERDICT = 3
EXIT_PARTIAL = 4  # some of the work could not be done, the rest was (host tune/restore: an item failed)
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: 128 + SIGINT, as a shell reports it


class RtvirtError(Exception):
    exit_code = EXIT_FAILURE


class InputError(RtvirtError):
    exit_code = EXIT_USAGE


class PrivilegeError(RtvirtError):
    exit_code = EXIT_USAGE


class RunError(RtvirtError):
    exit_code = EXIT_FAILURE


class CommandTimeout(RunError):
    """A command on another machine (a dom0, a target) did not finish within its bound."""


class VerdictFailed(RtvirtError):
    exit_code = EXIT_VERDICT


class Interrupted(RtvirtError):
    """Ctrl-C or SIGTERM ended the work early; the message says what was kept."""

    exit_code = EXIT_INTERRUPTED


def first_validation_error(exc: ValidationError, top_level: str = "(top level)") -> tuple[str, str]:
    """The dotted field path and message of a pydantic error's first problem, for InputError texts."""
    error = exc.errors()[0]
    path = ".".join(str(part) for part in error["loc"]) or top_level
    return path, error["msg"].removeprefix("Value error, ")


def _stop_as_interrupt(signum: int, frame: object) -> None:
    """A SIGTERM handler: the process stops its work as on Ctrl-C (KeyboardInterrupt: samples kept)."""
    raise KeyboardInterrupt


REDELIVER_AFTER_S = 0.01


def stop_on_signals() -> None:
    """Ctrl-C and SIGTERM stop this process's work as KeyboardInterrupt, also when they land where Python ignores
    exceptions: in a weakref callback or ``__del__`` the garbage collector runs, the KeyboardInterrupt is printed as
    "Exception ignored" and lost, and the work goes on (a campaign interrupted at such a moment ran to its end and
    exited 0). Such a one is delivered again, as a SIGINT from a thread of its own a moment later: raised from
    the hook itself, the handler would run inside the hook, where exceptions are ignored too. Should it land in
    another such place, it comes back here and goes out again."""
    import contextlib
    import signal
    import sys
    import threading

    def redeliver(unraisable: sys.UnraisableHookArgs) -> None:
        if unraisable.exc_type is not None and issubclass(unraisable.exc_type, KeyboardInterrupt):
            timer = threading.Timer(REDELIVER_AFTER_S, signal.raise_signal, (signal.SIGINT,))
            timer.daemon = True
            with contextlib.suppress(RuntimeError):  # the interpreter is shutting down: the work ended anyway
                timer.start()
            return
        sys.__unraisablehook__(unraisable)

    signal.signal(signal.SIGTERM, _stop_as_interrupt)
    sys.unraisablehook = redeliver
