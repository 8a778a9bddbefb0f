"""The docs are tests (issue 39): every ``rtvirt ...`` command line and every TOML/JSON example of README.md and
docs/*.md runs here, at a small scale, in a scratch directory, and what the docs show as its output is checked.
An example that stops working fails the build. docs/output.md, "Examples in the docs are tests", is the short
version for people writing docs; this is the whole set of rules.

What is an example (tests/docs_examples.py reads them)
- A fenced block without a language (or sh/console/bash): a *transcript* if a line starts with ``$ `` (each prompt is
  a command, the lines up to the next prompt its output), else every line starting with ``rtvirt `` is a command
  (and ``export NAME=VALUE`` sets the environment of the commands after it).
  A trailing ``# comment`` saying ``(exit N)``, or an output line ``exit N`` / ``(exit status N)``, is the exit
  status; otherwise it is 0.
- A command with metavariables (RUN, FILE.toml, KEY=V1,...), alternatives (a|b), optional parts ([--json]), an
  ellipsis or an unset shell variable is a *synopsis*: its command and every option it names must exist (and a
  choice's values be valid); it is not run. So is every inline ``rtvirt ...`` span in prose, unless it names a
  file, run or scenario (a positional argument) and is complete: then it is an example and runs.
- A ```toml block must parse; then it is validated as what it is: a scenario (``rtvirt scenarios FILE``), a fragment
  of one (merged into a one-line host scenario, or into ``fragment of NAME``, then the same), a model (``rtvirt
  analyze FILE``), an experiment or a lab inventory (the loaders of ``rtvirt experiment`` and ``rtvirt lab``;
  experiments run where a command of the docs runs them). A ```json block must
  parse; ``output of "CMD"`` checks that CMD's JSON output has every key it shows.

Markers: an HTML comment on the line(s) just above a block or paragraph, ``<!-- docs-test: DIRECTIVE; ... -->``:
- ``file NAME``: this TOML/JSON block is the file NAME that commands (of any doc) use; a NAME that exists in the
  checkout (examples/...) must equal the block.
- ``fragment of NAME`` / ``model fragment``: how a TOML fragment is completed.
- ``needs KEY`` / ``needs KEY on "TEXT"``: the block's commands (those containing TEXT) are not run, for a reason in
  NEEDS (tests/docs_examples.py); they are still checked as synopses, and reported as skipped with the reason.
- ``output exact`` (the shown lines must appear verbatim) / ``output varies [on "TEXT"]: WHY`` (the output of the
  block's commands, or of those containing TEXT, is not compared; the exit status still is).
- ``lines apart``: the block's commands are independent cases; ``continues``: this block goes on in the previous
  block's case (its scratch directory, files and state).
- ``store down`` / ``store up``: the PostgreSQL server of this case stops / starts before the block.

How commands run: through bash (pipes, redirections and ``; echo "exit $?"`` as shown), with the checkout's
.venv/bin first on PATH, in the case's scratch directory, which holds every ``file`` of the docs and ``examples``
(a link to the checkout's). Output is stdout and stderr together, in order.
- Placeholders: ``<run_id>`` is the newest run of the results directory the path names; ``<host solo run>`` the run
  whose configuration has every word (host, solo); a run id that an earlier transcript showed stands for the run
  the same line of the real output named. ``make run`` is the Makefile's rtvirt command (its own ``setup:`` and
  echo lines are make's). A ``postgresql://`` URL (an export, an option) is this suite's PostgreSQL server (a new
  database, ``data=`` in the scratch directory); ``export PGPASSWORD=...`` its password.
- Shrinking (applied here, never in the docs): probe, stress and lab run at most 1 s (``-D`` lowered, or added),
  ``rtvirt sim -D`` at most 1 min of simulated time;
  ``rtvirt run`` without ``--scale`` gets the one that makes its longest run last 1 s (a scale the docs give is a
  small one already, and kept), and a built-in scenario ``--repetitions 1``; an experiment (a built-in, or a file)
  runs 4 systems per design point at 3 of its utilisations (first, middle, last), without ``ci_width``, each
  simulation at most 20 ms. A command with ``--resume`` is first run without it and interrupted (SIGINT) once it
  has stored something, so that there is something to resume.
- Comparing output (``output lines``, the default): each line the doc shows (``...`` lines dropped) must appear in
  the real output, in order, after abstracting numbers, run and campaign ids, times, absolute paths and table
  borders (the real line may go on after it, e.g. a note the run added). A transcript with no output shown
  checks the exit status only.
- A command that reads ``results`` (``--results results``, the default) where no example of its case made one
  reads the main job's: ``make run``'s campaign, the reader's own results in the docs' words.

Cost: one case per block (``lines apart``: per line), spread over xdist's workers; the built-in campaigns that
several docs run (``rtvirt run default``, the studies) run once per session for all workers and are copied into
each case (tests/shared_runs.py; tests/test_studies.py runs the studies' very command lines and shares them).
The fixtures live in tests/docs_examples.py, so that tests/conftest.py does not put every case on one worker.
Nothing here compares timings: not ``quiet``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
import tomli_w
from docs_examples import (  # noqa: F401 - fixtures: registered by being here
    DOCS,
    NEEDS,
    ROOT,
    SHELL_OPERATORS,
    Block,
    Command,
    all_blocks,
    is_synopsis,
    memo_fixture,
    pg_server_fixture,
    split_shell,
)
from shared_runs import Memo, campaign_argv, shared_campaign

BIN = Path(sys.executable).parent
READERS = ("stats", "compare", "explain", "sql", "report", "trend")  # commands that read a results directory
MAX_RUN_S = 1.0  # the longest run of a shrunk campaign
MAX_MEASURE = "1s"  # probe, stress and lab durations
MAX_SIMULATED = "1m"  # a simulation's -D (an hour of eight VMs is millions of records)
EXPERIMENT_SYSTEMS = 4
EXPERIMENT_SIMULATE_NS = 20_000_000
BASE_SCENARIO = 'name = "docs-fragment"\nduration = "1s"\n[workload]\nprobe = "timer"\n[[environments]]\n' \
    'kind = "host"\n'


# --- cases ------------------------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    blocks: list[Block]
    commands: list[tuple[Block, Command]] = field(default_factory=list)  # for `lines apart` and split-off needs
    need: str | None = None

    @property
    def doc(self) -> str:
        return self.blocks[0].doc


def _cases() -> list[Case]:
    cases: list[Case] = []
    for block in all_blocks():
        if block.kind == "other" or (block.kind in ("commands", "inline") and not block.commands):
            continue
        needing = [(c, need) for c in block.commands if (need := _need(block, c))]
        rest = [c for c in block.commands if not _need(block, c)]
        for command, need in needing:  # each reported on its own, so that nothing else hides behind it
            cases.append(Case(f"{block.doc}:{command.line}", [block], [(block, command)], need))
        # the block goes on in the doc's previous case of fenced blocks (prose between them is no step of it)
        previous = next((case for case in reversed(cases) if case.need is None
                         and any(b.kind != "inline" for b in case.blocks)), None)
        if block.markers.continues and previous is not None and previous.doc == block.doc:
            previous.blocks.append(block)
            previous.commands += [(block, c) for c in rest]
        elif block.markers.apart:
            cases += [Case(f"{block.doc}:{c.line}", [block], [(block, c)]) for c in rest]
        elif rest or block.kind in ("toml", "json"):
            cases.append(Case(block.name, [block], [(block, c) for c in rest]))
    for case in cases:
        if not case.commands and case.need is None:
            case.commands = [(b, c) for b in case.blocks for c in b.commands if not _need(b, c)]
    return cases


def _need(block: Block, command: Command) -> str | None:
    """What keeps ``command`` from running here (a key of NEEDS), if it is an example that would run."""
    need = block.markers.need_for(command.text)
    if need is None or not command.text.startswith("rtvirt "):
        return need
    if is_synopsis(command.text, {"RTVIRT_RESULTS": ""}):
        return None
    return need if block.kind != "inline" or _runnable_inline(command.text) else None



def _doc_files() -> dict[str, tuple[Block, str]]:
    """Every ``file`` of the docs: name -> (its block, its text)."""
    files: dict[str, tuple[Block, str]] = {}
    for block in all_blocks():
        name = block.markers.file
        if name is None:
            continue
        text = "\n".join(block.lines) + "\n"
        if name in files and files[name][1] != text:
            raise AssertionError(f"{block.name}: file {name} differs from the one at {files[name][0].name}")
        files[name] = (block, text)
    return files


FILES = _doc_files()


# --- references: commands and options that must exist -----------------------------------------------------------

def _resolve(tokens: list[str]) -> tuple[click.Command, int]:
    """The click command the tokens name (after ``rtvirt``) and how many tokens named it; alternatives (a|b) must
    all be commands."""
    from rtvirt.cli import app

    command: click.Command = app
    used = 1
    while used < len(tokens) and isinstance(command, click.Group):
        names = tokens[used].split("|")
        with click.Context(command) as ctx:
            found = [command.get_command(ctx, name) for name in names]
        if not all(found):
            if tokens[used].startswith("-") or _is_placeholder(tokens[used]):
                break
            raise AssertionError(f"no command {tokens[used]!r} under {command.name!r}")
        command = found[0]  # type: ignore[assignment]
        used += 1
    return command, used


def _is_placeholder(token: str) -> bool:
    return token in ("...", "…") or token.isupper() or token.startswith(("[", "<"))


def _options(command: click.Command) -> dict[str, click.Parameter]:
    found: dict[str, click.Parameter] = {"--help": click.Option(["--help"], is_flag=True)}
    for param in command.params:
        for name in [*param.opts, *param.secondary_opts]:
            if name.startswith("-"):
                found[name] = param
    if isinstance(command, click.Group):  # `rtvirt probe ... --explain`: an option of its subcommands
        with click.Context(command) as ctx:
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                if sub is not None:
                    found = {**_options(sub), **found}
    return found


def check_reference(text: str) -> None:
    """The command a synopsis or an inline span names exists, with every option it shows and valid choices."""
    head = text.split("#", 1)[0] if "#" in text and " #" in text else text
    try:
        tokens = shlex.split(head)
    except ValueError:
        tokens = head.split()
    # a pipe to another program ends the rtvirt part; `a | --b` in a synopsis is an alternative
    for index, token in enumerate(tokens):
        if token in SHELL_OPERATORS and not (index + 1 < len(tokens) and tokens[index + 1].startswith("-")):
            tokens = tokens[:index]
            break
    command, used = _resolve(tokens)
    options = _options(command)
    for index, token in enumerate(tokens[used:], used):
        token = token.strip("[]")
        if not token.startswith("-") or token in ("-", "--") or re.match(r"^-\d", token):
            continue
        for name in token.split("=", 1)[0].split("/"):
            assert name in options, f"{text!r}: {command.name} has no option {name} (it has {sorted(options)})"
            param = options[name]
            given = token.split("=", 1)[1] if "=" in token else (tokens[index + 1] if index + 1 < len(tokens)
                                                                  else "")
            if isinstance(param.type, click.Choice) and given and not _is_placeholder(given.strip("[]")):
                for choice in given.strip("[]").split("|"):
                    assert choice in param.type.choices, f"{text!r}: {name} takes none of {choice!r}"


def _runnable_inline(text: str) -> bool:
    """An inline span is an example when it names something (a positional argument) and parses completely."""
    head, _ = split_shell(text)
    tokens = shlex.split(head)
    command, used = _resolve(tokens)
    if isinstance(command, click.Group) or not any(not t.startswith("-") for t in tokens[used:]):
        return False
    try:
        with command.make_context(command.name, tokens[used:], resilient_parsing=False):
            pass
    except click.ClickException:
        return False
    positional = [p for p in command.params if isinstance(p, click.Argument)]
    return bool(positional)


# --- comparing what the doc shows with what ran ----------------------------------------------------------------

_RUN_ID = re.compile(r"\b\d{8}T\d{6}Z-(\S+?)-[0-9a-f]{4}\b")
_TIMESTAMP = re.compile(r"\d{8}T\d{6,12}Z")
_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?")
_PATH = re.compile(r"(?<![\w.:/])/[\w./?=&%*+@:~-]+")
# a ratio over nothing is inf in one run, 1.50 in another; a small p-value prints as 7.2e-05
_NUMBER = re.compile(r"[-+]?\d+(?:[.,]\d+)*(?:e[-+]?\d+)?|\b(?:inf|nan)\b")
_BORDERS = re.compile(r"[┏┓┗┛━─┡┩╇┳┻╋┼└┘┌┐├┤┬┴╭╮╰╯═╞╡╪]")


def skeleton(line: str) -> str:
    """A line with what differs between two runs of one command abstracted away."""
    line = _RUN_ID.sub(lambda m: f"<run:{_NUMBER.sub('#', m.group(1))}>", line)
    line = _TIMESTAMP.sub("<ts>", line)
    line = _DATETIME.sub("<time>", line)
    line = _PATH.sub("<path>", line)
    line = _NUMBER.sub("#", line)
    line = _BORDERS.sub(" ", line).replace("┃", "|").replace("│", "|")
    return " ".join(line.split()).strip(" |")


def _shown(command: Command, make_lines: tuple[str, ...]) -> list[str]:
    lines = []
    for line in command.shown or []:
        if line.strip() in ("...", "…") or line.strip() in make_lines or line.startswith("setup: "):
            continue
        lines.append(line)
    return lines


# A run that this machine's load left short of its samples (periods its measuring thread overran) has the status
# "short" where the doc, written on a quiet machine, shows "complete"; its line then says why (seen in a suite: a host
# timer run with 873 of 1000 samples beside the parallel phase's tests).
_LOAD_SHORT_REASON = "counted as overruns, not as samples"
_SHORT_STATUS = re.compile(r"^short(?= )|(?<=│ )short(?= +│)")  # a run's line, or its status cell in a table


# `rtvirt compare`'s tail test between two runs of one configuration is a measurement of this machine's load at
# the time: the doc's quiet runs were "within the runs' spread", a suite's loaded ones can be a "regression" (seen:
# 17 of 999 samples above the baseline's p99.9 against 1 of 1000). The verdict cell is read as either.
_TAIL_VERDICT = re.compile(r"(?<=│ )regression(?= +│$)")


def compare_output(command: Command, output: str, mode: str, ids: dict[str, str], make_lines: tuple[str, ...]) -> None:
    """Every line the doc shows appears in the output, in order; maps the run ids the doc shows to the real ones."""
    actual = output.split("\n")
    if _LOAD_SHORT_REASON in output:
        actual = [_SHORT_STATUS.sub("complete", line) for line in actual]
    if "tail test: " in output:
        actual = [_TAIL_VERDICT.sub("within the runs' spread", line.rstrip()) for line in actual]
    position = 0
    for shown in _shown(command, make_lines):
        want = shown.rstrip() if mode == "exact" else skeleton(shown)
        if not want:
            continue
        for index in range(position, len(actual)):
            have = actual[index].rstrip() if mode == "exact" else skeleton(actual[index])
            # a line may say more than the doc shows (`complete KEY: 255 of 1000 samples expected: ...` under load)
            if have == want or have.startswith(want) and not have[len(want)].isalnum():
                for doc_id, real_id in zip(_RUN_ID.finditer(shown), _RUN_ID.finditer(actual[index]), strict=False):
                    ids[doc_id.group(0)] = real_id.group(0)
                position = index + 1
                break
        else:
            raise AssertionError(f"{command.doc}:{command.line}: the doc shows\n    {shown}\n(as {want!r}) but "
                                 f"`{command.text}` printed no such line after line {position}:\n{output[-6000:]}")


# --- sessions: a case's scratch directory, environment and state ----------------------------------------------

def _makefile_run() -> tuple[str, tuple[str, ...]]:
    """`make run`'s rtvirt command and the lines make prints for it (the recipe echo)."""
    recipe = (ROOT / "Makefile").read_text().split("\nrun:", 1)[1].split("\n\n", 1)[0]
    line = [raw.strip() for raw in recipe.splitlines() if "rtvirt" in raw][-1]
    echoed = line.replace("$(VENV)", ".venv").replace("$(RESULTS)", "results")
    return echoed.replace(".venv/bin/rtvirt", "rtvirt"), (echoed,)


@dataclass
class Session:
    dir: Path
    memo: Memo
    store: Any = None  # tests/pg_server.PgServer, started when an example names a postgresql:// URL
    env: dict[str, str] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)
    store_url: str | None = None

    def __post_init__(self) -> None:
        self.env = {k: v for k, v in os.environ.items()
                    if k not in ("RTVIRT_RESULTS", "COLUMNS", "LINES", "FORCE_COLOR", "PYTEST_XDIST_WORKER")}
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        (self.dir / "examples").symlink_to(ROOT / "examples")
        for name, (_, text) in FILES.items():
            if (ROOT / name).exists():
                continue  # a file of the checkout (examples/...): checked equal in test_doc_files_equal_checkout
            (self.dir / name).parent.mkdir(parents=True, exist_ok=True)
            (self.dir / name).write_text(text)

    # placeholders and the store
    def _url(self, given: str) -> str:
        from pg_server import PASSWORD

        if self.store_url is None:
            self.store_url = self.store.url(data=self.dir / "lab")
            self.env["PGPASSWORD"] = PASSWORD
        return self.store_url

    def resolve(self, text: str) -> str:
        for doc_id, real_id in self.ids.items():
            text = text.replace(doc_id, real_id)
        text = re.sub(r"postgresql://[^\s'\"]+", lambda m: self._url(m.group(0)), text)
        return re.sub(r"(\S*?)runs/<([^>]+)>", lambda m: self._run_path(m.group(1), m.group(2)), text)

    def _run_path(self, prefix: str, words: str) -> str:
        runs = sorted((self.dir / prefix / "runs").glob("*/manifest.json"))
        assert runs, f"placeholder <{words}>: no runs in {prefix or '.'}runs/"
        wanted = [w for w in words.split() if w not in ("run", "run_id", "id")]
        if not wanted:
            return f"{prefix}runs/{runs[-1].parent.name}"
        for manifest in runs:
            label = json.loads(manifest.read_text()).get("config") or manifest.parent.name
            if all(word in label.split() or word in label for word in wanted):
                return f"{prefix}runs/{manifest.parent.name}"
        raise AssertionError(f"placeholder <{words}>: no run of {prefix}runs/ has a configuration with {wanted}")

    # running
    def shell(self, line: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(["bash", "-c", line], cwd=self.dir, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _stop(proc)
            raise AssertionError(f"`{line}` did not end within {timeout:.0f} s") from None
        except BaseException:  # the test was stopped (Ctrl-C, xdist): nothing of ours outlives it
            _stop(proc)
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")

    def run(self, command: Command, mode: str) -> None:
        text = command.text
        make_lines: tuple[str, ...] = ()
        if text.strip() == "make run":
            text, make_lines = _makefile_run()
        if text.startswith("rtvirt "):  # before its placeholders name runs of the results it may be given
            self._main_job_results(shlex.split(split_shell(text)[0]))
        text = self.resolve(text)
        if text.startswith("export "):
            name, _, value = text[7:].partition("=")
            value = (shlex.split(value, comments=True) or [""])[0]
            if name.strip() == "PGPASSWORD":
                from pg_server import PASSWORD

                value = PASSWORD
            self.env[name.strip()] = value
            return
        assert text.startswith("rtvirt "), f"{command.doc}:{command.line}: not an rtvirt command: {text!r}"
        if is_synopsis(text, self.env):
            check_reference(text)
            return
        head, rest = split_shell(text)
        rest = re.sub(r';\s*echo "exit \$\?"', "", rest)  # the doc's way of showing the status, compared below
        tokens = shrink([self._expand(token) for token in shlex.split(head)], self)
        if "--resume" in tokens:
            self.interrupt([t for t in tokens if t != "--resume"])
        line = f"{shlex.join(tokens)} {rest}".strip()
        result = self._memoized(tokens, line) if _memoizable(tokens, self.env) else self.shell(line)
        expected = 0 if command.exit is None else command.exit
        assert result.returncode == expected, (f"{command.doc}:{command.line}: `{line}` exited {result.returncode}, "
                                               f"the doc says {expected}:\n{result.stdout[-5000:]}")
        if command.shown and mode != "varies":
            compare_output(command, result.stdout, mode, self.ids, make_lines)

    def _memoized(self, tokens: list[str], line: str) -> subprocess.CompletedProcess[str]:
        """A built-in campaign: run once for the session (however a doc spells it: `rtvirt run` and `rtvirt run
        default --out results` are one campaign, and tests/test_studies.py's whole studies are the docs' command
        lines), its results copied into this case's --out."""
        out = _results_dir(tokens)
        names = [t for t in tokens[2:] if not t.startswith("-") and t not in _option_values(tokens)] or ["default"]
        ran = shared_campaign(self.memo, campaign_argv(names, _option(tokens, ("--scale",)),
                                                       _option(tokens, ("--repetitions",))))
        if ran.results.is_dir():
            shutil.copytree(ran.results, self.dir / out, dirs_exist_ok=True, symlinks=True)
        output = ran.output.replace("results/", f"{out.rstrip('/')}/")
        rest = line.removeprefix(shlex.join(tokens)).strip()
        if rest:  # a pipe or redirection the doc adds: applied to the campaign's output
            piped = subprocess.run(["bash", "-c", f"cat {rest}"], input=output, capture_output=True, text=True,
                                   cwd=self.dir, timeout=60)
            output = piped.stdout + piped.stderr
        return subprocess.CompletedProcess(line, ran.status, output)

    def _expand(self, token: str) -> str:
        """``$NAME`` / ``${NAME}`` of an earlier export, as bash would (the token is quoted again to run)."""
        return re.sub(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?",
                      lambda m: self.env.get(m.group(1), m.group(0)), token)

    def _main_job_results(self, tokens: list[str]) -> None:
        """A command that reads the results directory ``results`` no example of this case made reads the main
        job's (``make run``'s, README): the docs write `rtvirt sql ... --results results` for the reader's own."""
        if len(tokens) < 2 or tokens[1] not in READERS or "RTVIRT_RESULTS" in self.env:
            return
        given = _option(tokens, ("--results",))
        if given is None and tokens[1] in ("stats", "report"):
            given = next((t for t in tokens[2:] if not t.startswith("-")), None)
        if (given or "results").split("/")[0] != "results" or (self.dir / "results").exists():
            return
        main = shrink(shlex.split(_makefile_run()[0]), self)
        self._memoized(main, shlex.join(main))

    def interrupt(self, tokens: list[str]) -> None:
        """Run ``tokens`` and stop it with SIGINT once it has stored something, so that --resume has work left."""
        out = self.dir / _results_dir(tokens)
        before = set(out.glob("runs/*"))
        proc = subprocess.Popen(tokens, cwd=self.dir, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while proc.poll() is None and time.monotonic() < deadline:
                stored = [p for p in out.glob("runs/*") if p not in before]
                if any((p / "manifest.json").exists() or list(p.glob("records/*.parquet")) for p in stored):
                    break
                time.sleep(0.1)
            os.killpg(proc.pid, signal.SIGINT)
            out_text, _ = proc.communicate(timeout=120)
        except BaseException:
            _stop(proc)
            raise
        assert proc.returncode == 130, f"`{shlex.join(tokens)}` interrupted exited {proc.returncode}:\n{out_text}"


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM to the command's process group (rtvirt's clean-up: guests, labs, stressors), SIGKILL after 120 s."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


def _results_dir(tokens: list[str]) -> str:
    for option in ("--out", "--results"):
        if option in tokens:
            return tokens[tokens.index(option) + 1]
    return "results"


def _memoizable(tokens: list[str], env: dict[str, str]) -> bool:
    from rtvirt.scenario import builtin_scenarios

    if tokens[:2] != ["rtvirt", "run"] or "--resume" in tokens or "RTVIRT_RESULTS" in env:
        return False
    names = [t for t in tokens[2:] if not t.startswith("-") and t not in _option_values(tokens)]
    return all(name in builtin_scenarios() for name in names)


def _option_values(tokens: list[str]) -> set[str]:
    return {tokens[i + 1] for i, t in enumerate(tokens[:-1]) if t in ("--out", "--results", "--scale",
                                                                      "--repetitions")}


# --- shrinking ---------------------------------------------------------------------------------------------------

def _set_option(tokens: list[str], names: tuple[str, ...], value: str) -> list[str]:
    for index, token in enumerate(tokens):
        if token in names and index + 1 < len(tokens):
            return [*tokens[:index + 1], value, *tokens[index + 2:]]
        for name in names:
            if token.startswith(f"{name}=") and name.startswith("--"):
                return [*tokens[:index], f"{name}={value}", *tokens[index + 1:]]
    return [*tokens, names[0], value]


def _option(tokens: list[str], names: tuple[str, ...]) -> str | None:
    for index, token in enumerate(tokens):
        if token in names and index + 1 < len(tokens):
            return tokens[index + 1]
        for name in names:
            if token.startswith(f"{name}="):
                return token.split("=", 1)[1]
    return None


def shrink(tokens: list[str], session: Session) -> list[str]:
    """The documented command at the suite's scale (the module docstring's rules)."""
    from rtvirt.units import parse_duration

    sub = tokens[1] if len(tokens) > 1 else ""
    if sub in ("probe", "stress", "lab") and "--help" not in tokens and "--list" not in tokens:
        given = _option(tokens, ("-D", "--duration"))
        if given is None or parse_duration(given, "s") == 0 or parse_duration(given, "s") > \
                parse_duration(MAX_MEASURE, "s"):
            tokens = _set_option(tokens, ("-D", "--duration"), MAX_MEASURE)
    elif sub == "sim" and (given := _option(tokens, ("-D", "--duration"))) is not None and \
            parse_duration(given, "s") > parse_duration(MAX_SIMULATED, "s"):
        tokens = _set_option(tokens, ("-D", "--duration"), MAX_SIMULATED)
    elif sub == "run":
        tokens = _shrink_campaign(tokens, session)
    elif sub == "experiment" and "--list" not in tokens:
        tokens = _shrink_experiment(tokens, session)
    return tokens


def _shrink_campaign(tokens: list[str], session: Session) -> list[str]:
    from rtvirt.scenario import builtin_scenarios, load_scenario
    from rtvirt.scenario.matrix import expand

    if "--resume" in tokens:
        return tokens
    names = [t for t in tokens[2:] if not t.startswith("-") and t not in _option_values(tokens)] or ["default"]
    longest = 0
    for name in names:
        scenario = load_scenario(name if name in builtin_scenarios() else session.dir / name)[0]
        longest = max([longest, *(plan.duration_ns for plan in expand(scenario, 1.0))])
    if _option(tokens, ("--scale",)) is None:  # a scale the doc gives is a small one already: kept as shown
        tokens = _set_option(tokens, ("--scale",), f"{MAX_RUN_S * 1e9 / longest:.6g}")
    if all(name in builtin_scenarios() for name in names):
        tokens = _set_option(tokens, ("--repetitions",), "1")
    return tokens


def _shrink_experiment(tokens: list[str], session: Session) -> list[str]:
    from importlib import resources

    from rtvirt.units import parse_duration

    index = next(i for i, t in enumerate(tokens[2:], 2) if not t.startswith("-")
                 and tokens[i - 1] not in ("--results", "--workers", "--cluster", "--dask"))
    spec = tokens[index]
    builtin = resources.files("rtvirt.experiment").joinpath("builtin", f"{spec}.toml")
    path = session.dir / spec
    text = path.read_text() if path.exists() else builtin.read_text()
    data = tomllib.loads(text)
    grid = data.setdefault("grid", {})
    utilization = grid.get("utilization")
    if isinstance(utilization, dict):  # {from, to, step}: the values it stands for
        steps = round((utilization["to"] - utilization["from"]) / utilization["step"])
        utilization = [round(utilization["from"] + k * utilization["step"], 6) for k in range(steps + 1)]
    if isinstance(utilization, list) and len(utilization) > 3:
        grid["utilization"] = [utilization[0], utilization[len(utilization) // 2], utilization[-1]]
    samples = data.setdefault("samples", {})
    samples.pop("ci_width", None)
    samples["count"] = min(int(samples.get("count", EXPERIMENT_SYSTEMS)), EXPERIMENT_SYSTEMS)
    samples["chunk"] = min(int(samples.get("chunk", EXPERIMENT_SYSTEMS)), EXPERIMENT_SYSTEMS)
    questions = data.setdefault("questions", {})
    if "simulate" in questions and parse_duration(questions["simulate"], "s") > EXPERIMENT_SIMULATE_NS:
        questions["simulate"] = f"{EXPERIMENT_SIMULATE_NS}ns"
    shrunk = f"{spec}.shrunk.toml" if path.exists() else f"{spec}.toml"
    (session.dir / shrunk).write_text(tomli_w.dumps(data))
    return [*tokens[:index], shrunk, *tokens[index + 1:]]


# --- TOML and JSON examples -------------------------------------------------------------------------------------

def _merge(base: dict[str, Any], fragment: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in fragment.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def check_toml(block: Block, session: Session) -> None:
    text = "\n".join(block.lines) + "\n"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise AssertionError(f"{block.name}: not valid TOML ({exc})") from None
    name = block.markers.file or "example.toml"
    if {"vm", "hypervisor", "simulation"} & set(data) or block.markers.model:
        command = ["rtvirt", "analyze", name]
    elif {"grid", "samples", "questions"} & set(data):  # validated by rtvirt experiment's own loader, not run
        from rtvirt.experiment.spec import parse_experiment

        parse_experiment(data, block.name)
        return
    elif "targets" in data:
        from rtvirt.campaign.lab import load_inventory

        (session.dir / name).write_text(text)
        load_inventory(session.dir / name)
        return
    else:
        if "name" not in data or block.markers.base:  # a fragment of a scenario
            from rtvirt.scenario import builtin_scenarios

            base_name = block.markers.base
            base_text = builtin_scenarios()[base_name] if base_name in builtin_scenarios() else \
                FILES[base_name][1] if base_name else BASE_SCENARIO
            data = _merge(tomllib.loads(base_text), data)
            text, name = tomli_w.dumps(data), "fragment.toml"
        command = ["rtvirt", "scenarios", name]
    if not (session.dir / name).exists() or name in ("fragment.toml", "example.toml"):
        (session.dir / name).write_text(text)
    tokens = shrink(command, session)
    result = session.shell(shlex.join(tokens))
    assert result.returncode == 0, f"{block.name}: `{shlex.join(command)}` refused the example:\n{result.stdout}"


def _keys(document: Any) -> set[str]:
    if isinstance(document, dict):
        return set(document) | {f"{k}.{sub}" for k, v in document.items() for sub in _keys(v)}
    if isinstance(document, list) and document:
        return {f"[].{sub}" for sub in _keys(document[0])}
    return set()


def check_json(block: Block, session: Session) -> None:
    try:
        shown = json.loads("\n".join(block.lines))
    except json.JSONDecodeError as exc:
        raise AssertionError(f"{block.name}: not valid JSON ({exc})") from None
    if block.markers.output_of:
        command = block.markers.output_of
        result = session.shell(shlex.join(shrink(shlex.split(command), session)))
        assert result.returncode == 0, result.stdout
        missing = _keys(shown) - _keys(json.loads(result.stdout))
        assert not missing, f"{block.name}: `{command}` prints no {sorted(missing)}"


CASES = _cases()


# --- the tests ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_doc_example(case: Case, memo: Memo, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    if case.need is not None:
        for _, command in case.commands:
            if command.text.startswith("rtvirt "):
                check_reference(command.text)
        _, command = case.commands[0]
        pytest.skip(f"not run: {command.text!r} needs {case.need}: {NEEDS[case.need]}")
    session = Session(tmp_path, memo)
    if any("postgresql://" in c.text or "PGPASSWORD" in c.text for b in case.blocks for c in b.commands):
        session.store = request.getfixturevalue("pg_server")
    for block in case.blocks:
        if block.kind == "toml":
            check_toml(block, session)
        elif block.kind == "json":
            check_json(block, session)
        if block.markers.store in ("down", "up"):
            (session.store.pause if block.markers.store == "down" else session.store.resume)()
        for owner, command in case.commands:
            if owner is not block:
                continue
            if block.kind == "inline" and not (_runnable_inline(command.text) and not is_synopsis(command.text,
                                                                                                   session.env)):
                check_reference(command.text)
                continue
            session.run(command, block.markers.output_for(command.text))


def test_doc_files_equal_checkout() -> None:
    """A ``file`` marker naming a file of the checkout shows that file as it is."""
    for name, (block, text) in FILES.items():
        if (ROOT / name).exists():
            assert (ROOT / name).read_text() == text, f"{block.name}: the block differs from {name}"


def test_every_option_is_documented() -> None:
    """Every option of every command appears in README.md or docs/ (``--name`` somewhere in their text), but
    the hidden ones rtvirt passes to itself."""
    from rtvirt.cli import COMMANDS, app

    text = "\n".join(path.read_text() for path in DOCS)
    missing = []
    with click.Context(app) as ctx:
        for name in COMMANDS:
            command = app.get_command(ctx, name)
            assert command is not None
            subs = [(f"{name} {s}", command.get_command(ctx, s)) for s in command.list_commands(ctx)] \
                if isinstance(command, click.Group) else [(name, command)]
            for label, sub in subs:
                for param in sub.params if sub else ():
                    if getattr(param, "hidden", False):  # internal (run --serve's own child), not for users
                        continue
                    for option in (*param.opts, *param.secondary_opts):
                        if option.startswith("--") and option != "--help" and \
                                not re.search(rf"{re.escape(option)}(?![\w-])", text):
                            missing.append(f"rtvirt {label} {option}")
    assert not missing, "options no doc mentions:\n" + "\n".join(sorted(set(missing)))


def test_exceptions_are_few_and_explained() -> None:
    """Every example not run names a reason of NEEDS; the list is printed (and each is a skipped case)."""
    skipped = [case for case in CASES if case.need is not None]
    for case in skipped:
        print(f"not run: {case.name}: {case.commands[0][1].text!r}: {case.need}")
    assert {case.need for case in skipped} == set(NEEDS), "a reason no example needs any more: remove it"
    run = [case for case in CASES if case.need is None]
    assert len(skipped) < len(run) / 2, (len(skipped), len(run))
