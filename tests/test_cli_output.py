"""Output rules of every command (docs/output.md): complete tables off a terminal, colour only on a terminal
and never with NO_COLOR, progress on stderr only, --json everywhere, a lazy start-up, and a resumed campaign's
summary that covers every run."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import click
import pytest
import tomli_w

import rtvirt
from rtvirt.cli import COMMANDS, app

HEAVY = ("rich", "pydantic", "numpy", "pyarrow", "duckdb", "matplotlib", "asyncssh", "libvirt")
COLOUR = re.compile(r"\x1b\[[0-9;]*(?:3[0-7]|9[0-7]|38;)[0-9;]*m")
LONG_NAME = "a-task-name-as-long-as-models-allow-40ch"  # 40 characters, the longest a model accepts


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "NO_COLOR", "FORCE_COLOR", "LINES")}
    return {**env, "TERM": "xterm-256color", **extra}


def _piped(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rtvirt", *args], capture_output=True, text=True, timeout=120,
                          env=_env(**env))


def _on_terminal(*args: str, stdout_piped: bool = False, **env: str) -> tuple[int, str]:
    """Run rtvirt with stderr (and stdout unless ``stdout_piped``) on a pseudo-terminal; returns the exit status
    and everything shown on the terminal."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "rtvirt", *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL if stdout_piped else follower, stderr=follower,
                            env=_env(**env))
    os.close(follower)
    shown = b""
    while True:
        ready, _, _ = select.select([leader], [], [], 60)
        if not ready:
            proc.kill()
            break
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is gone
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    return proc.wait(timeout=60), shown.decode(errors="replace")


def _in_fresh_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=_env(**env))


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "wide.toml"
    path.write_text(tomli_w.dumps({
        "name": "wide", "simulation": {"duration": "2s"}, "hypervisor": {"scheduler": "partitioned"},
        "vm": [{"name": "guest", "scheduler": "edf", "vcpu": [{"affinity": [0]}],
                "task": [{"name": LONG_NAME, "period": "5ms", "execution": "1ms"},
                         {"name": f"{LONG_NAME[:-1]}2", "period": "10ms", "execution": "1ms"},
                         {"name": "short", "period": "10ms", "execution": "2ms"}]}],
    }))
    return path


def test_help_lists_every_command_without_importing_any_heavy_module() -> None:
    code = ("import sys\nfrom rtvirt.cli import app\ntry:\n    app.main(['--help'], prog_name='rtvirt')\n"
            f"except SystemExit:\n    pass\nprint([m for m in {HEAVY!r} if m in sys.modules])")
    shown = _in_fresh_python(code)
    assert shown.returncode == 0, shown.stderr
    listing, loaded = shown.stdout.rsplit("\n", 2)[:2]
    assert loaded == "[]"
    for name, entry in COMMANDS.items():
        assert re.search(rf"^  {re.escape(name)} +\S", listing, re.M), f"{name} missing from --help"
        assert entry.summary.split()[0] in listing


def test_shell_completion_of_command_names_imports_no_heavy_module() -> None:
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: sys.stderr.write(repr([m for m in {HEAVY!r} if m in sys.modules])))\n"
            "from rtvirt.cli import main\nmain()")
    shown = _in_fresh_python(code, _RTVIRT_COMPLETE="bash_complete", COMP_WORDS="rtvirt s", COMP_CWORD="1")
    assert shown.stdout.split() == [f"plain,{name}" for name in COMMANDS if name.startswith("s")]
    assert "plain,stats" in shown.stdout.split()
    assert shown.stderr.strip().endswith("[]")


def test_every_registered_command_loads_under_its_name_and_says_what_it_does() -> None:
    for name, entry in COMMANDS.items():
        command = app.get_command(click.Context(app), name)
        assert isinstance(command, click.Command) and command.name == name, name
        assert entry.summary.strip()


def test_version_is_the_installed_one() -> None:
    assert rtvirt.__version__ == version("rtvirt")
    assert _piped("--version").stdout.strip() == f"rtvirt, version {version('rtvirt')}"


def _leaf_commands() -> list[tuple[str, click.Command]]:
    leaves = []
    for name in COMMANDS:
        command = app.get_command(click.Context(app), name)
        assert command is not None
        if isinstance(command, click.Group):
            leaves += [(f"{name} {sub}", command.get_command(click.Context(command), sub))
                       for sub in command.list_commands(click.Context(command))]
        else:
            leaves.append((name, command))
    return leaves


def test_every_command_has_a_json_output() -> None:
    missing = []
    for name, command in _leaf_commands():
        options = {opt: param for param in command.params for opt in param.opts}
        fmt = options.get("--format")
        if "--json" not in options and not (fmt is not None and "json" in getattr(fmt.type, "choices", ())):
            missing.append(name)
    assert missing == []


def test_tables_stay_complete_when_stdout_is_not_a_terminal(model: Path, tmp_path: Path) -> None:
    shown = _piped("sim", str(model), "--results", str(tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    assert f"guest/{LONG_NAME}" in shown.stdout
    assert COLOUR.search(shown.stdout) is None and "\x1b[" not in shown.stdout
    run_dir = shown.stdout.rsplit(" written to ", 1)[1].split()[0]
    assert Path(run_dir, "manifest.json").exists()  # the path is printed whole, on one line
    stats = _piped("stats", run_dir)
    assert stats.returncode == 0, stats.stderr
    assert "…" not in stats.stdout and f"guest/{LONG_NAME}" in stats.stdout
    assert max(len(line) for line in stats.stdout.splitlines()) > 80  # wider than the old squeeze


def test_json_is_one_document_on_stdout(model: Path, tmp_path: Path) -> None:
    shown = _piped("sim", str(model), "--results", str(tmp_path), "--json")
    document = json.loads(shown.stdout)
    assert document["tasks"][f"guest/{LONG_NAME}"]["jobs"] == 400
    run = json.loads(_piped("stats", document["path"], "--json").stdout)
    assert run[next(iter(run))]["all"]["samples"] == 800


def test_colour_on_a_terminal_follows_no_color(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-run")
    status, shown = _on_terminal("stats", missing)
    assert status == 2 and "no-such-run" in shown
    assert COLOUR.search(shown), "an error on a terminal is shown in colour"
    status, shown = _on_terminal("stats", missing, NO_COLOR="1")
    assert status == 2 and "no-such-run" in shown
    assert COLOUR.search(shown) is None
    piped = _piped("stats", missing)
    assert piped.returncode == 2 and "\x1b[" not in piped.stderr


def test_progress_goes_to_stderr_and_only_on_a_terminal(tmp_path: Path) -> None:
    args = ("probe", "timer", "-D", "0.5s", "--no-rt", "--results", str(tmp_path))
    quiet = _piped(*args)
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""
    forced = _piped(*args, "--progress")
    assert forced.returncode == 0, forced.stderr
    assert "samples, max" not in forced.stdout and "run " in forced.stdout
    status, shown = _on_terminal(*args)
    assert status == 0 and "samples, max" in shown  # the bar's status text, drawn on the terminal
    # stdout redirected, stderr still a terminal: the bar is drawn there, and nothing else is
    status, shown = _on_terminal(*args, stdout_piped=True)
    assert status == 0 and "samples, max" in shown and "written to" not in shown


HOST_SCENARIO = """\
name = "resumable"
duration = "300ms"
repetitions = 1
run_timeout = "60s"

[workload]
probe = "timer"
params = { interval = "1ms", rt = false }

[[environments]]
kind = "host"

[[disturbances]]
name = "first"

[[disturbances]]
name = "second"
"""


def test_resumed_campaign_summary_covers_runs_finished_before(tmp_path: Path) -> None:
    scenario = tmp_path / "resumable.toml"
    scenario.write_text(HOST_SCENARIO)
    results = tmp_path / "results"
    first = _piped("run", str(scenario), "--out", str(results), "--no-progress")
    assert first.returncode == 0, first.stderr + first.stdout
    state_path = next(results.glob("campaigns/*/state.json"))
    state = json.loads(state_path.read_text())
    keys = list(state["runs"])
    assert len(keys) == 2
    # as if the campaign had been killed during its second run
    state["finished"] = False
    state["runs"][keys[1]]["status"] = "running"
    state_path.write_text(json.dumps(state))
    earlier = state["runs"][keys[0]]["run_id"]
    samples = json.loads((results / "runs" / earlier / "manifest.json").read_text())["summary"]["all"]["samples"]

    resumed = _piped("run", "--resume", "--out", str(results), "--no-progress", "--json")
    assert resumed.returncode == 0, resumed.stderr + resumed.stdout
    document = json.loads(resumed.stdout)
    assert list(document["runs"]) == keys
    assert document["runs"][keys[0]]["run_id"] == earlier
    assert document["runs"][keys[0]]["summary"]["samples"] == samples > 0
    assert document["runs"][keys[1]]["summary"]["samples"] > 0

    state = json.loads(state_path.read_text())
    state["finished"] = False
    state["runs"][keys[1]]["status"] = "running"
    state_path.write_text(json.dumps(state))
    table = _piped("run", "--resume", "--out", str(results), "--no-progress")
    assert table.returncode == 0, table.stderr + table.stdout
    row = next(line for line in table.stdout.splitlines() if keys[0] in line)
    assert f" {samples} " in row and " - " not in row


# --- output for scripts (issue 39): one JSON document, nothing wrapped, one-line errors, consistent exit codes --

def test_forced_progress_draws_the_probe_bar_on_a_piped_stderr_elapsed_then_left(tmp_path: Path) -> None:
    forced = _piped("probe", "timer", "-D", "1s", "--no-rt", "--progress", "--results", str(tmp_path))
    assert forced.returncode == 0, forced.stderr
    drawn = forced.stderr.replace("\r", "\n")
    # `--progress` forces the bar (it used to write one newline): elapsed labelled so, then what is left
    assert re.search(r"\d:\d\d:\d\d\S*\s+elapsed,\s+\S*\d:\d\d:\d\d\S*\s+left", COLOUR_ANY.sub("", drawn)), drawn
    assert "run " in forced.stdout and "elapsed" not in forced.stdout


COLOUR_ANY = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def test_report_out_dash_is_one_json_document_on_stdout_and_no_file(model: Path, tmp_path: Path) -> None:
    results = tmp_path / "results"
    made = _piped("sim", str(model), "--results", str(results))
    assert made.returncode == 0, made.stderr
    report = subprocess.run([sys.executable, "-m", "rtvirt", "report", str(results), "--format", "json", "--out",
                             "-"], capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    document = json.loads(report.stdout)  # the whole of stdout: one document, nothing else there
    assert document["configurations"]
    assert not (tmp_path / "-").exists() and not (results / "report.json").exists()


def _one_error_line(result: subprocess.CompletedProcess[str], names: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"rtvirt: {names}: "), lines[0]
    return lines[0]


def test_every_usage_error_is_one_line_naming_the_option_with_exit_2(tmp_path: Path) -> None:
    line = _one_error_line(_piped("probe", "timer", "-D", "3sec"), "option -D/--duration")
    assert "'3sec' is not a time" in line
    _one_error_line(_piped("probe", "timer", "--bogus"), "option --bogus")
    assert "did you mean --duration" in _one_error_line(_piped("probe", "timer", "--durat", "1"), "option --durat")
    _one_error_line(_piped("probe", "timer", "-D"), "option -D")
    _one_error_line(_piped("host", "tune"), "option --profile")
    _one_error_line(_piped("stats"), "argument SOURCES")
    _one_error_line(_piped("run", "--scale", "x"), "option --scale")
    _one_error_line(_piped("--bogus"), "option --bogus")
    assert _piped("nosuch").stderr.startswith("rtvirt: no such command 'nosuch'")
    # a rule between two options names both, never 'options'
    line = _one_error_line(_piped("stress", "cpu", "--slice", "20ms", "--period", "10ms"), "options --slice, --period")
    assert "--slice must be shorter than --period" in line
    # a choice's metavar lists the choices, not N
    assert "--engine cyclictest|timerlat" in _piped("probe", "timer", "--help").stdout


def test_a_misspelled_required_key_is_named_with_its_line_and_what_it_should_be(tmp_path: Path) -> None:
    scenario = tmp_path / "typo-key.toml"
    scenario.write_text('name = "typo"\nduraton = "2s"\n[workload]\nprobe = "timer"\n[[environments]]\n'
                        'kind = "host"\n')
    line = _one_error_line(_piped("scenarios", str(scenario)), f"{scenario}:2")
    assert "field 'duraton'" in line and "did you mean 'duration'" in line


def test_push_to_an_unreachable_store_exits_1_even_with_nothing_spooled(tmp_path: Path) -> None:
    url = f"postgresql://u:pw@127.0.0.1:1/db?data={tmp_path / 'lab'}&spool={tmp_path / 'spool'}"
    pushed = _piped("push", "--results", url)
    assert pushed.returncode == 1, pushed.stderr
    assert "unreachable" in pushed.stderr and "pw" not in pushed.stderr


LONG_KEYS = """\
name = "a-scenario-whose-run-ids-are-long"
duration = "300ms"
repetitions = 1
run_timeout = "60s"

[workload]
probe = "timer"
params = { interval = "1ms", rt = false }

[[environments]]
kind = "host"
name = "a-host-environment-with-a-long-name"

[[disturbances]]
name = "a-disturbance-whose-name-is-long-too"

[predict]
duration = "300ms"
"""


def test_run_ids_and_paths_stay_on_one_line_off_a_terminal(tmp_path: Path) -> None:
    """Piped output keeps every run id and path whole: the campaign's lines on stderr (a file), the predicted
    runs, `stats RUN | cat` (a title wider than its table) and `stats FILE --column`."""
    scenario = tmp_path / "long.toml"
    scenario.write_text(LONG_KEYS)
    results = tmp_path / "results"
    with (tmp_path / "stderr.txt").open("w") as stderr:
        ran = subprocess.run([sys.executable, "-m", "rtvirt", "run", str(scenario), "--out", str(results),
                              "--no-progress"], stdout=subprocess.PIPE, stderr=stderr, text=True, timeout=300,
                             env=_env())
    messages = (tmp_path / "stderr.txt").read_text()
    assert ran.returncode == 0, messages + ran.stdout
    (run_dir,) = [p for p in results.glob("runs/*") if json.loads((p / "manifest.json").read_text())
                  .get("source") == "measured"]
    run_id = run_dir.name
    assert len(run_id) > 80
    key = "a-host-environment-with-a-long-name/a-disturbance-whose-name-is-long-too/-/r1"
    # (short: a loaded machine's timer missed periods, said on the same line after the key)
    assert any(line == f"complete {key}" or line.startswith(f"short {key}: ") for line in messages.splitlines()), \
        messages
    predicted = next(line for line in (messages + ran.stdout).splitlines() if line.startswith("predicted "))
    simulated, analysed = re.findall(r"\d{8}T\d{6}Z-\S+-[0-9a-f]{4}", predicted)
    assert (results / "runs" / simulated.rstrip(",")).is_dir() and (results / "runs" / analysed).is_dir()
    stats = _piped("stats", str(run_dir))
    assert stats.stdout.splitlines()[0].strip() == run_id
    samples = run_dir / "samples.parquet"
    column = _piped("stats", str(samples), "--column", "latency_ns")
    assert column.returncode == 0, column.stderr
    assert column.stdout.splitlines()[0].strip() == str(samples)


def test_the_command_probe_explain_suggests_runs_as_printed(tmp_path: Path) -> None:
    """`probe --explain --results DIR` ends with the command that shows the explanation; it used to leave out
    --results, so the command failed (exit 2) as printed."""
    results = tmp_path / "elsewhere"
    probe = _piped("probe", "timer", "-D", "1s", "-a", str(max(os.sched_getaffinity(0))), "--explain", "--results",
                   str(results))
    assert probe.returncode == 0, probe.stderr
    line = next(line for line in probe.stdout.splitlines() if ": rtvirt explain " in line)
    suggested = shlex.split(line.split(": rtvirt ", 1)[1])
    assert suggested[-2:] == ["--results", str(results)]
    shown = _piped(*suggested)
    assert shown.returncode == 0, shown.stderr
    assert "threshold" in shown.stdout
