"""docs/plugins/events.md's examples, from "Running the examples" to the end of the page, are one history
that a reader can paste: this test pastes it.

The page's ``sh`` and ``console`` blocks are run in order, in one ``bash`` (variables carry from one
command to the next, as in the reader's terminal), in a scratch directory: the page creates the
database, writes the configuration, migrates, starts ``main`` and ``worker1`` as real processes and
runs every ``curl``, ``jq`` and ``psql`` command it shows. The only changes to the commands: the
ports 8008, 8009 and 9092 become free ones, the database server is the tests' and the database a
new one. An ``sh`` block must print nothing; each ``$ `` command of a ``console`` block must print
the lines shown under it, where

* ``…`` stands for any run of characters within a line (timestamps, ages, hashes of local events);
* an event ID of 43 characters (``$`` and URL-safe base64) or a room ID ``!…:example.org`` the page
  shows stands for whatever ID the run produced there, the same one everywhere the page repeats it
  (two different IDs of the page are two different IDs of the run), unless the page's commands write
  it themselves (the remote events' IDs, their reference hashes): those must be as shown.

Anything else that differs fails the test with the line of the page. A block preceded by
``<!-- events-doc: not run -->`` is an illustration outside the history (the page says why).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from factstream.testing import drop_database
from factstream.testing.helpers import free_port

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]
DOC_PATH = ROOT / "docs" / "plugins" / "events.md"
START = "### Running the examples"
NOT_RUN = "<!-- events-doc: not run -->"
#: The page's database server and database; the test's replace them.
DOC_SERVER = "postgresql://postgres@127.0.0.1:5432"
DOC_DATABASE = "factstream_events_docs"
DOC_PORTS = ("8008", "8009", "9092")
#: The longest one command may take (a long poll of /sync waits for a write; start-ups wait for health).
COMMAND_TIMEOUT = 60.0

FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
EVENT_ID = re.compile(r"\$[A-Za-z0-9_-]{43}")
ROOM_ID = re.compile(r"![A-Za-z0-9_-]{24}:example\.org")
PLACEHOLDER = re.compile(f"{EVENT_ID.pattern}|{ROOM_ID.pattern}|…")


@dataclass(frozen=True)
class Command:
    """One command of the page: its text, the output it shows, and the line of the page it starts on."""

    line: int
    text: str
    expected: str


def commands(doc: str) -> list[Command]:
    """The page's commands in order, from "Running the examples" on: each ``sh`` block as one command
    that prints nothing, each ``$ `` line of a ``console`` block (with its ``\\`` continuations) with
    the lines under it."""
    start = doc.index(START)
    found: list[Command] = []
    for match in FENCE.finditer(doc, start):
        if match["lang"] not in ("sh", "console"):
            continue
        if doc[: match.start()].rstrip("\n").endswith(NOT_RUN):
            continue
        first = doc.count("\n", 0, match.start("body")) + 1
        body = match["body"]
        if match["lang"] == "sh":
            found.append(Command(first, body, ""))
            continue
        found.extend(console_commands(body.splitlines(), first))
    return found


def console_commands(lines: list[str], first: int) -> list[Command]:
    """The commands of one ``console`` block whose first line is line ``first`` of the page."""
    found: list[Command] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise AssertionError(f"docs/plugins/events.md:{first + i}: output with no command before it: {lines[i]!r}")
        start = i
        text = [lines[i][2:]]
        while text[-1].endswith("\\"):
            i += 1
            text.append(lines[i])
        i += 1
        output: list[str] = []
        while i < len(lines) and not lines[i].startswith("$ "):
            output.append(lines[i])
            i += 1
        found.append(Command(first + start, "\n".join(text), "\n".join(output)))
    return found


class Shell:
    """One ``bash`` the commands are pasted into, one at a time; its output read up to a marker."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.cwd = cwd
        self.marker = f"--- end of command {uuid.uuid4().hex} ---"
        self.proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def run(self, text: str) -> str:
        """What ``text`` printed (stdout and stderr), as the reader's terminal shows it."""
        script = self.cwd / ".command.sh"
        script.write_text(text + "\n")
        assert self.proc.stdin is not None
        # Sourced with stdin from /dev/null: a command that reads stdin must not eat the next ones.
        # The marker's printf keeps the command's exit status for the next command's ``$?``.
        self.proc.stdin.write(
            f"{{ . {script}; }} < /dev/null\nstatus=$?; printf '\\n%s\\n' '{self.marker}'; (exit $status)\n"
        )
        self.proc.stdin.flush()
        out: list[str] = []
        while True:
            try:
                line = self.lines.get(timeout=COMMAND_TIMEOUT)
            except queue.Empty:
                raise AssertionError(f"no end after {COMMAND_TIMEOUT} s; printed so far: {''.join(out)}") from None
            if line is None:
                raise AssertionError(f"bash exited; printed: {''.join(out)}")
            if line.rstrip("\n") == self.marker:
                break
            out.append(line)
        # Less the newline the marker's printf put before it; trailing spaces (psql pads its columns) are
        # invisible in a terminal and kept out of the page.
        return "\n".join(line.rstrip() for line in "".join(out)[:-1].split("\n"))

    def close(self) -> None:
        """Stop bash and everything the page started in the background (its process group)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, 15)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            self.proc.wait()


class Placeholders:
    """The IDs of the page bound to the IDs of the run (both ways: a bijection)."""

    def __init__(self) -> None:
        self.bound: dict[str, str] = {}

    def pattern(self, expected: str) -> tuple[re.Pattern[str], dict[str, str]]:
        parts: list[str] = []
        groups: dict[str, str] = {}
        position = 0
        for match in PLACEHOLDER.finditer(expected):
            parts.append(re.escape(expected[position : match.start()]))
            token = match.group()
            if token == "…":
                parts.append(".*?")
            elif token in self.bound:
                parts.append(re.escape(self.bound[token]))
            elif token in groups.values():
                name = next(g for g, t in groups.items() if t == token)
                parts.append(f"(?P={name})")
            else:
                name = f"id{len(groups)}"
                groups[name] = token
                shape = EVENT_ID.pattern if token.startswith("$") else ROOM_ID.pattern
                parts.append(f"(?P<{name}>{shape})")
            position = match.end()
        parts.append(re.escape(expected[position:]))
        return re.compile("".join(parts)), groups

    def match(self, expected: str, actual: str) -> str | None:
        """None when ``actual`` is ``expected`` with its placeholders filled (binding new IDs), else why not."""
        pattern, groups = self.pattern(expected)
        found = pattern.fullmatch(actual)
        if found is None:
            return "the output differs"
        taken = {value: key for key, value in self.bound.items()}
        for name, token in groups.items():
            value = found[name]
            if value in taken:
                return f"{token} of the page is {value}, which the page calls {taken[value]} before"
            self.bound[token] = value
            taken[value] = token
        return None


def rewrite(text: str, server: str, database: str, ports: dict[str, str]) -> str:
    text = text.replace(DOC_SERVER, server).replace(DOC_DATABASE, database)
    return re.sub(r"\b(?:8008|8009|9092)\b", lambda m: ports[m.group()], text)


# -- the parsing and matching themselves -------------------------------------------------------------------


def test_the_page_has_its_history_to_run() -> None:
    found = commands(DOC_PATH.read_text(encoding="utf-8"))
    assert len(found) > 100
    texts = [command.text for command in found]
    assert any("CREATE DATABASE" in text for text in texts)
    assert any("FACTSTREAM_INSTANCE_NAME=worker1" in text for text in texts)


def test_placeholders_bind_the_same_id_everywhere() -> None:
    room, event, other = "!" + "a" * 24 + ":example.org", "$" + "b" * 43, "$" + "c" * 43
    run_room, run_event, run_other = "!" + "x" * 24 + ":example.org", "$" + "y" * 43, "$" + "z" * 43
    ids = Placeholders()
    page = f'{{"room_id":"{room}","event_id":"{event}","age":…}}'
    assert ids.match(page, f'{{"room_id":"{run_room}","event_id":"{run_event}","age":12}}') is None
    assert ids.match(f'["{event}","{event}"]', f'["{run_event}","{run_event}"]') is None
    assert ids.match(f'["{event}"]', f'["{run_other}"]') is not None  # bound to run_event already
    assert ids.match(f'["{other}"]', f'["{run_event}"]') is not None  # run_event is the page's `event`
    assert ids.match(f'["{other}","{other}"]', f'["{run_other}","{run_event}"]') is not None
    assert ids.match('{"next":"s26"}', '{"next":"s27"}') is not None
    assert ids.match('{"age":…}', '{"age":1\n2}') is not None  # … stays within a line


# -- the history ---------------------------------------------------------------------------------------------


@pytest.fixture
def scratch_database(factstream_server_url: str) -> Iterator[tuple[str, str]]:
    """The tests' server (the page's ``postgresql://postgres@127.0.0.1:5432``) and a database name
    nobody uses, which the page creates and this fixture drops."""
    server = factstream_server_url.rsplit("/", 1)[0]
    name = f"fs_test_evdoc_{uuid.uuid4().hex[:12]}"
    yield server, name
    drop_database(f"{server}/{name}")


def test_the_examples_run_as_one_history(tmp_path: Path, scratch_database: tuple[str, str]) -> None:
    missing = [tool for tool in ("bash", "curl", "jq", "psql") if shutil.which(tool) is None]
    if missing:
        message = f"the page's commands need {', '.join(missing)}, not on PATH"
        if os.environ.get("FACTSTREAM_REQUIRE_SERVICES", "").lower() in {"1", "true", "yes"}:
            pytest.fail(message)
        pytest.skip(message)
    server, database = scratch_database
    ports = {port: str(free_port()) for port in DOC_PORTS}
    env = dict(os.environ, NO_COLOR="1", COLUMNS="200", PYTHONUNBUFFERED="1")
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    for key in [k for k in env if k.startswith("FACTSTREAM_") and not k.startswith("FACTSTREAM_TEST_")]:
        del env[key]
    shell = Shell(tmp_path, env)
    history = commands(DOC_PATH.read_text(encoding="utf-8"))
    ids = Placeholders()
    for command in history:  # an ID the page's commands write (a remote event's) is no placeholder
        ids.bound.update((token, token) for token in EVENT_ID.findall(command.text))
    try:
        for command in history:
            actual = shell.run(rewrite(command.text, server, database, ports)).rstrip("\n")
            expected = rewrite(command.expected, server, database, ports).rstrip("\n")
            problem = ids.match(expected, actual)
            assert problem is None, (
                f"docs/plugins/events.md:{command.line}: {problem}\n$ {command.text}\n"
                f"--- the page shows ---\n{expected}\n--- the run printed ---\n{actual}\n"
                + "".join(f"--- {log.name} ---\n{log.read_text()[-3000:]}\n" for log in sorted(tmp_path.glob("*.log")))
            )
    finally:
        shell.close()
