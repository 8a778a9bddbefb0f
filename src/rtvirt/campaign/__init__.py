"""Campaigns: a scenario expanded into runs, executed unattended, resumable (docs/scenarios.md)."""

from __future__ import annotations

from .engine import CampaignResult, execute_run, run_campaign
from .state import CampaignState, find_resumable

__all__ = ["CampaignResult", "CampaignState", "execute_run", "find_resumable", "run_campaign"]
