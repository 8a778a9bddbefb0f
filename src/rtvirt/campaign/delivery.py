"""Did every sample arrive, and were there as many as the run promised? (docs/sample-stream.md, "Delivery")

Two checks on a finished run's stream, both recorded in its manifest:
- **delivery**: the agent's END record counts the data records it wrote; the host counts what it holds. A
  difference is a loss between them (a channel that dropped or garbled bytes) and fails the run, naming the
  side that lost them and what the guest said of the end-of-stream handshake.
- **expectation**: a periodic probe promises about one sample a period for its duration. A run below
  ``SHORT_FRACTION`` of that is not silently complete: it is ``short`` (its manifest's status and campaign outcome,
  the campaign's table), and its manifest says how many were expected and why fewer came. Periods the probe
  counted as overran were measured (the platform made its thread miss them: a result); a short run whose
  missing samples they do not account for (``unaccounted``: lost, started late, stopped early) also makes
  ``rtvirt run`` exit 1.
"""

from __future__ import annotations

from typing import Any

from ..stream import SampleStream

__all__ = ["delivery_record", "delivery_problem", "expectation_record", "SHORT_FRACTION"]

SHORT_FRACTION = 0.9  # fewer samples than this share of the promised count: a short run, with the reason
LATE_FRACTION = 0.1  # a first sample later than this share of the duration: the probe started late


def delivery_record(stream: SampleStream, confirmation: str | None, platform: dict[str, Any]) -> dict[str, Any]:
    """What the manifest says of the stream's way from agent to host."""
    return {"agent_records": stream.written, "host_records": int(stream.records.size),
            "confirmation": confirmation or "not offered", "corrupt": stream.corrupt, **platform}


def delivery_problem(delivery: dict[str, Any]) -> str | None:
    """Why the host holds fewer records than the agent wrote, or None when it holds every one."""
    wrote, held = delivery.get("agent_records"), delivery["host_records"]
    corrupt = delivery.get("corrupt") or delivery.get("channel_corrupt")  # the stream's or its channel's word
    if corrupt:
        return f"the stream arrived corrupt: {corrupt}"
    if wrote is None or wrote == held:
        return None  # no END (a cut-short run is partial, said elsewhere), or every record arrived
    side = "between the agent and the host"
    said = delivery.get("guest_said")
    if said == "confirmed":  # the agent heard the host confirm every record: the loss is on the host's side
        side = "on the host after the agent's records were confirmed"
    elif said in ("short", "unconfirmed"):
        side = f"on the way from the guest (its agent said: {said})"
    around = " | ".join(delivery.get("console_around") or [])
    return (f"lost {wrote - held} of {wrote} samples {side} (channel: {delivery.get('channel', 'stream')})"
            + (f"; the guest's console around its word: {around}" if around else ""))


def expectation_record(stream: SampleStream, expected: int | None, duration_ns: int) -> dict[str, Any] | None:
    """How many samples the run promised and, when it took fewer than SHORT_FRACTION of them, that it is short
    and why; None when nothing was promised."""
    if not expected:
        return None
    taken = int(stream.records.size)
    overruns = stream.missed_periods or 0
    record: dict[str, Any] = {"expected": expected, "taken": taken, "overruns": overruns,
                              "ratio": round(taken / expected, 4), "short": taken < SHORT_FRACTION * expected}
    if record["short"]:
        # periods the probe counted as overran are measured (the platform made it miss them); the rest went
        # unmeasured: the campaign did not measure what it was asked to (rtvirt run exits 1)
        record["unaccounted"] = taken + overruns < SHORT_FRACTION * expected
        record["why"] = _why_short(stream, expected, duration_ns, overruns)
    return record


def _why_short(stream: SampleStream, expected: int, duration_ns: int, overruns: int) -> str:
    start = stream.header.get("start_monotonic_ns")
    times = stream.records["t_ns"]
    if not stream.records.size or not isinstance(start, int):
        return "the probe took no sample in its time"
    first_s = (int(times.min()) - start) / 1e9
    span_s = (int(times.max()) - int(times.min())) / 1e9
    if overruns and stream.records.size + overruns >= SHORT_FRACTION * expected:  # its periods are accounted for
        return _overran(overruns)
    if duration_ns and first_s > LATE_FRACTION * duration_ns / 1e9:
        return (f"the probe started late: its first sample came {first_s:.2f} s into its {duration_ns / 1e9:.2f} s "
                "(its threads were not scheduled: a starved vCPU, or a guest still booting under load)")
    if duration_ns and span_s < (1 - LATE_FRACTION) * duration_ns / 1e9 - first_s:
        return (f"the probe's samples span {span_s:.2f} s of its {duration_ns / 1e9:.2f} s: it was stopped "
                "early or starved for the rest")
    return _overran(overruns)


def _overran(overruns: int) -> str:
    return (f"the probe ran its whole time but {overruns} periods passed while its measuring thread was late or "
            "waited to run (counted as overruns, not as samples: a starved vCPU, or a loaded host)")
