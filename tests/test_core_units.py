import pytest
from hypothesis import given
from hypothesis import strategies as st

from rtvirt.params import parse_cpulist
from rtvirt.units import format_duration, parse_duration


@pytest.mark.parametrize(
    ("text", "unit", "ns"),
    [("100us", "ns", 100_000), ("1ms", "s", 1_000_000), ("10", "s", 10_000_000_000), ("1.5ms", "ns", 1_500_000),
     ("5m", "ns", 300_000_000_000), ("8h", "ns", 28_800_000_000_000), ("250", "us", 250_000), ("7ns", "s", 7),
     (" 2 s ", "ns", 2_000_000_000), (3, "ms", 3_000_000)],
)
def test_parse_duration_units(text: str, unit: str, ns: int) -> None:
    assert parse_duration(text, unit) == ns


@pytest.mark.parametrize("bad", ["", "ms", "1 parsec", "-5ms", "1e3", True, None, "1,5ms"])
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@given(st.integers(min_value=1, max_value=10**15))
def test_format_then_parse_is_close(ns: int) -> None:
    back = parse_duration(format_duration(ns))
    assert abs(back - ns) <= max(1, ns * 1e-5)


@pytest.mark.parametrize(
    ("text", "cpus"), [("0", (0,)), ("0,2-3", (0, 2, 3)), ("3-5,1", (3, 4, 5, 1)), ([1, "2-3"], (1, 2, 3))]
)
def test_cpulist(text: object, cpus: tuple[int, ...]) -> None:
    assert parse_cpulist(text) == cpus


@pytest.mark.parametrize("bad", ["", "a", "3-1", "1,1", "0-2,2", "-1", "1024", "1;2"])
def test_cpulist_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(bad)
