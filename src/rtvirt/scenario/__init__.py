"""Scenario files: what to test, what disturbs it, and when (docs/scenarios.md)."""

from __future__ import annotations

from .loader import builtin_scenarios, load_scenario, parse_scenario
from .schema import Scenario

__all__ = ["Scenario", "load_scenario", "parse_scenario", "builtin_scenarios"]
