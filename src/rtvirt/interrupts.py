"""Ctrl-C for work that runs in threads other than the main one (a lab's campaign per target).

Python delivers SIGINT to the main thread only; the main thread raises KeyboardInterrupt in each worker thread
(``PyThreadState_SetAsyncExc``). Such an exception can land where Python ignores exceptions (an at-fork handler
of the logging module, while the thread starts a subprocess: "Exception ignored in: _releaseLock"), and then the
thread never hears it and runs its campaign to the end. So it is raised again until the thread says it handled
it (:func:`acknowledge`, called by every handler that stops a run) or ended; never again after that, so that
the handler's own clean-up (agents stopped, samples stored) is not interrupted.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["acknowledge", "interruptible", "interrupt_threads"]

REDELIVER_S = 2.0  # time a handler has to acknowledge before the interrupt is raised again

_current = threading.local()


def acknowledge() -> None:
    """This thread handled its KeyboardInterrupt: its interrupter stops raising it (no-op outside
    :func:`interruptible`)."""
    handled = getattr(_current, "handled", None)
    if handled is not None:
        handled.set()


@contextmanager
def interruptible(handled: threading.Event) -> Iterator[None]:
    """Run the block in this thread with ``handled`` as where :func:`acknowledge` reports."""
    _current.handled = handled
    try:
        yield
    finally:
        _current.handled = None


def interrupt_threads(workers: Sequence[tuple[threading.Thread, threading.Event]]) -> None:
    """Raise KeyboardInterrupt in each worker thread until it acknowledged it or ended; then wait for all."""
    pending = list(workers)
    while pending:
        for thread, _ in pending:
            if thread.ident is not None:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident),
                                                           ctypes.py_object(KeyboardInterrupt))
        deadline = time.monotonic() + REDELIVER_S
        while pending and time.monotonic() < deadline:
            time.sleep(0.05)
            pending = [(t, handled) for t, handled in pending if t.is_alive() and not handled.is_set()]
    for thread, _ in workers:
        thread.join()
