"""The sample stream as written by the real agent: complete, cut short, corrupt or foreign."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from rtvirt.errors import InputError
from rtvirt.probes import get_probe
from rtvirt.probes.runner import run_probe
from rtvirt.stream import RECORD, StreamReader, read_stream


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
