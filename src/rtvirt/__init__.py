"""rtvirt: measure, explain and predict real-time behaviour of virtualised platforms."""

from __future__ import annotations

from .errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, EXIT_VERDICT, InputError, PrivilegeError, RtvirtError, RunError
from .probes import PROBES, get_probe
from .probes.runner import run_probe
from .stats import Summary, summarize, summarize_stream
from .stream import SampleStream, read_stream

__all__ = [
    "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "EXIT_VERDICT",
    "InputError", "PrivilegeError", "RtvirtError", "RunError",
    "PROBES", "get_probe", "run_probe",
    "Summary", "summarize", "summarize_stream",
    "SampleStream", "read_stream",
]
