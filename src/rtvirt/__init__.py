"""rtvirt: measure, explain and predict real-time behaviour of virtualised platforms."""

from __future__ import annotations

from importlib import import_module
from typing import Any

# pyproject.toml's version, kept here too so that `rtvirt --version` need not load importlib.metadata (50 ms);
# tests/test_cli_output.py checks that both agree
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "EXIT_VERDICT",
    "InputError", "PrivilegeError", "RtvirtError", "RunError",
    "PROBES", "get_probe", "run_probe",
    "Summary", "summarize", "summarize_stream",
    "SampleStream", "read_stream",
]

# name -> module that defines it: imported on first use, so that `rtvirt --help` does not pay for numpy & co.
_PUBLIC = {
    **dict.fromkeys(("EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "EXIT_VERDICT", "InputError", "PrivilegeError",
                     "RtvirtError", "RunError"), ".errors"),
    "PROBES": ".probes", "get_probe": ".probes", "run_probe": ".probes.runner",
    "Summary": ".stats", "summarize": ".stats", "summarize_stream": ".stats",
    "SampleStream": ".stream", "read_stream": ".stream",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'rtvirt' has no attribute {name!r}")
    return getattr(import_module(_PUBLIC[name], __name__), name)
