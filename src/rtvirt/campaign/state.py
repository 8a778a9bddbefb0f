"""The campaign state file: which runs are finished, so that --resume redoes none of them.

RESULTS/campaigns/<campaign_id>/state.json, rewritten atomically (temporary file + rename) after every
run: a campaign killed at any instant leaves either the old or the new state, never half of one.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError, RunError
from ..fileio import write_atomically

__all__ = ["CampaignState", "FINISHED", "find_resumable"]

FINISHED = ("complete", "short", "failed", "skipped")  # short: ran to its end, far fewer samples than promised


@dataclass
class CampaignState:
    path: Path
    campaign_id: str
    scenario: str
    scenario_text: str
    source: str
    scale: float
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    finished: bool = False
    repetitions: int | None = None  # `rtvirt run --repetitions`: instead of the scenario's (None: the scenario's)
    # told every document written (a shared store publishes it for the live view); never raises
    on_save: Callable[[dict[str, Any]], None] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def create(cls, results: Path, scenario: str, text: str, source: str, scale: float) -> CampaignState:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
        campaign_id = f"{scenario}-{stamp}"
        directory = Path(results) / "campaigns" / campaign_id
        try:
            directory.mkdir(parents=True)
        except OSError as exc:
            raise InputError(f"option --out {results}: cannot create a campaign there ({exc.strerror})") from None
        state = cls(directory / "state.json", campaign_id, scenario, text, source, scale)
        state.save()
        return state

    @classmethod
    def load(cls, path: Path) -> CampaignState:
        try:
            document = json.loads(path.read_text())
            return cls(path, str(document["campaign_id"]), str(document["scenario"]), str(document["scenario_text"]),
                       str(document["source"]), float(document["scale"]), dict(document["runs"]),
                       bool(document["finished"]), document.get("repetitions"))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InputError(f"{path}: unreadable campaign state ({exc})") from None

    def save(self) -> None:
        document = {"campaign_id": self.campaign_id, "scenario": self.scenario, "scenario_text": self.scenario_text,
                    "source": self.source, "scale": self.scale, "runs": self.runs, "finished": self.finished,
                    "repetitions": self.repetitions,
                    "updated": dt.datetime.now(dt.UTC).isoformat()}
        try:
            write_atomically(self.path, json.dumps(document, indent=2))
        except OSError as exc:
            raise RunError(f"{self.path}: cannot write the campaign state ({exc.strerror})") from None
        if self.on_save is not None:
            self.on_save(document)

    def record(self, key: str, **entry: Any) -> None:
        self.runs[key] = {**self.runs.get(key, {}), **entry}
        self.save()

    def is_finished(self, key: str) -> bool:
        return self.runs.get(key, {}).get("status") in FINISHED


def find_resumable(results: Path, scenario: str | None) -> CampaignState:
    """The most recent unfinished campaign under ``results`` (of ``scenario``, when given)."""
    candidates = []
    for path in (Path(results) / "campaigns").glob("*/state.json"):
        state = CampaignState.load(path)
        if not state.finished and (scenario is None or state.scenario == scenario):
            candidates.append((path.stat().st_mtime, state))
    if not candidates:
        which = f" of scenario {scenario!r}" if scenario else ""
        raise InputError(f"option --resume: no unfinished campaign{which} under {results}")
    return max(candidates, key=lambda c: c[0])[1]
