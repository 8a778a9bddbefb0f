"""Stressors: one module per stressor, registered in registry.py; started, followed and stopped by runner.py."""

from __future__ import annotations

from .base import StressorSpec, StressParams, StressSummary
from .registry import STRESSORS, get_stressor
from .runner import ENGINES, RunningStressor, StressProgress, follow_stressor, run_stressor, start_stressor

__all__ = ["STRESSORS", "ENGINES", "StressorSpec", "StressParams", "StressSummary", "StressProgress",
           "RunningStressor", "follow_stressor", "get_stressor", "start_stressor", "run_stressor"]
