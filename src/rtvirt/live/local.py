"""The live view of a results directory (or of this machine's spool of a shared store): its campaigns as their
state files say, the running run of each as its stream grows, each finished run as its manifest says.

Nothing here writes or talks to a campaign: :meth:`LocalSource.refresh` (once a second, in the server's worker
thread) stats the state files and re-reads only those that changed, polls the followers of the running runs
(rtvirt.live.follow) and reads each finished run's manifest once. What is kept is bounded: the campaigns shown
(every unfinished one and the ``SHOWN_FINISHED`` latest finished ones), at most ``MAX_FOLLOWERS`` followers,
and the manifests of the shown campaigns' runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InputError
from ..results.verdicts import RequirementClass
from .follow import RunFollower
from .metrics import LINGER_S, CampaignMetrics, RunMetrics, followed_metrics, stored_metrics
from .progress import campaign_record
from .results import result_of_manifest

if TYPE_CHECKING:
    from ..stores import RunStore

__all__ = ["LocalSource", "SHOWN_FINISHED", "MAX_FOLLOWERS"]

SHOWN_FINISHED = 5
MAX_FOLLOWERS = 8
STALE_UNFINISHED_S = 2 * 86_400.0  # an unfinished campaign untouched this long was killed: no longer shown


@dataclass
class _State:
    path: Path
    mtime_ns: int
    finished: bool
    document: dict[str, Any] | None  # kept for the campaigns shown only (a results directory may hold thousands)


@dataclass(frozen=True)
class _Shown:
    mtime_ns: int
    document: dict[str, Any]


class LocalSource:
    """See the module's docstring. ``machine`` labels this directory's campaigns (the page and /metrics)."""

    def __init__(self, results: Path, machine: str, threshold_ns: int, classes: list[RequirementClass]) -> None:
        self.results = Path(results)
        self.label = str(results)
        self.machine = machine
        self.threshold_ns = threshold_ns
        self.classes = classes
        self._states: dict[Path, _State] = {}
        self._manifests: dict[str, dict[str, Any]] = {}
        self._stored: dict[str, RunMetrics] = {}  # finished runs' metrics, by run id
        self._followers: dict[str, RunFollower] = {}
        self._shown: list[_Shown] = []
        self.errors: list[str] = []

    # -- reading ---------------------------------------------------------------------------------------------
    def _read_states(self) -> None:
        """Re-read the state files that changed since the last refresh (atomic rewrites: whole or old); keep the
        documents of the campaigns shown."""
        seen: dict[Path, _State] = {}
        for path in (self.results / "campaigns").glob("*/state.json"):
            try:
                mtime = path.stat().st_mtime_ns
                known = self._states.get(path)
                if known is None or known.mtime_ns != mtime:
                    document = self._parse(path)
                    known = _State(path, mtime, bool(document.get("finished")), document)
            except (OSError, ValueError) as exc:
                self.errors.append(f"{path}: unreadable ({str(exc)[:200]})")
                continue
            seen[path] = known
        self._states = seen
        now = time.time_ns()
        latest = sorted(seen.values(), key=lambda s: s.mtime_ns, reverse=True)
        unfinished = [s for s in latest if not s.finished and now - s.mtime_ns < STALE_UNFINISHED_S * 1e9]
        finished = [s for s in latest if s.finished][:SHOWN_FINISHED]
        shown = sorted(unfinished + finished, key=lambda s: s.mtime_ns, reverse=True)
        for state in latest:
            if state not in shown:
                state.document = None
            elif state.document is None:  # shown again (a newer one was removed): read once more
                try:
                    state.document = self._parse(state.path)
                except (OSError, ValueError) as exc:
                    self.errors.append(f"{state.path}: unreadable ({str(exc)[:200]})")
        self._shown = [_Shown(state.mtime_ns, state.document) for state in shown if state.document is not None]

    @staticmethod
    def _parse(path: Path) -> dict[str, Any]:
        document = json.loads(path.read_text())
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        return document

    def _manifest(self, run_id: str) -> dict[str, Any] | None:
        if run_id not in self._manifests:
            path = self.results / "runs" / run_id / "manifest.json"
            try:
                document = json.loads(path.read_text())
            except FileNotFoundError:
                return None
            except (OSError, ValueError) as exc:
                self.errors.append(f"{path}: unreadable ({str(exc)[:200]})")
                return None
            if isinstance(document, dict):
                self._manifests[run_id] = document
        return self._manifests.get(run_id)

    def _running(self) -> dict[str, str]:
        """run id -> key of every run the shown unfinished campaigns say is running."""
        return {str(entry["run_id"]): key for state in self._shown if not state.document.get("finished")
                for key, entry in (state.document.get("runs") or {}).items()
                if isinstance(entry, dict) and entry.get("status") == "running" and entry.get("run_id")}

    def refresh(self) -> None:
        """Catch up with what the campaigns wrote since the last call."""
        self.errors = []
        self._read_states()
        running = self._running()
        for run_id in [r for r in self._followers if r not in running]:
            self._followers.pop(run_id).close()
        for run_id in list(running)[:MAX_FOLLOWERS]:
            follower = self._followers.get(run_id)
            if follower is None:
                follower = self._followers[run_id] = RunFollower(self.results / "runs" / run_id / "samples.rtvs",
                                                                 self.threshold_ns)
            follower.poll()
        wanted = {str(entry.get("run_id")) for state in self._shown
                  for entry in (state.document.get("runs") or {}).values() if isinstance(entry, dict)}
        self._manifests = {k: v for k, v in self._manifests.items() if k in wanted}
        self._stored = {k: v for k, v in self._stored.items() if k in wanted}

    # -- what the page shows ---------------------------------------------------------------------------------
    def campaigns(self) -> list[dict[str, Any]]:
        """The shown campaigns, newest first, each with its progress, finished runs' results and the running
        run's live view."""
        shown = []
        for state in self._shown:
            try:
                record = campaign_record(state.document, self.machine)
            except ValueError as exc:
                self.errors.append(f"campaign {str(state.document.get('campaign_id'))[:100]}: {exc}"[:300])
                continue
            record["idle_s"] = None if record["finished"] else self._idle_s(state, record)
            for run in record["runs"]:
                self._add_run_detail(run)
            shown.append(record)
        return shown

    def _add_run_detail(self, run: dict[str, Any]) -> None:
        run_id = run.get("run_id")
        if not run_id:
            return
        follower = self._followers.get(str(run_id))
        if follower is not None:
            run["live"] = follower.page_view()
        if run["status"] not in ("running", "planned"):
            manifest = self._manifest(str(run_id))
            if manifest is not None:
                run["result"] = result_of_manifest(manifest, self.classes)

    def _idle_s(self, state: _Shown, record: dict[str, Any]) -> float:
        """Seconds since the campaign last wrote its state or its running run's stream."""
        latest = state.mtime_ns
        running = next((r for r in record["runs"] if r["key"] == record["running"]), None)
        if running and running.get("run_id"):
            with contextlib.suppress(OSError):  # not written yet
                latest = max(latest, (self.results / "runs" / str(running["run_id"]) / "samples.rtvs")
                             .stat().st_mtime_ns)
        return float(max(0, (time.time_ns() - latest) // 10**9))

    def snapshot(self) -> dict[str, Any]:
        return {"source": self.label, "generated": dt.datetime.now(dt.UTC).isoformat(),
                "machines": [{"machine": self.machine, "campaigns": self.campaigns()}], "errors": self.errors[:20]}

    # -- /metrics --------------------------------------------------------------------------------------------
    def metrics(self) -> tuple[list[RunMetrics], list[CampaignMetrics]]:
        """The latest run of each configuration of the campaigns that run or ended less than LINGER_S ago."""
        runs: dict[tuple[str, str, str], RunMetrics] = {}
        campaigns = []
        for state in reversed(self._shown):  # oldest first: a newer campaign's run of a configuration wins
            if state.document.get("finished") and time.time_ns() - state.mtime_ns > LINGER_S * 1e9:
                continue
            try:
                record = campaign_record(state.document, self.machine)
            except ValueError:
                continue
            campaigns.append(CampaignMetrics((self.machine, record["campaign_id"], record["scenario"]),
                                             record["runs_done"], record["runs_failed"], int(bool(record["running"])),
                                             record["runs_left"], record["seconds_left"]))
            for run in record["runs"]:
                found = self._run_metrics(run)
                if found is not None:
                    runs[found.labels] = found
        return list(runs.values()), campaigns

    def _run_metrics(self, run: dict[str, Any]) -> RunMetrics | None:
        run_id = run.get("run_id")
        if not run_id:
            return None
        labels = (self.machine, str(run["environment"]), str(run["config"]))
        follower = self._followers.get(str(run_id))
        if follower is not None:
            return followed_metrics(labels, follower, run["duration_s"])
        if run_id in self._stored:
            return self._stored[str(run_id)]
        manifest = self._manifest(str(run_id))
        if manifest is None:
            return None
        self._stored[str(run_id)] = stored_metrics(labels, manifest, self._histogram(str(run_id)),
                                                   self.threshold_ns, run["duration_s"])
        return self._stored[str(run_id)]

    def _histogram(self, run_id: str) -> Any:
        from ..store import load_run

        try:
            return load_run(self.results / "runs" / run_id).histogram()
        except InputError as exc:
            self.errors.append(str(exc)[:300])
            return None

    # -- history ---------------------------------------------------------------------------------------------
    @property
    def store(self) -> RunStore:
        """This directory as a results store (history questions: rtvirt.results.history)."""
        from ..stores import LocalStore

        return LocalStore(self.results)

    def configurations(self) -> list[tuple[str, int]]:
        """Every configuration of this directory's runs and how many runs it has."""
        from collections import Counter

        from ..stores.provenance import configuration

        if not (self.results / "runs").is_dir():
            return []
        return sorted(Counter(configuration(row) for row in self.store.rows()).items())

    def close(self) -> None:
        for follower in self._followers.values():
            follower.close()
        self._followers.clear()
