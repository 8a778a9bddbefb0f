"""The live view of a shared store: every machine's campaigns side by side, from the rows the campaigns publish
(``rtvirt_campaigns``: each campaign's progress, rewritten whenever its state is) and the runs delivered as they
end (``rtvirt_runs``), with this machine's own running runs followed in detail from its spool.

The page's questions are asked of PostgreSQL, where the rows are, through one connection the serving process
keeps open (read-only transactions): the latest campaigns per machine (a window over ``rtvirt_campaigns``), the
shown runs' statistics by primary key, one configuration's history through the catalog's (configuration,
machine, created) index. Nothing copies the catalog anywhere.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

from ..results.verdicts import RequirementClass
from ..stores.postgres import CAMPAIGNS, TABLE, SharedStore
from ..stores.provenance import COLUMNS
from .local import SHOWN_FINISHED, STALE_UNFINISHED_S, LocalSource
from .metrics import CampaignMetrics, RunMetrics
from .results import result_of_row

__all__ = ["StoreSource", "CAMPAIGN_LIST", "RUN_RESULTS", "CONFIGURATIONS"]

# every unfinished campaign updated lately and each machine's SHOWN_FINISHED latest ones
CAMPAIGN_LIST = (f"SELECT document::text, extract(epoch FROM now() - updated) FROM (SELECT document, updated, "
                 f"finished, machine, row_number() OVER (PARTITION BY machine ORDER BY updated DESC) AS recent "
                 f"FROM {CAMPAIGNS}) AS c WHERE recent <= %(finished)s OR (NOT finished AND updated > now() - "
                 f"make_interval(secs => %(stale_s)s)) ORDER BY machine, updated DESC")
RUN_RESULTS = f"SELECT {', '.join(COLUMNS)}, manifest->'explain' FROM {TABLE} WHERE run_id = ANY(%s)"
CONFIGURATIONS = (f"SELECT coalesce(config, name) AS configuration, count(*) FROM {TABLE} GROUP BY 1 ORDER BY 1 "
                  "LIMIT %s")
MAX_CONFIGURATIONS = 10_000
FULL_EVERY_S = 10.0


class StoreSource:
    """See the module's docstring."""

    def __init__(self, store: SharedStore, machine: str, threshold_ns: int, classes: list[RequirementClass]) -> None:
        self.store = store
        self.label = store.label
        self.machine = machine
        self.classes = classes
        self.local = LocalSource(store.write_dir, machine, threshold_ns, classes)
        self._published: list[dict[str, Any]] = []
        self._has_campaigns = False
        self._signature: tuple[Any, ...] | None = None
        self._queried = 0.0
        self.errors: list[str] = []

    def refresh(self) -> None:
        """This machine's spool every time; the store's campaigns when one was published since the last look (a
        run's delivery is followed by its campaign's next publication), and every FULL_EVERY_S regardless."""
        self.local.refresh()
        if not self._has_campaigns:  # a store no campaign has published into yet
            found = self.store.fetch("SELECT to_regclass(%s)", (CAMPAIGNS,))
            self._has_campaigns = bool(found and found[0][0])
            if not self._has_campaigns:
                return
        signature = self.store.fetch(f"SELECT max(updated), count(*) FROM {CAMPAIGNS}")[0]
        if signature != self._signature or time.monotonic() - self._queried > FULL_EVERY_S:
            self._published = self.published_campaigns()
            self._signature, self._queried = signature, time.monotonic()

    def published_campaigns(self) -> list[dict[str, Any]]:
        """Each machine's latest campaigns from the store, with their finished runs' results (the full query)."""
        records = []
        for document, age_s in self.store.fetch(CAMPAIGN_LIST, {"finished": SHOWN_FINISHED,
                                                                "stale_s": STALE_UNFINISHED_S}):
            record = json.loads(document)
            record["idle_s"] = None if record.get("finished") else float(int(age_s))
            records.append(record)
        run_ids = [run["run_id"] for record in records for run in record.get("runs") or []
                   if run.get("run_id") and run.get("status") not in ("running", "planned")]
        results = {}
        for row in self.store.fetch(RUN_RESULTS, (run_ids,)) if run_ids else []:
            values = dict(zip(COLUMNS, row[:-1], strict=True))
            results[values["run_id"]] = result_of_row(values, row[-1], self.classes)
        for record in records:
            for run in record.get("runs") or []:
                if run.get("run_id") in results:
                    run["result"] = results[run["run_id"]]
        return records

    def snapshot(self) -> dict[str, Any]:
        local = {record["campaign_id"]: record for record in self.local.campaigns()}
        machines: dict[str, list[dict[str, Any]]] = {}
        for record in self._published:
            shown = local.pop(record["campaign_id"], None)
            if shown is None:
                shown = record
            else:  # this machine's own campaign: in detail from its spool, with the runs delivered from it since
                delivered = {run["key"]: run.get("result") for run in record.get("runs") or []}
                for run in shown["runs"]:
                    if "result" not in run and delivered.get(run["key"]) is not None:
                        run["result"] = delivered[run["key"]]
            machines.setdefault(str(record.get("machine")), []).append(shown)
        for record in local.values():  # running here but not (yet) published: the store was away
            machines.setdefault(self.machine, []).insert(0, record)
        return {"source": self.label, "generated": dt.datetime.now(dt.UTC).isoformat(),
                "machines": [{"machine": name, "campaigns": campaigns} for name, campaigns in sorted(machines.items())],
                "errors": (self.errors + self.local.errors)[:20]}

    def metrics(self) -> tuple[list[RunMetrics], list[CampaignMetrics]]:
        """This machine's campaigns (from its spool): every machine serves its own to Prometheus."""
        return self.local.metrics()

    def configurations(self) -> list[tuple[str, int]]:
        return [(str(name), int(count)) for name, count in self.store.fetch(CONFIGURATIONS, (MAX_CONFIGURATIONS,))]

    def close(self) -> None:
        self.local.close()
        self.store.close()
