"""The sample stream as written by the real agent: complete, cut short, corrupt or foreign."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from rtvirt.errors import InputError
from rtvirt.probes import get_probe
from rtvirt.probes.runner import run_probe
from rtvirt.stream import FLAG_META, MAGIC, META_DROPPED, META_END, META_STOLEN, RECORD, StreamReader, read_stream


@pytest.fixture(scope="module")
def timer_stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    spec = get_probe("timer")
    path = tmp_path_factory.mktemp("stream") / "timer.rtvs"
    run_probe(spec, spec.params(duration="300ms", interval="1ms", threads=2, affinity="0"), path)
    return path


def test_complete_stream(timer_stream: Path) -> None:
    stream = read_stream(timer_stream)
    assert stream.complete and stream.end_reason == "complete"
    assert stream.header["probe"] == "timer" and stream.header["params"]["interval"] == 1_000_000
    assert stream.written == stream.records.size
    assert set(np.unique(stream.records["thread"])) == {0, 1}
    assert (stream.records["cpu"] == 0).all()
    assert (stream.records["value"] >= 0).all()
    # thread 0 wakes every 1 ms, thread 1 every 1.5 ms, for about 290 ms
    per_thread = np.bincount(stream.records["thread"])
    assert 200 < per_thread[0] <= 300 and 130 < per_thread[1] <= 200
    assert stream.total_dropped == 0
    assert ("overruns" in {name for (_, name) in stream.stats})


def test_cut_stream_keeps_every_whole_record(timer_stream: Path, tmp_path: Path) -> None:
    data = timer_stream.read_bytes()
    full = read_stream(timer_stream)
    header_length = int.from_bytes(data[12:16], "little")
    header_bytes = 16 + header_length + (-(16 + header_length) % 8)
    cut = tmp_path / "cut.rtvs"
    cut.write_bytes(data[: header_bytes + 10 * RECORD.itemsize + 7])
    partial = read_stream(cut)
    assert not partial.complete
    assert partial.records.size == 10
    assert (partial.records == full.records[:10]).all()


def test_incremental_reader_sees_growth(timer_stream: Path, tmp_path: Path) -> None:
    data = timer_stream.read_bytes()
    growing = tmp_path / "growing.rtvs"
    reader = StreamReader(growing)
    assert reader.poll().size == 0  # not there yet
    growing.write_bytes(data[:20])
    assert reader.poll().size == 0  # header incomplete
    growing.write_bytes(data[: len(data) // 2])
    first = reader.poll().size
    growing.write_bytes(data)
    second = reader.poll().size
    assert first > 0 and first + second == read_stream(timer_stream).records.size
    assert reader.finish().complete


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short"),
        (b"PK\x03\x04 this is a zip file, not ours", "bad magic"),
        (b"RTVIRT\x00S\x09\x00\x00\x00\x02\x00\x00\x00{}", "version 9"),
        (b"RTVIRT\x00S\x01\x00\x00\x00\x05\x00\x00\x00{nope", "corrupt sample stream header"),
        (b"RTVIRT\x00S\x01\x00\x00\x00\x40\x00\x00\x00{}", "header cut short"),
        (b"RTVIRT\x00S\x01\x00\x00\x00\x02\x00\x00\x00{}", "lacks 'probe'"),
    ],
)
def test_bad_files_name_the_file(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.rtvs"
    path.write_bytes(content)
    with pytest.raises(InputError) as error:
        read_stream(path)
    assert str(path) in str(error.value) and message in str(error.value)


# quiet: each thread must get its CPU 10,000 times in the second; in the parallel phase another test's probe may keep
# that CPU busy at SCHED_FIFO 99 (a gap probe spinning at 99 beside it left this test's thread there 2 wake-ups)
@pytest.mark.quiet
def test_ten_kilohertz_on_every_cpu_drops_nothing(tmp_path: Path) -> None:
    spec = get_probe("timer")
    cpus = sorted(os.sched_getaffinity(0))
    params = spec.params(duration="1s", interval="100us", distance="0us", threads=len(cpus),
                         affinity=",".join(map(str, cpus)))
    stream = run_probe(spec, params, tmp_path / "fast.rtvs")
    assert stream.complete and stream.total_dropped == 0
    per_thread = np.bincount(stream.records["thread"], minlength=len(cpus))
    # a missed period is skipped, not queued, so a thread cannot exceed one sample per 100 us
    assert (per_thread <= 10_000).all() and per_thread.sum() >= 0.8 * 10_000 * len(cpus)


def _bare_metal_stream(path: Path, declared: bool) -> tuple[np.ndarray, np.ndarray]:
    """A gap stream as the bare-metal guest under Xen writes it: 6 samples, a STOLEN meta record after the 2nd and
    5th (runnable, offline ns), then DROPPED and END; ``declared``: the header names the records' source."""
    header = {"format": 1, "probe": "gap", "value_field": "duration_ns", "aux_field": "cycles", "kinds": ["gap"],
              "stats": [], **({"stolen": "xen-runstate"} if declared else {})}
    text = json.dumps(header).encode()
    records = np.zeros(10, RECORD)
    data = [0, 1, 3, 4, 6, 7]
    records["t_ns"][data] = [10_000_000 * (i + 1) for i in range(6)]
    records["value"][data] = [600_000, 6_000_000, 700_000, 800_000, 5_900_000, 650_000]
    for at, sample, runnable, offline in ((2, 1, 5_800_000, 0), (5, 4, 4_000_000, 1_500_000)):
        records[at] = (records["t_ns"][data[sample]], runnable, offline, 0, 0, META_STOLEN, FLAG_META)
    records[8] = (90_000_000, 0, 0, 0, 0, META_DROPPED, FLAG_META)
    records[9] = (90_000_000, 6, 0, 0, 0, META_END, FLAG_META)
    padding = b"\0" * (-(16 + len(text)) % 8)
    path.write_bytes(MAGIC + (1).to_bytes(4, "little") + len(text).to_bytes(4, "little") + text + padding
                     + records.tobytes())
    return records[data], np.array([0, 5_800_000, 0, 0, 4_000_000, 0])


def test_stolen_time_records_follow_their_samples_and_are_not_samples(tmp_path: Path) -> None:
    path = tmp_path / "bare.rtvs"
    samples, runnable = _bare_metal_stream(path, declared=True)
    stream = read_stream(path)
    assert stream.complete and stream.corrupt is None and stream.written == 6
    assert stream.records.size == 6 and (stream.records["value"] == samples["value"]).all()  # STOLEN is not a sample
    assert stream.measures_stolen and stream.stolen.size == 2
    per_sample_runnable, per_sample_offline = stream.stolen_per_sample()
    assert per_sample_runnable.tolist() == runnable.tolist()
    assert per_sample_offline.tolist() == [0, 0, 0, 0, 1_500_000, 0]
    table = stream.to_table()
    assert table.column("stolen_runnable_ns").to_pylist() == runnable.tolist() and table.num_rows == 6
    # the statistics a user asks for count the six samples only, from the file and from the stored run, whose
    # samples table carries each sample's stolen time
    stats = run_cli("stats", str(path), "--json", check=True)
    assert '"samples": 6' in stats.stdout, stats.stdout
    from rtvirt.store import load_run, new_run, write_measured_run

    run = new_run(tmp_path / "results", "bare")
    write_measured_run(run, stream, name="bare", params={})
    stored = load_run(run.path)
    assert stored.manifest["summary"]["all"]["samples"] == 6
    rows = run_cli("sql", "SELECT sum(stolen_runnable_ns) AS r, sum(stolen_offline_ns) AS o, count(*) AS n "
                   "FROM read_parquet('" + str(run.parquet_path) + "')", "--results", str(tmp_path / "results"),
                   "--format", "json", check=True)
    assert json.loads(rows.stdout)["rows"] == [[9_800_000, 1_500_000, 6]], rows.stdout


def test_a_stolen_time_record_the_header_does_not_declare_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "undeclared.rtvs"
    _bare_metal_stream(path, declared=False)
    stream = read_stream(path)
    assert stream.records.size == 2 and not stream.measures_stolen  # the prefix before the first unknown record
    assert stream.corrupt is not None and f"kind {META_STOLEN}" in stream.corrupt
