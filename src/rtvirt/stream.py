"""Reader for the agents' binary sample stream (format: docs/sample-stream.md).

The stream is ``magic, u32 version, u32 header length, header JSON, padding to 8 bytes`` followed by
32-byte records. Records with the META flag carry drop counts, end-of-run statistics, the END
marker and (where the header declares them) each sample's stolen time; a stream without END was cut
short (Ctrl-C of rtvirt itself, a crash, a killed VM) and is read as *partial*: every complete record
before the cut is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa

from .errors import InputError, RunError

__all__ = ["MAGIC", "MISSED_PERIOD_STATS", "RECORD", "STOLEN", "STOLEN_COLUMNS", "SampleStream", "StreamReader",
           "read_stream", "recover_from_copy", "merge_stream_copy"]

MAGIC = b"RTVIRT\x00S"
SUPPORTED_VERSIONS = (1,)
RECORD = np.dtype(
    [("t_ns", "<u8"), ("value", "<i8"), ("aux", "<u8"), ("cpu", "<u2"), ("thread", "<u2"), ("kind", "<u2"),
     ("flags", "<u2")]
)
FLAG_META = 1
META_DROPPED, META_END, META_STAT, META_STOLEN = 1, 2, 3, 4
# a sample's stolen time (after its sample, only when non-zero): (thread, t_ns) name the sample
STOLEN = np.dtype([("t_ns", "<i8"), ("thread", "<i2"), ("runnable_ns", "<i8"), ("offline_ns", "<i8")])
STOLEN_COLUMNS = ("stolen_runnable_ns", "stolen_offline_ns")
END_REASONS = {0: "complete", 1: "signal", 2: "error"}
# a probe's counts of periods it missed, measured as missed: the timer probe's and the wakeup sender's overruns
# (its thread late past whole periods), the wakeup probe's skipped periods (its receiver had not taken the last)
MISSED_PERIOD_STATS = ("overruns", "skipped")
MAX_HEADER = 1 << 20


@dataclass
class SampleStream:
    """One probe run: its header and every data record, with drops and end state."""

    header: dict[str, Any]
    records: np.ndarray
    dropped: dict[int, int] = field(default_factory=dict)
    stats: dict[tuple[int, str], int] = field(default_factory=dict)
    end_reason: str | None = None  # None: the stream has no END record (partial)
    written: int | None = None
    error: str | None = None  # the agent's message when it ended with an error (set by the probe runner)
    corrupt: str | None = None  # where and why reading stopped at a record no writer makes (prefix kept)
    stolen: np.ndarray = field(default_factory=lambda: np.empty(0, STOLEN))  # STOLEN records (header "stolen")

    @property
    def missed_periods(self) -> int | None:
        """Periods the probe counted as missed (MISSED_PERIOD_STATS); None when it counts none."""
        counted = [value for (_, name), value in self.stats.items() if name in MISSED_PERIOD_STATS]
        return int(sum(counted)) if counted else None

    @property
    def measures_stolen(self) -> bool:
        """The agent measured each sample's stolen time (header ``stolen``: its source, e.g. ``xen-runstate``)."""
        return bool(self.header.get("stolen"))

    def stolen_per_sample(self) -> tuple[np.ndarray, np.ndarray]:
        """(runnable ns, offline ns) stolen inside each data record's window, aligned with ``records`` (0 where the
        stream has no STOLEN record for it)."""
        runnable = np.zeros(self.records.size, np.int64)
        offline = np.zeros(self.records.size, np.int64)
        if self.stolen.size and self.records.size:
            keys = self.records["thread"].astype(np.int64) << 48 | self.records["t_ns"].astype(np.int64)
            order = np.argsort(keys, kind="stable")
            wanted = self.stolen["thread"].astype(np.int64) << 48 | self.stolen["t_ns"]
            at = np.minimum(np.searchsorted(keys[order], wanted), keys.size - 1)
            found = keys[order][at] == wanted
            runnable[order[at[found]]] = self.stolen["runnable_ns"][found]
            offline[order[at[found]]] = self.stolen["offline_ns"][found]
        return runnable, offline

    @property
    def probe(self) -> str:
        return str(self.header["probe"])

    @property
    def value_field(self) -> str:
        return str(self.header["value_field"])

    @property
    def complete(self) -> bool:
        return self.end_reason is not None

    @property
    def total_dropped(self) -> int:
        return sum(self.dropped.values())

    def kind_name(self, kind: int) -> str:
        kinds = self.header.get("kinds") or []
        return str(kinds[kind]) if kind < len(kinds) else f"kind{kind}"

    def to_table(self) -> pa.Table:
        """The samples as Arrow columns: t_ns, <value_field>, cpu, thread, kind, [<aux_field>], and where the agent
        measured it each sample's stolen time (stolen_runnable_ns, stolen_offline_ns)."""
        r = self.records
        columns: dict[str, pa.Array] = {
            "t_ns": pa.array(r["t_ns"].astype(np.int64)),
            self.value_field: pa.array(r["value"]),
            "cpu": pa.array(r["cpu"].astype(np.int16)),
            "thread": pa.array(r["thread"].astype(np.int16)),
            "kind": pa.DictionaryArray.from_arrays(
                pa.array(r["kind"].astype(np.int32)),
                pa.array([self.kind_name(i) for i in range(max(len(self.header.get("kinds") or []),
                                                              int(r["kind"].max(initial=0)) + 1))]),
            ),
        }
        aux = self.header.get("aux_field")
        if aux:
            columns[str(aux)] = pa.array(r["aux"].astype(np.int64))
        if self.measures_stolen:
            for name, values in zip(STOLEN_COLUMNS, self.stolen_per_sample(), strict=True):
                columns[name] = pa.array(values)
        return pa.table(columns)


class StreamReader:
    """Incremental reader: call :meth:`poll` while the agent runs, :meth:`finish` after it exits."""

    def __init__(self, path: Path, keep: bool = True) -> None:
        self.path = Path(path)
        self.keep = keep  # False: poll() only returns the new records (a follower that keeps its own)
        self.header: dict[str, Any] | None = None
        self._offset = 0
        self._chunks: list[np.ndarray] = []
        self._meta: list[np.ndarray] = []
        self._file: BinaryIO | None = None
        self._ended = False
        self.corrupt: str | None = None

    def _open(self) -> BinaryIO | None:
        if self._file is None:
            try:
                self._file = self.path.open("rb")
            except FileNotFoundError:
                return None
            except OSError as exc:
                raise InputError(f"{self.path}: cannot read sample stream: {exc.strerror}") from None
        return self._file

    def _read_header(self, f: BinaryIO, final: bool) -> bool:
        f.seek(0)
        prefix = f.read(16)
        if len(prefix) < 16:
            if final:
                raise InputError(f"{self.path}: not an rtvirt sample stream (file too short: {len(prefix)} bytes)")
            return False
        if prefix[:8] != MAGIC:
            raise InputError(f"{self.path}: not an rtvirt sample stream (bad magic)")
        version = int.from_bytes(prefix[8:12], "little")
        length = int.from_bytes(prefix[12:16], "little")
        if version not in SUPPORTED_VERSIONS:
            raise InputError(f"{self.path}: sample stream format version {version} is not supported")
        if length > MAX_HEADER:
            raise InputError(f"{self.path}: corrupt sample stream (header length {length})")
        text = f.read(length)
        if len(text) < length:
            if final:
                raise InputError(f"{self.path}: truncated sample stream (header cut short)")
            return False
        try:
            header = json.loads(text.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InputError(f"{self.path}: corrupt sample stream header ({exc})") from None
        if not isinstance(header, dict) or not {"probe", "value_field"} <= header.keys():
            raise InputError(f"{self.path}: sample stream header lacks 'probe' or 'value_field'")
        self.header = header
        self._offset = 16 + length + (-(16 + length) % 8)
        return True

    def poll(self, final: bool = False, limit: int | None = None) -> np.ndarray:
        """Read the records appended since the last call (at most ``limit`` of them: a follower that joins a long
        run late reads it in bounded steps); returns the new data records."""
        f = self._open()
        if f is None:
            if final:
                raise InputError(f"{self.path}: sample stream not found")
            return np.empty(0, RECORD)
        if self.header is None and not self._read_header(f, final):
            return np.empty(0, RECORD)
        if self.corrupt is not None:
            return np.empty(0, RECORD)
        f.seek(self._offset)
        data = f.read() if limit is None else f.read(limit * RECORD.itemsize)
        usable = len(data) - len(data) % RECORD.itemsize
        records = self._valid_prefix(np.frombuffer(data[:usable], dtype=RECORD))
        self._offset += records.size * RECORD.itemsize
        is_meta = (records["flags"] & FLAG_META) != 0
        if is_meta.any():
            self._meta.append(records[is_meta])
            records = records[~is_meta]
        if self.keep:
            self._chunks.append(records)
        return records

    def _valid_prefix(self, records: np.ndarray) -> np.ndarray:
        """The records before the first one no writer makes (unknown flag bits or meta kind, a STOLEN record
        the header does not declare, anything after END): a channel that garbles bytes (a serial line) must
        not turn noise into samples."""
        flags, kinds = records["flags"], records["kind"]
        is_meta = (flags & FLAG_META) != 0
        last_kind = META_STOLEN if self.header is not None and self.header.get("stolen") else META_STAT
        bad = (flags > FLAG_META) | (is_meta & ((kinds < META_DROPPED) | (kinds > last_kind)))
        after_end = np.zeros(records.size, dtype=bool)
        ends = np.flatnonzero(is_meta & (kinds == META_END))
        if self._ended:
            after_end[:] = True
        elif ends.size:
            after_end[ends[0] + 1:] = True
        wrong = bad | after_end
        if not wrong.any():
            self._ended = self._ended or bool(ends.size)
            return records
        first = int(np.argmax(wrong))
        why = "a record after END" if after_end[first] and not bad[first] else \
            f"flags {int(flags[first]):#x}, kind {int(kinds[first])}"
        self.corrupt = (f"{self.path}: corrupt record at byte {self._offset + first * RECORD.itemsize} ({why}); "
                        "every record before it is kept")
        return records[:first]

    @property
    def ended(self) -> bool:
        """The END record has been read: every record the writer wrote is in hand."""
        return self._ended

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def finish(self) -> SampleStream:
        self.poll(final=True)
        self.close()
        assert self.header is not None
        records = np.concatenate(self._chunks) if self._chunks else np.empty(0, RECORD)
        stream = SampleStream(self.header, records, corrupt=self.corrupt)
        stat_names = self.header.get("stats") or []
        metas = np.concatenate(self._meta) if self._meta else np.empty(0, RECORD)
        stolen = metas[metas["kind"] == META_STOLEN]
        stream.stolen = np.zeros(stolen.size, STOLEN)
        stream.stolen["t_ns"], stream.stolen["thread"] = stolen["t_ns"].astype(np.int64), stolen["thread"]
        stream.stolen["runnable_ns"], stream.stolen["offline_ns"] = stolen["value"], stolen["aux"].astype(np.int64)
        for meta in metas[metas["kind"] != META_STOLEN]:
            kind = int(meta["kind"])
            if kind == META_DROPPED:
                stream.dropped[int(meta["thread"])] = int(meta["value"])
            elif kind == META_END:
                stream.end_reason = END_REASONS.get(int(meta["aux"]), "error")
                stream.written = int(meta["value"])
            elif kind == META_STAT:
                key = int(meta["aux"])
                name = str(stat_names[key]) if key < len(stat_names) else f"stat{key}"
                stream.stats[(int(meta["thread"]), name)] = int(meta["value"])
        return stream


def read_stream(path: Path | str) -> SampleStream:
    """Read a whole sample stream file (complete or partial)."""
    return StreamReader(Path(path)).finish()


COPY_SCAN_RECORDS = 1 << 15  # records read at a time while looking for the end of a copy's written part


def _copy_written_part(copy: Path, target: Path) -> None:
    """Write the written part of a stream copy on a guest's disk image (zeros after it) to ``target``: the header,
    then records up to END or up to the first all-zero record (a real record's time is never 0)."""
    with copy.open("rb") as f, target.open("wb") as out:
        prefix = f.read(16)
        length = int.from_bytes(prefix[12:16], "little") if len(prefix) == 16 and prefix[:8] == MAGIC else -1
        if not 0 <= length <= MAX_HEADER:
            return
        f.seek(0)
        out.write(f.read(16 + length + (-(16 + length) % 8)))
        while chunk := f.read(COPY_SCAN_RECORDS * RECORD.itemsize):
            records = np.frombuffer(chunk[:len(chunk) - len(chunk) % RECORD.itemsize], dtype=RECORD)
            stop = (records.view(np.uint8).reshape(-1, RECORD.itemsize) == 0).all(axis=1)
            stop |= ((records["flags"] & FLAG_META) != 0) & (records["kind"] == META_END)
            if stop.any():
                first = int(np.argmax(stop))
                ended = bool(records["flags"][first] & FLAG_META)
                out.write(chunk[:(first + int(ended)) * RECORD.itemsize])
                return
            out.write(chunk)


def recover_from_copy(copy: Path, live: Path) -> SampleStream | None:
    """The run's stream completed from the guest's own copy (its disk image) when that holds more than the live
    stream that reached the host (:func:`merge_stream_copy`); None when the live stream is as good, or the
    copy is unusable (not a stream, or other bytes than the live ones)."""
    scratch = live.with_suffix(".copy.rtvs")
    try:
        _copy_written_part(copy, scratch)
        added = merge_stream_copy(live, scratch)
    except (OSError, RunError):
        return None
    finally:
        scratch.unlink(missing_ok=True)
    return read_stream(live) if added else None


def merge_stream_copy(local: Path, fetched: Path) -> int:
    """Complete the stream received live (``local``) with the agent's own copy (``fetched``: an SSH target's
    ``--tee`` file, or the written part of a guest's copy disk).

    The copy is the same byte stream written by the same writer, so one is a prefix of the other: usually
    the received bytes of the copy, which then replaces the local file (nothing duplicated); after an agent
    killed with its target (a reboot) the copy may stop earlier, and the received bytes stay. Copies that
    differ are refused (the local stream is kept as it is). Returns the bytes added.
    """
    received = local.stat().st_size if local.exists() else 0
    size = fetched.stat().st_size
    with fetched.open("rb") as copy, (local.open("rb") if received else open(os.devnull, "rb")) as live:
        while True:
            expected = live.read(1 << 20)
            if not expected:
                break
            found = copy.read(len(expected))
            if found != expected[:len(found)]:
                fetched.unlink(missing_ok=True)
                raise RunError("the target's copy of the stream differs from the samples received; "
                               "the received samples are kept as they are")
            if len(found) < len(expected):
                break  # the copy ends inside what was received
    if size <= received:
        fetched.unlink(missing_ok=True)
        return 0
    shutil.move(fetched, local)
    with contextlib.suppress(OSError):
        local.chmod(0o644)
    return size - received
