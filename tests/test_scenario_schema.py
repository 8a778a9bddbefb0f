"""Scenario files: the built-ins load, malformed files exit 2 naming the field path and the line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from rtvirt.cli import app
from rtvirt.errors import InputError
from rtvirt.scenario import builtin_scenarios, parse_scenario
from rtvirt.scenario.loader import key_lines
from rtvirt.scenario.matrix import expand

VALID = """\
name = "t"
duration = "2s"

[workload]
probe = "timer"
params = { interval = "1ms" }

[[environments]]
kind = "host"

[[environments]]
kind = "qemu"
vcpus = 1

[[disturbances]]
name = "solo"

[[disturbances]]
name = "same"
[[disturbances.stressors]]
stressor = "cpu"
where = "same-core"
params = { priority = 10 }
"""


def test_every_builtin_scenario_is_valid_and_expands() -> None:
    builtins = builtin_scenarios()
    assert {"default", "cots-hypervisor", "guest-isolation", "interrupt-latency"} <= set(builtins)
    for name, text in builtins.items():
        scenario = parse_scenario(text, name)
        assert scenario.name == name
        assert expand(scenario), name


def test_default_matrix_is_environments_times_disturbances() -> None:
    scenario = parse_scenario(builtin_scenarios()["default"])
    plans = expand(scenario)
    assert [p.key for p in plans][:3] == ["host/solo/-/r1", "host/same-core/test-first/r1",
                                          "host/other-core/test-first/r1"]
    assert {p.key.split("/")[0] for p in plans} == {"host", "partition", "qemu"}
    assert len(plans) == 9


def test_guest_isolation_has_orders_repetitions_and_the_on_off_timeline() -> None:
    plans = expand(parse_scenario(builtin_scenarios()["guest-isolation"]), scale=0.01)
    on_off = [p for p in plans if p.key.startswith("30min/guest/spin-other-core-10-20min")]
    assert len(on_off) == 10 and on_off[0].start_order is None
    assert on_off[0].events == ((6_000_000_000, "stress-on"), (12_000_000_000, "stress-off"))
    assert on_off[0].duration_ns == 18_000_000_000  # 30 min x 0.01
    assert {p.start_order for p in plans if p.key.startswith("start-order/guest/spin-same-core/")} == \
        {"test-first", "stress-first"}


def test_key_lines_follow_tables_and_arrays() -> None:
    lines = key_lines(VALID)
    assert lines[("duration",)] == 2
    assert lines[("environments", 1, "vcpus")] == 13
    assert lines[("disturbances", 1, "stressors", 0, "where")] == 22


MALFORMED = [
    # (change to VALID, expected field path in the message, expected line)
    (('duration = "2s"', 'duration = "soon"'), "duration", 2),
    (('duration = "2s"', 'duration = 0'), "duration", 2),
    (('name = "t"', 'name = "bad name!"'), "name", 1),
    (('probe = "timer"', 'probe = "nosuch"'), "workload.probe", 5),
    (('params = { interval = "1ms" }', 'params = { interval = "1parsec" }'), "workload.params.interval", 6),
    (('params = { interval = "1ms" }', 'params = { bogus = 1 }'), "workload.params.bogus", 6),
    (('params = { interval = "1ms" }', 'params = { duration = "3s" }'), "workload.params", 6),
    (('kind = "host"', 'kind = "vmware"'), "environments[0].kind", 9),
    (('vcpus = 1', 'vcpus = 0'), "environments[1].vcpus", 13),
    (('vcpus = 1', 'vcpus = 1\nmemory = "lots"'), "environments[1].memory", 14),
    (('vcpus = 1', 'vcpus = 1\nvcpu_sched = { policy = "deadline" }'), "environments[1].vcpu_sched", 14),
    (('vcpus = 1', 'vcpus = 1\ncpus = "3-1"'), "environments[1].cpus", 14),
    (('stressor = "cpu"', 'stressor = "nosuch"'), "disturbances[1].stressors[0].stressor", 21),
    (('where = "same-core"', 'where = "next-door"'), "disturbances[1].stressors[0].where", 22),
    (('params = { priority = 10 }', 'params = { priority = 500 }'), "disturbances[1].stressors[0].params.priority",
     23),
    (('name = "same"', 'name = "solo"'), "disturbances[1].name", 19),
    (('vcpus = 1', 'vcpus = 1\nunknown_key = true'), "environments[1].unknown_key", 14),
    (('name = "solo"', 'name = "solo"\nevents = [{ at = "1s", action = "stress-off" }]'), "disturbances[0].events", 17),
    (('[[disturbances]]\nname = "solo"', '[timeline]\nstart_order = []\n\n[[disturbances]]\nname = "solo"'),
     "timeline.start_order", 16),
]


@pytest.mark.parametrize(("change", "path", "line"), MALFORMED, ids=[m[1] + f"@{m[2]}" for m in MALFORMED])
def test_malformed_scenario_exits_2_naming_field_and_line(tmp_path: Path, change: tuple[str, str], path: str,
                                                          line: int) -> None:
    old, new = change
    assert old in VALID
    scenario = tmp_path / "bad.toml"
    scenario.write_text(VALID.replace(old, new, 1))
    result = CliRunner().invoke(app, ["run", str(scenario), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert f"field '{path}" in result.output
    assert f"bad.toml:{line}:" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "r" / "runs").exists()


def test_not_toml_and_unknown_names_are_input_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not valid TOML"):
        parse_scenario("name = ", "x.toml")
    result = CliRunner().invoke(app, ["run", "no-such-scenario", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "neither a built-in scenario" in result.output
    result = CliRunner().invoke(app, ["run", "default", "--scale", "-1", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--scale" in result.output
    result = CliRunner().invoke(app, ["run", "--resume", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "--resume" in result.output


def test_scenarios_command_lists_builtins() -> None:
    result = CliRunner().invoke(app, ["scenarios"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for name in ("default", "cots-hypervisor", "guest-isolation", "interrupt-latency"):
        assert name in result.output
