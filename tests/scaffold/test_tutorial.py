"""docs/tutorial.md, run for real: every command of its ``console`` blocks, compared with the output shown.

The blocks are read in order. A line starting with ``$ `` is a command (a heredoc continues up to its
terminator line, a trailing backslash onto the next line); the lines after it, up to the next command,
are its expected output, stdout and stderr merged. A line that is only ``...`` matches any number of
lines.

All commands run in one ``bash`` process, so ``cd``, background jobs, ``$!`` and heredocs work as in a
terminal. It starts in an empty directory (shown as ``/home/you``), in the environment a reader has after
the README's ``./dev`` and ``. .venv/bin/activate`` (factstream, the bundled plugins and the dev tools,
from this checkout; made by ``./dev bootstrap`` with ``UV_PROJECT_ENVIRONMENT`` naming a new directory).
The commands use a fresh database of the test server through ``FACTSTREAM_DATABASE__URL`` instead of the
embedded PostgreSQL; the generated plugin's own tests get the server through
``FACTSTREAM_TEST_DATABASE_URL``, and a pytest temporary root of their own (``PYTEST_DEBUG_TEMPROOT``).
The tutorial's ports (8008, 8009, 9092) are replaced by free ones in the commands and the expected
output. Whatever the commands leave running is killed at the end (bash and its jobs share a process
group).

Before comparing, both sides are normalised: the temporary directory becomes ``/home/you``; alembic
revision IDs, dates, times, durations and the typing stream's position in a sync token (its
writer's clock in microseconds) become placeholders; runs of spaces and of table rules
collapse to one (a table's width follows the length of the paths in it).

To see what the commands print now (to update the tutorial), run the test with
``FACTSTREAM_TUTORIAL_PRINT=1`` and ``-s``: it prints each command with its actual output, ports mapped
back to the tutorial's, and compares nothing.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from factstream.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial.md"
PORTS = (8008, 8009, 9092)
SHOWN_HOME = "/home/you"
MARKER = "@@factstream-tutorial-step-{}@@"
WILDCARD = "..."
PRINT_ENV = "FACTSTREAM_TUTORIAL_PRINT"
#: FACTSTREAM_* variables kept from the test's environment: where the plugin's own tests find services.
KEPT_FACTSTREAM_VARIABLES = {"FACTSTREAM_TEST_REDIS_URL", "FACTSTREAM_REQUIRE_SERVICES"}


@dataclass(frozen=True)
class Step:
    command: str
    expected: list[str]
    line: int  # in docs/tutorial.md, for the failure message


# -- reading the tutorial ----------------------------------------------------------------------------


def console_blocks(text: str) -> list[tuple[int, list[str]]]:
    """The ``console`` fenced blocks: (line number of the first content line, lines)."""
    blocks: list[tuple[int, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```console":
            start = i + 1
            end = start
            while end < len(lines) and lines[end].strip() != "```":
                end += 1
            blocks.append((start + 1, lines[start:end]))
            i = end
        i += 1
    return blocks


def parse_steps(text: str) -> list[Step]:
    steps: list[Step] = []
    for first_line, lines in console_blocks(text):
        i = 0
        if lines and not lines[0].startswith("$ "):
            raise AssertionError(f"docs/tutorial.md:{first_line}: a console block must start with a '$ ' line")
        while i < len(lines):
            number = first_line + i
            command_lines = [lines[i][2:]]
            i += 1
            heredoc = re.search(r"<<-?\s*(['\"]?)([A-Za-z_]\w*)\1", command_lines[0])
            if heredoc:
                while i < len(lines) and lines[i] != heredoc.group(2):
                    command_lines.append(lines[i])
                    i += 1
                if i == len(lines):
                    raise AssertionError(f"docs/tutorial.md:{number}: heredoc {heredoc.group(2)} is not terminated")
                command_lines.append(lines[i])
                i += 1
            else:
                while command_lines[-1].endswith("\\") and i < len(lines):
                    command_lines.append(lines[i].removeprefix("> "))
                    i += 1
            expected: list[str] = []
            while i < len(lines) and not lines[i].startswith("$ "):
                expected.append(lines[i])
                i += 1
            while expected and not expected[-1].strip():
                expected.pop()
            steps.append(Step("\n".join(command_lines), expected, number))
    return steps


# -- comparing ---------------------------------------------------------------------------------------

_NORMALISE = [
    (re.compile(r"(?<![0-9a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{12}(?![0-9a-f])"), "<revision>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(:\d{2}(\.\d+)?)?([+-]\d{2}:?\d{2}|Z)?"), "<datetime>"),
    (re.compile(r"\d{2}/\d{2}/\d{2} \d{2}:\d{2}:\d{2}"), "<datetime>"),
    # pytest adds "(0:01:07)" to a duration past a minute (a loaded machine): a duration too.
    (re.compile(r"(\ds) \(\d+:\d{2}:\d{2}\)"), r"\1"),
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(\.\d+)?\b"), "<time>"),
    (re.compile(r"\b\d+(\.\d+)? ?(ms|s)\b"), "<duration>"),
    (re.compile(r"│ *\d+\.\d+ *│"), "│ <seconds> │"),  # the seconds column of factstream export
    # a kept stream's position in a sync token (typing's): counted from its writer's clock in microseconds
    (re.compile(r"(?<=_)\d{16}(?=_)"), "<kept position>"),
    (re.compile(r"([─━])\1+"), r"\1"),
    (re.compile(r" {2,}"), " "),
]


def normalise(line: str) -> str:
    for pattern, replacement in _NORMALISE:
        line = pattern.sub(replacement, line)
    return line.strip()


#: ``factstream migrate``'s first line on the test's database; the tutorial shows the reader's, the embedded
#: PostgreSQL under the plugin's directory, where they run it (the test replaces only the database).
_TEST_DATABASE_LINE = re.compile(r"^migrating database \S+ on \S+ as \S+$")
_READERS_DATABASE_LINE = f"migrating the embedded PostgreSQL under {SHOWN_HOME}/factstream-likes/.factstream/postgres"


def upgrades_sorted(lines: list[str]) -> list[str]:
    """``lines`` with each run of alembic's ``Running upgrade`` lines sorted: alembic applies independent
    branches (the core's later revisions, each plugin's first) in no fixed order, and the tutorial does not
    promise one."""
    result: list[str] = []
    run: list[str] = []
    for line in [*lines, ""]:
        if line.startswith("Running upgrade "):
            run.append(line)
            continue
        result.extend(sorted(run))
        run = []
        result.append(line)
    return result[:-1]


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether ``actual`` matches ``expected`` line by line, a ``...`` line matching any number of lines."""
    expected = upgrades_sorted([normalise(line) for line in expected])
    actual = upgrades_sorted(
        [_READERS_DATABASE_LINE if _TEST_DATABASE_LINE.match(normalise(line)) else normalise(line) for line in actual]
    )
    pattern = "".join(r"(?:[^\n]*\n)*?" if line == WILDCARD else re.escape(line) + r"\n" for line in expected)
    text = "".join(line + "\n" for line in actual)
    return re.fullmatch(pattern, text) is not None


# -- running -----------------------------------------------------------------------------------------


def tool(name: str, env_var: str | None = None) -> str:
    found = (os.environ.get(env_var) if env_var else None) or shutil.which(name)
    if found is None:
        if os.environ.get("FACTSTREAM_REQUIRE_SERVICES", "").lower() in {"1", "true", "yes"}:
            pytest.fail(f"{name} is needed to run docs/tutorial.md and is not on PATH")
        pytest.skip(f"{name} is not installed")
    return found


def distinct_free_ports(count: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports and port not in PORTS:
            ports.append(port)
    return ports


def replace_ports(text: str, mapping: dict[int, int]) -> str:
    return re.sub(r"\b\d{4,5}\b", lambda m: str(mapping.get(int(m.group()), m.group())), text)


def build_script(steps: list[Step]) -> str:
    parts = []
    for n, step in enumerate(steps):
        parts.append(f"printf '\\n%s\\n' '{MARKER.format(n)}'\n{step.command}\n")
    parts.append(f"printf '\\n%s\\n' '{MARKER.format(len(steps))}'\n")
    return "".join(parts)


def split_output(output: str, count: int) -> list[list[str] | None]:
    """Each step's output lines, ``None`` for a step that never started."""
    results: list[list[str] | None] = []
    for n in range(count):
        start = output.find(f"\n{MARKER.format(n)}\n")
        if start < 0:
            results.append(None)
            continue
        start += len(MARKER.format(n)) + 2
        end = output.find(f"\n{MARKER.format(n + 1)}\n", start)
        chunk = output[start : end if end >= 0 else len(output)].rstrip("\n")
        results.append(chunk.split("\n") if chunk else [])
    return results


def stop_group(process: subprocess.Popen[str]) -> None:
    """End bash and everything it started (its background jobs share its process group)."""
    for sig, pause in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 0.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + pause
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)


def shown(lines: list[str]) -> str:
    return "\n".join(f"    {line}" for line in lines) if lines else "    (nothing)"


@pytest.mark.slow
def test_the_tutorial_does_what_it_shows(tmp_path, factstream_server_url, fresh_database):
    uv = tool("uv", "UV")
    tool("curl")
    tool("jq")
    steps = parse_steps(TUTORIAL.read_text(encoding="utf-8"))
    assert steps, "docs/tutorial.md has no console blocks"
    mapping = dict(zip(PORTS, distinct_free_ports(len(PORTS)), strict=True))
    back = {v: k for k, v in mapping.items()}

    venv = tmp_path / "venv"
    home = tmp_path / "home"
    home.mkdir()
    pytest_temp = tmp_path / "pytest-temp"
    pytest_temp.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FACTSTREAM_", "VIRTUAL_ENV", "UV_PROJECT", "UV_PYTHON", "PYTHON", "PYTEST_", "CONDA"))
        or k in KEPT_FACTSTREAM_VARIABLES
    }
    env.update(
        VIRTUAL_ENV=str(venv),
        PATH=os.pathsep.join([str(venv / "bin"), str(Path(uv).parent), env.get("PATH", "")]),
        COLUMNS="250",
        NO_COLOR="1",
        LC_ALL="C.UTF-8",
        FACTSTREAM_DATABASE__URL=fresh_database,
        FACTSTREAM_TEST_DATABASE_URL=factstream_server_url,
        # The plugin's own pytest run gets a temporary root of its own: pytest makes its
        # /tmp/pytest-of-<user> private (0700), which cuts off an embedded server of this session that
        # runs as another user (as it does under root) and keeps its data there.
        PYTEST_DEBUG_TEMPROOT=str(pytest_temp),
    )
    # The reader's environment: what the README's ./dev makes (here `./dev bootstrap` into a new
    # environment instead of the checkout's .venv), activated.
    bootstrap = [str(ROOT / "dev"), "bootstrap"]
    done = subprocess.run(
        bootstrap,
        cwd=tmp_path,
        env={**env, "UV_PROJECT_ENVIRONMENT": str(venv)},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, f"./dev bootstrap failed:\n{done.stdout}{done.stderr}"

    script = tmp_path / "tutorial.sh"
    script.write_text(build_script([Step(replace_ports(s.command, mapping), s.expected, s.line) for s in steps]))
    process = subprocess.Popen(
        ["bash", str(script)],
        cwd=home,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        encoding="utf-8",
        errors="replace",
        start_new_session=True,
    )
    try:
        try:
            output, _ = process.communicate(timeout=900)
        except subprocess.TimeoutExpired:
            stop_group(process)
            output, _ = process.communicate()
            output += "\n(the tutorial's commands did not finish within 900 s)"
    finally:
        stop_group(process)

    output = "\n" + output
    for path in {str(home), str(home.resolve())}:
        output = output.replace(path, SHOWN_HOME)
    actual = split_output(output, len(steps))

    if os.environ.get(PRINT_ENV):
        for step, lines in zip(steps, actual, strict=True):
            shown_lines = ["(did not run)"] if lines is None else [replace_ports(line, back) for line in lines]
            print("\n".join([f"$ {step.command}", *shown_lines]))
        return

    failures = []
    for step, lines in zip(steps, actual, strict=True):
        expected = [replace_ports(line, mapping) for line in step.expected]
        if lines is None:
            failures.append(
                f"docs/tutorial.md:{step.line}: `{step.command}` did not run; the end of the output:\n"
                f"{shown(output[-5000:].splitlines())}"
            )
            break
        if not matches(expected, lines):
            failures.append(
                f"docs/tutorial.md:{step.line}: `{step.command}`\n  expected:\n{shown(expected)}\n"
                f"  actual:\n{shown(lines)}"
            )
    if failures:
        pytest.fail(
            "docs/tutorial.md does not match what its commands print:\n\n" + "\n\n".join(failures), pytrace=False
        )


# -- the tutorial's shown outputs against the reader's environment, without running it -----------------


def test_the_tutorial_lists_the_plugins_of_the_readers_environment():
    """`factstream plugins` in the tutorial shows the core, ``likes`` and every plugin of the workspace,
    which the README's ./dev installs (a new bundled plugin must appear there too)."""
    bundled = set()
    for project in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        bundled |= set(tomllib.loads(project.read_text())["project"]["entry-points"]["factstream"])
    step = next(s for s in parse_steps(TUTORIAL.read_text(encoding="utf-8")) if s.command == "factstream plugins")
    shown = {line.split("│")[1].strip() for line in step.expected if line.startswith("│")}
    assert shown == {"factstream (core)", "likes", *bundled}, f"docs/tutorial.md:{step.line}"


def test_each_since_in_the_tutorial_is_the_next_batch_shown_before_it():
    tokens: list[str] = []
    for step in parse_steps(TUTORIAL.read_text(encoding="utf-8")):
        for since in re.findall(r"[?&]since=([^&\"\s]+)", step.command):
            assert tokens, f"docs/tutorial.md:{step.line}: since={since} before any next_batch"
            assert since == tokens[-1], f"docs/tutorial.md:{step.line}: since={since}, the last next_batch {tokens[-1]}"
        tokens += re.findall(r'"next_batch":"([^"]+)"', "\n".join(step.expected))
    assert len(tokens) >= 2, tokens
    # One part per synced stream: the same number in every token, more than one with the bundled plugins.
    assert len({len(token.split("_")) for token in tokens}) == 1, tokens
    assert len(tokens[0].split("_")) > 1, tokens
