"""What ``factstream export`` prints after a run (issue 44, items 8, 9 and 16): the job and stream names a
user types are never cut, whatever the width; the counts say what they count; a local output is shown as
its path, not as a URI with a raw space in it."""

from __future__ import annotations

import io

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from factstream.export.command import summary
from factstream.export.output import local_uri
from factstream.export.runner import ExportResult

NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=40)


def rendered(results: list[ExportResult], width: int) -> str:
    console = Console(file=io.StringIO(), width=width, no_color=True)
    console.print(summary(results))
    return console.file.getvalue()  # type: ignore[attr-defined]


def result(job: str, stream: str, output: str = "file:///out/x", rows: int = 14) -> ExportResult:
    return ExportResult(job, stream, 0, 22, rows, 1.5, output, "exported")


@settings(max_examples=60, deadline=None)
@given(jobs=st.lists(st.tuples(NAMES, NAMES), min_size=1, max_size=4), room=st.integers(0, 60))
def test_job_and_stream_names_are_never_cut_at_any_width(jobs, room):
    # any terminal with the names' width and 60 columns more for the rest
    width = max(len(job) for job, _ in jobs) + max(len(stream) for _, stream in jobs) + 60 + room
    text = rendered([result(job, stream, "file:///tmp/exports/" + job) for job, stream in jobs], width)
    lines = text.splitlines()
    for job, stream in jobs:
        assert any(f" {job} " in line and f" {stream} " in line for line in lines), (job, stream, text)
    assert "…" not in "".join(line for line in lines if "exported" in line)


def test_the_counts_are_named_for_what_they_count_and_the_output_is_a_path(tmp_path):
    where = tmp_path / "my exports [2026]" / "account_data_latest"
    where.mkdir(parents=True)
    text = rendered([result("account_data_latest", "account_data", local_uri(where))], 80)
    assert "rows written" in text and "rows written: the rows the job wrote" in " ".join(text.split())
    assert "file:" not in text
    assert f"account_data_latest: {where}" in "".join(text.splitlines())  # whole, after the table
    assert " account_data_latest " in text and " exported " in text


def test_an_output_that_is_not_local_keeps_its_uri():
    assert "s3a://bucket/exports/x" in rendered([result("x", "y", "s3a://bucket/exports/x")], 120)
