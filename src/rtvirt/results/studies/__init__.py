"""The published studies rtvirt's built-in scenarios reproduce, and their tables (docs/studies.md).

This module stays light (the scenario schema imports it for the study names); the table builders and
the published reference values load only when a report is written.
"""

from __future__ import annotations

__all__ = ["STUDY_NAMES"]

# study name -> built-in scenario reproducing it (they share the name)
STUDY_NAMES = ("cots-hypervisor", "guest-isolation", "interrupt-latency", "rt-xen-servers")
