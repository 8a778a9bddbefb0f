"""Reading scenario files: TOML in, a validated Scenario out, errors naming the field path and line."""

from __future__ import annotations

import difflib
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ..environments import ENVIRONMENTS
from ..errors import InputError
from ..probes import PROBES
from ..stressors import STRESSORS
from .schema import Scenario

__all__ = ["load_scenario", "parse_scenario", "builtin_scenarios", "key_lines", "MAX_SCENARIO_BYTES"]

MAX_SCENARIO_BYTES = 1 << 20
_BARE_KEY = re.compile(r'\s*("(?:[^"\\]|\\.)*"|\'[^\']*\'|[A-Za-z0-9_-]+)\s*')


def _split_key(text: str) -> list[str] | None:
    """'a."b.c".d' -> ['a', 'b.c', 'd']; None when ``text`` is not a key."""
    parts, position = [], 0
    while True:
        match = _BARE_KEY.match(text, position)
        if not match:
            return None
        parts.append(match.group(1).strip("\"'"))
        position = match.end()
        if position == len(text):
            return parts
        if text[position] != ".":
            return None
        position += 1


def key_lines(text: str) -> dict[tuple[str | int, ...], int]:
    """Line number of every table, array-of-tables element and key in TOML ``text``, by field path.

    A small scanner, not a parser: it follows [table] / [[array]] headers and ``key =`` lines, which is
    all an error location needs (values inside multi-line arrays map to their key's line).
    """
    lines: dict[tuple[str | int, ...], int] = {}
    arrays: dict[tuple[str | int, ...], int] = {}  # array-of-tables path -> index of its last element
    current: tuple[str | int, ...] = ()

    def resolve(parts: list[str]) -> tuple[str | int, ...]:
        path: tuple[str | int, ...] = ()
        for part in parts:
            path += (part,)
            if path in arrays:
                path += (arrays[path],)
        return path

    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("[["):
            parts = _split_key(line[2:line.find("]]")]) if "]]" in line else None
            if parts is None:
                continue
            base = resolve(parts[:-1]) + (parts[-1],)
            arrays[base] = arrays.get(base, -1) + 1
            current = base + (arrays[base],)
            lines.setdefault(base, number)
            lines[current] = number
        elif line.startswith("["):
            parts = _split_key(line[1:line.find("]")]) if "]" in line else None
            if parts is not None:
                current = resolve(parts)
                lines.setdefault(current, number)
        elif "=" in line and not line.startswith("#"):
            parts = _split_key(line.split("=", 1)[0])
            if parts is None:
                continue
            for end in range(1, len(parts) + 1):
                lines.setdefault(current + tuple(parts[:end]), number)
    return lines


def _format_path(path: tuple[str | int, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def _clean_loc(loc: tuple[Any, ...]) -> tuple[str | int, ...]:
    """Drop the discriminator tag pydantic inserts after a union element's index (environments.0.qemu.x)."""
    cleaned: list[str | int] = []
    for index, part in enumerate(loc):
        if index and isinstance(loc[index - 1], int) and part in ENVIRONMENTS and cleaned[:1] == ["environments"]:
            continue
        cleaned.append(part)
    return tuple(cleaned)


def _error(source: str, text: str, path: tuple[str | int, ...], message: str) -> InputError:
    lines = key_lines(text)
    line = None
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            line = lines[path[:end]]
            break
    where = f"{source}:{line}" if line else source
    return InputError(f"{where}: field '{_format_path(path)}': {message.removeprefix('Value error, ')}")


def _misspelled_key(errors: list[Any]) -> tuple[tuple[str | int, ...], str] | None:
    """A required key missing beside an unknown one that looks like it (``duraton = "2s"``): the unknown key, at
    its own line, with the name it was probably meant to be; pydantic alone reports only the missing one."""
    unknown = [_clean_loc(tuple(e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
    for error in errors:
        if error["type"] != "missing":
            continue
        missing = _clean_loc(tuple(error["loc"]))
        for key in unknown:
            if key[:-1] == missing[:-1] and difflib.get_close_matches(str(key[-1]), [str(missing[-1])], cutoff=0.7):
                return key, f"unknown key: did you mean '{missing[-1]}'? (a required key, missing)"
    return None


def parse_scenario(text: str, source: str = "<scenario>") -> Scenario:
    """Validate scenario TOML ``text``; ``source`` names it in errors."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{source}: not valid TOML ({exc})") from None
    try:
        scenario = Scenario.model_validate(document)
    except ValidationError as exc:
        misspelled = _misspelled_key(exc.errors())
        if misspelled is not None:
            raise _error(source, text, *misspelled) from None
        error = exc.errors()[0]
        loc = _clean_loc(tuple(error["loc"]))
        if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc += ("kind",)  # the discriminator field is the one at fault
        raise _error(source, text, loc, error["msg"]) from None
    problems = scenario.cross_field_errors()
    if problems:
        raise _error(source, text, *problems[0])
    _check_agent_params(scenario, text, source)
    return scenario


def _check_agent_params(scenario: Scenario, text: str, source: str) -> None:
    """The probe's and stressors' parameters, validated by their own models."""
    checks: list[tuple[tuple[str | int, ...], type, dict[str, Any]]] = [
        (("workload", "params"), PROBES[scenario.workload.probe].params, scenario.workload.params)]
    checks += [(("workloads", i, "params"), PROBES[w.probe].params, w.params) for i, w in enumerate(scenario.workloads)]
    for i, disturbance in enumerate(scenario.disturbances):
        for j, use in enumerate(disturbance.stressors):
            checks.append((("disturbances", i, "stressors", j, "params"), STRESSORS[use.stressor].params, use.params))
    for prefix, model, params in checks:
        try:
            model(**params)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise _error(source, text, prefix + tuple(error["loc"]), error["msg"]) from None


def builtin_scenarios() -> dict[str, str]:
    """Name -> TOML text of the scenarios shipped with rtvirt."""
    folder = resources.files(__package__) / "builtin"
    return {entry.name.removesuffix(".toml"): entry.read_text() for entry in sorted(folder.iterdir(),
            key=lambda e: e.name) if entry.name.endswith(".toml")}


def load_scenario(spec: str | Path) -> tuple[Scenario, str, str]:
    """A built-in name or a file path -> (scenario, its TOML text, where it came from)."""
    text_spec = str(spec)
    builtins = builtin_scenarios()
    if text_spec in builtins and not Path(text_spec).exists():
        text, source = builtins[text_spec], f"built-in scenario {text_spec}"
    else:
        path = Path(text_spec)
        if not path.suffix == ".toml" and not path.exists():
            raise InputError(f"scenario {text_spec!r}: neither a built-in scenario ({', '.join(builtins)}) "
                             "nor a .toml file")
        try:
            if path.stat().st_size > MAX_SCENARIO_BYTES:
                raise InputError(f"{path}: scenario file larger than {MAX_SCENARIO_BYTES} bytes")
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"{path}: scenario file not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"{path}: cannot read scenario file ({exc})") from None
        source = str(path)
    return parse_scenario(text, source), text, source
