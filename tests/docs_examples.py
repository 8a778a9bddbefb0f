"""What tests/test_docs_examples.py runs: the examples of README.md and docs/*.md, found by the rules its docstring
(and docs/output.md, "Examples in the docs are tests") states. This module reads the Markdown and the markers; it runs
nothing."""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from shared_runs import Memo, session_memo

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# What an example may need that this suite does not bring up for it, each with why (the markers' `needs KEY`).
# Keep it short: whatever a fixture of the suite can give (PostgreSQL, a results directory, a scratch file) is run.
NEEDS = {
    "xen-lab": "boots the Xen lab (minutes under TCG, and the lab campaign of tests/test_env_xen.py is the suite's "
               "one boot, in the quiet phase)",
    "arm-labs": "boots the ARM labs (an emulated Arm board under TCG: minutes; tests/test_arm_labs.py runs the "
                "study's subset on both once)",
    "libvirtd": "needs libvirtd, which the suite starts only in the quiet phase (tests/test_env_libvirt.py: "
                "machine-wide lock)",
    "ssh-target": "names a machine of the reader's lab (tests/test_env_ssh.py runs the same commands on a local sshd)",
    "labgrid": "needs a labgrid coordinator and place of the reader's lab (tests/test_target_labgrid.py)",
    "host-tuning": "tunes this machine (host tune/restore, [host] tune): tests/test_host_tuned.py does it in the "
                   "quiet phase",
    "dask-cluster": "needs an existing Dask cluster at the reader's address (tests/test_experiment_dask.py starts one)",
    "benchmark": "a figure of a benchmark's own store or files (benchmarks/), not an example to run",
}


@dataclass
class Markers:
    """What the ``<!-- docs-test: ... -->`` lines just above a block or paragraph say about it."""

    file: str | None = None  # save this TOML/JSON block as FILE in the scratch directory of the doc's examples
    base: str | None = None  # a TOML fragment: merged into this scenario (a built-in or a `file` of this doc)
    needs: list[tuple[str, str | None]] = field(default_factory=list)  # (key of NEEDS, only lines containing)
    output: str = "lines"  # lines: shown lines (numbers, ids, paths abstracted) appear in order; exact
    varies: list[tuple[str | None, str]] = field(default_factory=list)  # (only lines containing, why) not compared
    output_of: str | None = None  # a JSON block: its keys are those of this command's output
    apart: bool = False  # the block's command lines are independent cases
    continues: bool = False  # this block continues the previous block's case (same scratch directory, state)
    model: bool = False  # a TOML fragment of a model (docs/model.md), not of a scenario
    store: str | None = None  # down | up: the case's PostgreSQL server stops / starts before this block

    def output_for(self, line: str) -> str:
        """How the output of the command ``line`` is compared: lines, exact or varies."""
        return "varies" if any(text is None or text in line for text, _ in self.varies) else self.output

    def need_for(self, line: str) -> str | None:
        for key, text in self.needs:
            if text is None or text in line:
                return key
        return None


_MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")


def parse_markers(text: str, where: str) -> Markers:
    markers = Markers()
    for directive in (part.strip() for part in text.split(";")):
        if not directive:
            continue
        words = directive.split(None, 1)
        rest = words[1] if len(words) > 1 else ""
        if words[0] == "file":
            markers.file = rest
        elif words[0] == "fragment" and rest.startswith("of "):
            markers.base = rest[3:].strip()
        elif directive == "model fragment":
            markers.model = True
        elif words[0] == "needs":
            key, _, only = rest.partition(" on ")
            if key.strip() not in NEEDS:
                raise ValueError(f"{where}: needs {key.strip()!r} is not in NEEDS (tests/docs_examples.py)")
            markers.needs.append((key.strip(), only.strip().strip('"') or None))
        elif directive == "output exact":
            markers.output = "exact"
        elif words[0] == "output" and rest.startswith("varies"):
            scope, _, reason = rest.removeprefix("varies").partition(":")
            only = scope.strip().removeprefix("on").strip().strip('"') or None
            if not reason.strip():
                raise ValueError(f"{where}: output varies needs a reason after ':'")
            markers.varies.append((only, reason.strip()))
        elif words[0] == "output" and rest.startswith("of "):
            markers.output_of = rest[3:].strip().strip('"')
        elif directive == "lines apart":
            markers.apart = True
        elif directive == "continues":
            markers.continues = True
        elif words[0] == "store" and rest in ("down", "up"):
            markers.store = rest
        else:
            raise ValueError(f"{where}: unknown docs-test directive {directive!r}")
    return markers


@dataclass
class Command:
    """One command line of an example: ``text`` as shown (continuation lines joined, the prompt dropped), the
    output the doc shows after it (transcripts only) and the exit status its comment or output states."""

    doc: str
    line: int
    text: str
    shown: list[str] | None = None
    exit: int | None = None


@dataclass
class Block:
    """A unit of examples: one fenced block, or the inline command spans of one paragraph."""

    doc: str
    line: int
    kind: str  # commands | inline | toml | json | other
    lines: list[str]
    markers: Markers
    commands: list[Command] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


_COMMAND_LANGS = ("", "sh", "shell", "console", "bash")
_INLINE = re.compile(r"`(rtvirt [^`]+)`")
_EXIT_COMMENT = re.compile(r"\(exit (\d+)")
_EXIT_SHOWN = re.compile(r"^\(?exit(?: status)? (\d+)\)?$")


def parse_doc(path: Path) -> list[Block]:
    """Every fenced block and every paragraph with inline ``rtvirt`` spans of ``path``, in order."""
    doc = str(path.relative_to(ROOT))
    lines = path.read_text().split("\n")
    blocks: list[Block] = []
    pending = ""
    index = 0
    paragraph: list[tuple[int, str]] = []

    def flush_paragraph() -> None:
        nonlocal pending
        spans = [(number, span) for number, text in paragraph for span in _INLINE.findall(text)]
        if spans:
            block = Block(doc, spans[0][0], "inline", [span for _, span in spans],
                          parse_markers(pending, f"{doc}:{spans[0][0]}"))
            block.commands = [Command(doc, number, span.replace("\\|", "|")) for number, span in spans]
            blocks.append(block)
            pending = ""
        paragraph.clear()

    while index < len(lines):
        text = lines[index]
        if text.strip().startswith("<!-- docs-test:"):  # a marker may go on over lines, up to its -->
            while not text.rstrip().endswith("-->") and index + 1 < len(lines):
                index += 1
                text = f"{text} {lines[index].strip()}"
        marker = _MARKER.match(text.strip())
        if marker:
            flush_paragraph()
            pending = f"{pending};{marker.group(1)}" if pending else marker.group(1)
        elif text.startswith("```"):
            flush_paragraph()
            lang, start, body = text[3:].strip(), index + 1, []
            index += 1
            while index < len(lines) and not lines[index].startswith("```"):
                body.append(lines[index])
                index += 1
            kind = "toml" if lang == "toml" else "json" if lang == "json" else \
                "commands" if lang in _COMMAND_LANGS else "other"
            block = Block(doc, start, kind, body, parse_markers(pending, f"{doc}:{start}"))
            if kind == "commands":
                block.commands = commands_of(doc, start + 1, body)
            blocks.append(block)
            pending = ""
        elif not text.strip() or text.startswith("#"):
            flush_paragraph()
        else:
            paragraph.append((index + 1, text))
        index += 1
    flush_paragraph()
    return blocks


def _joined(body: list[str], start: int) -> tuple[str, int]:
    """The command starting at body[start], with the lines a quote left open joined to it."""
    text, end = body[start], start
    while end + 1 < len(body):
        try:
            shlex.split(text, comments=True)
            break
        except ValueError:  # an open quote: the statement goes on
            end += 1
            text = f"{text}\n{body[end]}"
    return text, end


def commands_of(doc: str, first_line: int, body: list[str]) -> list[Command]:
    """The commands of a fenced block. With ``$ `` prompts it is a transcript: each prompt's command and the lines
    up to the next prompt (its output); without, every line starting with ``rtvirt `` (or ``export ``, which sets
    the environment of the commands after it) is a command."""
    transcript = any(line.startswith("$ ") for line in body)
    found: list[Command] = []
    index = 0
    while index < len(body):
        line = body[index]
        if transcript and line.startswith("$ "):
            text, end = _joined([line[2:], *body[index + 1:]], 0)
            command = Command(doc, first_line + index, text, shown=[])
            index += end + 1
            while index < len(body) and not body[index].startswith("$ "):
                command.shown.append(body[index])  # type: ignore[union-attr]
                index += 1
            _exit_from_output(command)
            found.append(command)
            continue
        if not transcript and line.startswith(("rtvirt ", "export ")):
            text, end = _joined(body, index)
            command = Command(doc, first_line + index, text)
            comment = _EXIT_COMMENT.search(text.partition("#")[2]) if "#" in text else None
            command.exit = int(comment.group(1)) if comment else None
            found.append(command)
            index = end
        index += 1
    return found


def _exit_from_output(command: Command) -> None:
    """A transcript's ``exit N`` / ``(exit status N)`` line is the status, not output."""
    assert command.shown is not None
    kept = []
    for line in command.shown:
        match = _EXIT_SHOWN.match(line.strip())
        if match:
            command.exit = int(match.group(1))
        else:
            kept.append(line)
    command.shown = kept


# --- commands: references (synopses) and examples to run -------------------------------------------------------

_METAVAR = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:\.[a-z]+)?|[A-Z]+=\S*|\S*=V1\S*)$")
SHELL_OPERATORS = ("|", "||", "&&", ";", ">", ">>", "2>", "2>&1", "&")


def split_shell(text: str) -> tuple[str, str]:
    """``text`` cut at its first unquoted shell operator or comment: (the rtvirt command, the rest). A ``|``
    between two words (``timer|gap``) is a synopsis' alternative and ``<...>`` a placeholder, not operators."""
    quote, placeholder = None, False
    for position, char in enumerate(text):
        before = text[position - 1] if position else " "
        after = text[position + 1] if position + 1 < len(text) else " "
        if quote:
            if char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "<" and not before.isspace() or char == "<" and after.isalpha():
            placeholder = True
        elif char == ">" and placeholder:
            placeholder = False
        elif char == "|" and not before.isspace() and not after.isspace():
            continue
        elif char in "|;&>#" or (char == "2" and text[position:position + 2] == "2>" and before.isspace()):
            return text[:position].rstrip(), text[position:]
    return text.rstrip(), ""


def is_synopsis(command: str, env: dict[str, str]) -> bool:
    """A reference rather than an example: metavariables (RUN, FILE.toml, KEY=V1,...), alternatives (a|b),
    optional parts ([--json]), an ellipsis or an unset shell variable."""
    head, _ = split_shell(command)
    try:
        tokens = shlex.split(head)
    except ValueError:
        return True
    if any(token in ("...", "…") or "..." in token or "…" in token for token in tokens):
        return True
    for token in tokens[1:]:
        if " " in token:  # a quoted argument (an SQL statement, a requirement class): taken as it is
            continue
        if token.startswith("[") or token.endswith("]") or _METAVAR.match(token):
            return True
        if "|" in token and token not in SHELL_OPERATORS:
            return True
        for variable in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", token):
            if variable not in env:
                return True
    return False


def all_blocks() -> list[Block]:
    return [block for path in DOCS for block in parse_doc(path)]


# --- fixtures (here, not in the test module: tests/conftest.py puts the users of a test module's session fixture
# on one xdist worker, and these cases should spread) ------------------------------------------------------------

@pytest.fixture(scope="session", name="memo")
def memo_fixture(tmp_path_factory: pytest.TempPathFactory) -> Memo:
    return session_memo(tmp_path_factory)


@pytest.fixture(scope="session", name="pg_server")
def pg_server_fixture() -> Iterator[Any]:
    """One PostgreSQL server per worker, started when a case names a postgresql:// URL (tests/pg_server.py)."""
    from pg_server import PgServer

    server = PgServer().start()
    try:
        yield server
    finally:
        server.stop()
