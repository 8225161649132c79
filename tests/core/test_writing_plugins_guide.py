"""docs/writing-plugins.md and its complete example, the ``likes`` plugin in docs/examples/likes, stay one.

* The guide quotes every file of the example project, each in a fenced block after a
  ``<!-- example: PATH -->`` marker (PATH relative to docs/examples/likes); a quote that differs from
  its file by one character fails, and so does a file the guide does not quote.
* The example imports only the public API and types its hooks without ``Any`` (the rules
  tests/test_architecture.py applies to the plugins of the repository).
* The example project's own tests pass, run as its author runs them: ``pytest`` in the project's
  directory, with the project's pytest settings. They install the plugin through its entry point,
  migrate a fresh database, start two in-process hosts over TCP (main writes, worker1 reads) and
  check the count cache, the rows handler on both hosts, ``/sync``, the 421 of a misdirected write and the
  settings. (tests/core's conftest blocks the bundled plugins, and the subprocess inherits that: the
  example runs beside the core alone, as a third-party plugin would.)
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.test_architecture import plugin_violations, untyped_hooks

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-plugins.md"
EXAMPLE = ROOT / "docs" / "examples" / "likes"

#: A quoted file: the marker, then a fenced block (any language) holding the file's text.
QUOTE = re.compile(r"^<!-- example: (?P<path>\S+) -->\n```[\w-]*\n(?P<text>.*?)^```$", re.MULTILINE | re.DOTALL)
#: Left behind by running or checking the example; not part of it.
GENERATED = {"__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv"}


def example_files() -> dict[str, str]:
    """Every file of the example project (path relative to it -> text)."""
    return {
        path.relative_to(EXAMPLE).as_posix(): path.read_text()
        for path in sorted(EXAMPLE.rglob("*"))
        if path.is_file() and not GENERATED & set(path.relative_to(EXAMPLE).parts) and path.suffix != ".pyc"
    }


def quoted_files() -> list[tuple[str, str]]:
    """``(path, text)`` of every quote of the example in the guide, in order."""
    return [(m["path"], m["text"]) for m in QUOTE.finditer(GUIDE.read_text())]


def test_the_guide_quotes_every_file_of_the_example_as_it_is():
    files = example_files()
    quotes = quoted_files()
    paths = [path for path, _ in quotes]
    assert sorted(paths) == sorted(files), "the guide must quote each file of docs/examples/likes exactly once"
    for path, text in quotes:
        assert text == files[path], f"docs/writing-plugins.md quotes {path} differently from docs/examples/likes"


def test_the_quote_markers_are_all_recognised():
    """A marker whose block does not parse (a typo in the fence) would silently quote nothing."""
    markers = re.findall(r"<!-- example: (\S+) -->", GUIDE.read_text())
    assert markers == [path for path, _ in quoted_files()]


def test_the_example_imports_only_the_public_api():
    assert plugin_violations(EXAMPLE.parent) == []


def test_the_example_types_its_hooks_without_any():
    assert untyped_hooks(EXAMPLE.parent) == []


def test_the_example_passes_its_own_tests(tmp_path):
    tests = sorted((EXAMPLE / "tests").glob("test_*.py"))
    expected = sum(len(re.findall(r"^(?:async )?def test_", path.read_text(), re.MULTILINE)) for path in tests)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "tests", "-q", "-p", "no:cacheprovider", "--basetemp", str(tmp_path / "t")],
        cwd=EXAMPLE,
        env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert re.search(rf"\b{expected} passed\b", output), output
    assert not re.search(r"\b(skipped|xfailed|deselected)\b", output), output
