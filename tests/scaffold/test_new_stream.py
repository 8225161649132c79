"""``factstream new-stream``: what it writes, what it refuses, its help, and the rendered plugins' own tests."""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from factstream.scaffold import StreamPlugin, write_plugin

ROOT = Path(__file__).resolve().parents[2]

COMMON_FILES = {
    ".gitignore",
    "README.md",
    "pyproject.toml",
    "tests/conftest.py",
    "{package}/__init__.py",
    "{package}/py.typed",
    "{package}/routes.py",
    "{package}/rows.py",
    "{package}/settings.py",
    "{package}/store.py",
    "{package}/migrations/__init__.py",
    "{package}/migrations/{revision}_create_the_{name}_table.py",
    "tests/test_{name}.py",
}


def files_under(directory: Path) -> set[str]:
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()}


def expected_files(name: str, revision: str, *, export: bool) -> set[str]:
    names = COMMON_FILES | ({"tests/test_{name}_export.py"} if export else set())
    return {f.format(package=f"factstream_{name}", name=name, revision=revision) for f in names}


# -- the command -------------------------------------------------------------------------------------


def test_new_stream_writes_the_project_and_says_what_next(run_cli, tmp_path):
    result = run_cli("new-stream", "page_views", "--description", "pages people looked at", "--no-export")
    assert result.returncode == 0, result.stderr
    project = tmp_path / "factstream-page-views"
    revision = next((project / "factstream_page_views" / "migrations").glob("*_create_the_page_views_table.py"))
    assert files_under(project) == expected_files("page_views", revision.name[:12], export=False)
    assert (
        f"created the page_views stream plugin in factstream-page-views ({len(files_under(project))} files)"
        in result.stdout
    )
    assert "cd factstream-page-views" in result.stdout
    pyproject = (project / "pyproject.toml").read_text()
    assert 'description = "pages people looked at"' in pyproject
    assert 'page_views = "factstream_page_views"' in pyproject
    assert "[tool.uv.sources]" not in pyproject  # outside a checkout, factstream comes from the index
    # No prompt without a terminal: the command did not wait for input.
    assert "description" not in result.stdout.split("\n")[0]


def test_the_first_revision_depends_on_the_core_head_and_needs_no_edit(run_cli, tmp_path):
    assert run_cli("new-stream", "clicks").returncode == 0
    revision = next((tmp_path / "factstream-clicks/factstream_clicks/migrations").glob("*_create_*.py"))
    text = revision.read_text()
    core_head = sorted((ROOT / "migrations" / "versions").glob("fs_core_*.py"))[-1].name[:12]
    assert f'depends_on: str | Sequence[str] | None = "{core_head}"' in text
    assert 'branch_labels: str | Sequence[str] | None = ("clicks",)' in text
    assert "\nRevises:\n" in text  # no trailing space: ruff format --check passes as generated


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["Likes"], "invalid stream name 'Likes': use 1-63 characters, lower-case letters, digits and '_'"),
        (["2likes"], "invalid stream name '2likes'"),
        (["likes-2"], "invalid stream name 'likes-2'"),
        (["select"], "stream name 'select' is an SQL reserved word"),
        (["x" * 50], "is too long for a new stream: at most 49 characters"),
        (["account_data"], "a plugin named 'account_data' is already installed (factstream_account_data)"),
        (["caches"], "a plugin named 'caches' is already installed (factstream_caches)"),
        (["likes", "--writers", "main,main"], "--writers 'main,main': writer instances named twice"),
        (["likes", "--writers", "bad name"], "--writers 'bad name': invalid instance name 'bad name'"),
        (["likes", "--writers", ","], "--writers ',': name at least one writer instance"),
        (["likes", "somewhere", "--workspace"], "give a directory or --workspace, not both"),
        (["likes", "--workspace"], "is not inside a factstream checkout"),
        (["likes", "--description", "two\nlines"], "--description must be one line"),
    ],
)
def test_a_refusal_is_one_line_exit_2_and_writes_nothing(run_cli, tmp_path, args, message):
    result = run_cli("new-stream", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_refused_and_left_alone(run_cli, tmp_path):
    existing = tmp_path / "mine"
    existing.mkdir()
    (existing / "notes.txt").write_text("keep me")
    result = run_cli("new-stream", "likes", "mine")
    assert result.returncode == 2
    assert result.stderr.strip().endswith("mine already exists and is not empty; choose another directory")
    assert files_under(existing) == {"notes.txt"} and (existing / "notes.txt").read_text() == "keep me"
    # An empty directory is fine.
    (tmp_path / "empty").mkdir()
    assert run_cli("new-stream", "likes", "empty").returncode == 0
    assert (tmp_path / "empty" / "factstream_likes" / "rows.py").is_file()


def test_a_stream_registered_by_a_plugin_of_another_name_is_refused(run_cli, tmp_path, plugin_installer):
    plugin_installer.from_source(
        "shelf",
        """
        import msgspec
        import factstream
        from factstream import StreamSpec, StreamTable

        class Book(msgspec.Struct):
            title: str

        @factstream.hookimpl
        def register_streams(register):
            table = StreamTable("books", "instance_name", "stream_id")
            register(StreamSpec(name="books", row_type=Book, tables=(table,)))
        """,
    )
    result = run_cli("new-stream", "books", env=plugin_installer.env())
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: a stream named 'books' is already registered by plugin 'shelf'; choose another name"
    )
    assert list(tmp_path.iterdir()) == []


def test_prompts_on_a_terminal_ask_for_what_is_missing(tmp_path):
    """On a terminal (a pty here) the command asks for each missing option, showing the default."""
    import os
    import pty

    script = f"from factstream.cli import main; main(['new-stream', 'votes', {str(tmp_path / 'votes')!r}])"
    answers = [b"who voted for what\n", b"main,worker1\n", b"n\n", b"\n"]  # the last takes the default
    transcript = bytearray()

    def read(fd: int) -> bytes:
        data = os.read(fd, 1024)
        transcript.extend(data)
        if answers and data.rstrip().endswith(b":"):  # a prompt is waiting for its answer
            os.write(fd, answers.pop(0))
        return data

    pty.spawn([sys.executable, "-c", script], read)
    text = transcript.decode(errors="replace")
    assert "description [the votes stream]:" in text
    assert "instances that write it (comma-separated) [main]:" in text
    assert "show each user their rows in /sync? [Y/n]:" in text
    assert "add a Spark export job? [Y/n]:" in text
    project = tmp_path / "votes"
    assert 'description = "who voted for what"' in (project / "pyproject.toml").read_text()
    assert "sync_key" not in (project / "factstream_votes" / "rows.py").read_text()  # answered n
    assert 'WRITERS = ["main", "worker1"]' in (project / "tests" / "test_votes.py").read_text()
    assert (project / "tests" / "test_votes_export.py").is_file()  # the default: yes


def test_help_and_docs_cli_agree(run_cli):
    helped = run_cli("new-stream", "--help")
    assert helped.returncode == 0
    help_text = re.sub(r"\s+", " ", re.sub(r"[│╭╮╰╯─]", " ", helped.stdout))
    section = (ROOT / "docs" / "cli.md").read_text().split("## `factstream new-stream`")[1].split("\n## ")[0]
    rows = re.findall(r"^\| `([^`]+)` \| (.+) \|$", section, re.MULTILINE)
    assert {option.split()[0] for option, _ in rows} == {
        "NAME",
        "DIRECTORY",
        "--description",
        "--writers",
        "--sync-key/--no-sync",
        "--export/--no-export",
        "--workspace",
    }
    for option, text in rows:
        assert re.sub(r"\s+", " ", text) in help_text, option
        flag = option.split()[0]
        if flag.startswith("--"):
            for name in flag.split("/"):
                assert name in help_text, name
    summary = [line[2:] for line in section.splitlines() if line.startswith("> ")]
    assert summary and re.sub(r"\s+", " ", " ".join(summary)) in help_text


# -- what is rendered --------------------------------------------------------------------------------

COMBINATIONS = list(itertools.product([True, False], [True, False]))


@pytest.mark.parametrize(("sync", "export"), COMBINATIONS, ids=lambda v: str(v))
def test_every_combination_renders_exactly_its_files_and_passes_ruff(tmp_path, sync, export):
    plugin = StreamPlugin("likes", "who likes what", ("main",), sync, export)
    project = tmp_path / "likes"
    write_plugin(plugin, project)
    assert files_under(project) == expected_files("likes", plugin.revision, export=export)
    rows = (project / "factstream_likes" / "rows.py").read_text()
    assert ('sync_key="likes_key"' in rows) == sync
    assert ("register_export_jobs" in (project / "factstream_likes" / "__init__.py").read_text()) == export
    readme = (project / "README.md").read_text()
    headings = [line for line in readme.splitlines() if line.startswith("## ")]
    assert headings == ["## Install", "## Migrate", "## Run", "## Test", "## What to edit first"]
    assert 'factstream migrate new --plugin likes -m "add a column"' in readme
    assert ("factstream --config factstream.yaml export likes_all" in readme) == export
    for check in (["check"], ["format", "--check"]):
        ruff = subprocess.run([sys.executable, "-m", "ruff", *check, "."], cwd=project, capture_output=True, text=True)
        assert ruff.returncode == 0, ruff.stdout + ruff.stderr
