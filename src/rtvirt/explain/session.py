"""Tracing beside one run, from arming the sources to the explanation stored with the samples.

A campaign run and ``rtvirt probe --explain`` both: ``start(samples)`` before the agent, ``stop()`` as soon as it
ended and again in every exit path (idempotent), then ``explain_into(run_dir, stream, agent_pids)``. A
source that fails is recorded as a layer that could not be seen; nothing here ever raises into the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .attribute import attribute, choose_threshold, headline, outlier_windows
from .config import ExplainConfig
from .model import CollectContext, Explanation, LayerTrace, TraceSource
from .outer import cpu_steal_ns, outer_hypervisor_note, read_local
from .stored import write_explanation

__all__ = ["ExplainSession", "explain_stream", "TIME_FIELDS"]

# value fields whose [t_ns, t_ns + value] is a window the measured thread was held back in
TIME_FIELDS = ("latency_ns", "duration_ns")
MAX_REASON = 300


def _reason(exc: BaseException) -> str:
    text = " ".join(f"{type(exc).__name__}: {exc}".split())
    return text[:MAX_REASON]


def explain_stream(stream: Any, traces_for: Any, config: ExplainConfig) -> Explanation:
    """The explanation of ``stream``'s outliers; ``traces_for(windows)`` gives the layers' traces for them."""
    records = stream.records
    values = records["value"].astype(np.int64)
    threshold, rule = choose_threshold(values, threshold_ns=config.threshold, floor_ns=config.floor,
                                       quantile=config.quantile)
    windows, outliers = outlier_windows(records["t_ns"], values, records["cpu"], threshold, config.top)
    return attribute(windows, traces_for(windows), threshold_ns=threshold, threshold_rule=rule, outliers=outliers)


class ExplainSession:
    """The sources of one run; ``unseen`` are layers known not to be traceable here (with why)."""

    def __init__(self, config: ExplainConfig, sources: Sequence[TraceSource],
                 unseen: Sequence[LayerTrace] = (), read_system: Callable[[str], str] = read_local) -> None:
        self.config = config
        self.read_system = read_system  # the measured machine's /proc (a target's through its connection)
        self.sources = list(sources)
        self.failed: dict[int, LayerTrace] = {}  # index of a source that failed -> what the run says of it
        self.unseen = list(unseen)
        # the measured CPUs (the host's, a guest's pCPUs) whose steal the run reads; Xen's own guest (dom0)
        # shows a hypervisor and steal that are the traced layer's, not an outer one's
        self.cpus = tuple(sorted({cpu for source in self.sources for cpu in
                                  (getattr(source, "cpus", None) or getattr(source, "host_cpus", None) or ())}))
        self.traced_hypervisor = "xen" if any(source.layer == "xen" for source in self.sources) else None
        self._steal: list[dict[int, int] | None] = []
        self._running = False

    def _fail(self, index: int, what: str, exc: BaseException) -> None:
        self.failed.setdefault(index, LayerTrace(self.sources[index].layer, seen=False,
                                                 why_not=f"{what} failed: {_reason(exc)}"))

    def start(self, samples: Path | None = None) -> None:
        """Arm every source; ``samples``: the file the run's samples will be written to while it goes (a
        source with a flight recorder follows it to keep the trace around what can become an outlier)."""
        self._steal = [self._read_steal()]
        self._running = True
        for index, source in enumerate(self.sources):
            try:
                follow = getattr(source, "follow", None)
                if samples is not None and follow is not None:
                    follow(samples)
                source.start()
            except Exception as exc:  # noqa: BLE001 - a tracer never fails the measurement
                self._fail(index, "start", exc)

    def stop(self) -> None:
        """Stop every source (each is tried, also after another failed); safe to call again."""
        if not self._running:
            return
        self._running = False
        self._steal.append(self._read_steal())
        for index, source in enumerate(self.sources):
            try:
                source.stop()
            except Exception as exc:  # noqa: BLE001
                self._fail(index, "stop", exc)

    def _read_steal(self) -> dict[int, int] | None:
        """The measured CPUs' steal so far (None: not readable, or not an outer hypervisor's)."""
        if self.traced_hypervisor is not None or not self.cpus:
            return None
        try:
            return cpu_steal_ns(self.read_system("/proc/stat"), self.cpus)
        except Exception:  # noqa: BLE001 - a target's file may fail to come: the note then says less
            return None

    def _traces(self, windows: np.ndarray, header: dict[str, Any], agent_pids: tuple[int, ...]) -> list[LayerTrace]:
        context = CollectContext(header=header, windows=windows, agent_pids=agent_pids)
        traces = list(self.unseen)
        for index, source in enumerate(self.sources):
            if index in self.failed:
                traces.append(self.failed[index])
                continue
            try:
                traces.append(source.collect(context))
            except Exception as exc:  # noqa: BLE001
                traces.append(LayerTrace(source.layer, seen=False, why_not=f"collect failed: {_reason(exc)}"))
        before, after = (self._steal + [None, None])[:2]
        found = outer_hypervisor_note(before, after, self.read_system, self.traced_hypervisor)
        if found:
            if not traces:
                traces.append(LayerTrace("host", seen=False, why_not="this environment offers no trace source"))
            traces[0].notes.append(found[0])
        return traces

    def explain(self, stream: Any, agent_pids: Sequence[int] = ()) -> Explanation:
        self.stop()
        if stream.value_field not in TIME_FIELDS:
            raise ValueError(f"probe {stream.probe}: its values ({stream.value_field}) are not a time window "
                             "a cause could fill")
        return explain_stream(stream, lambda windows: self._traces(windows, stream.header, tuple(agent_pids)),
                              self.config)

    def explain_into(self, run_dir: Path, stream: Any, agent_pids: Sequence[int] = ()) -> dict[str, Any]:
        """Explain ``stream`` and store it in ``run_dir``; returns the manifest's ``explain`` entry (with
        ``error`` when it could not be explained, and ``interrupted`` when Ctrl-C came meanwhile: the run
        itself is never lost for its explanation; the caller writes its manifest, then stops)."""
        try:
            explanation = self.explain(stream, agent_pids)
            write_explanation(run_dir, explanation)
        except KeyboardInterrupt:
            with contextlib.suppress(Exception):
                self.stop()
            return {"error": "interrupted (Ctrl-C or SIGTERM) while explaining", "interrupted": True}
        except Exception as exc:  # noqa: BLE001 - the samples matter more than their explanation
            with contextlib.suppress(Exception):
                self.stop()
            return {"error": _reason(exc)}
        return manifest_entry(explanation)


def manifest_entry(explanation: Explanation) -> dict[str, Any]:
    """The short summary a run's manifest carries (the rest is in explain.json/explain.parquet)."""
    return {
        "threshold_ns": explanation.threshold_ns, "threshold_rule": explanation.threshold_rule,
        "outliers": explanation.outliers,
        "explained": len({part.rank for part in explanation.parts}),
        "headline": headline(explanation.parts),
        "top_causes": [{key: row[key] for key in ("layer", "cause", "share")} for row in explanation.summary[:3]],
        "layers": {layer.layer: ("seen" if layer.seen else f"not seen: {layer.why_not}") for layer in
                   explanation.layers},
        "dropped_events": sum(layer.dropped_events for layer in explanation.layers),
    }
