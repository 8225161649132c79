"""Structured log lines (``factstream.logs``): text with ``key=value`` fields or one JSON object per line,
chosen by ``logging.format`` in the configuration or ``factstream run --log-format`` (which wins), and
the lifecycle lines of a running instance."""

from __future__ import annotations

import json
import logging
import shlex
import signal
import sys

import pytest

from factstream.logs import JsonFormatter, TextFormatter, kv
from factstream.testing import ProcessCluster


def record(msg: str, *args: object, fields: dict[str, object] | None = None) -> logging.LogRecord:
    rec = logging.LogRecord("factstream.replication.tcp", logging.INFO, __file__, 1, msg, args, None)
    if fields is not None:
        rec.__dict__.update(kv(**fields))
    return rec


def test_kv_is_the_extra_of_a_record_with_fields() -> None:
    assert kv(peer="main", rows=3) == {"fields": {"peer": "main", "rows": 3}}


def test_a_text_line_is_the_message_then_its_fields_as_key_value_pairs() -> None:
    line = TextFormatter().format(
        record("replication link %s", "up", fields={"peer": "main", "positions": "events:12,caches:3"})
    )

    assert line.endswith(" INFO factstream.replication.tcp: replication link up peer=main positions=events:12,caches:3")


def test_a_text_value_with_spaces_quotes_or_nothing_is_quoted_so_the_line_splits_back() -> None:
    line = TextFormatter("%(message)s").format(
        record("export run finished", fields={"job": "a b", "note": 'say "hi"', "empty": "", "rows": 10, "x": None})
    )

    assert line == 'export run finished job="a b" note="say \\"hi\\"" empty="" rows=10 x=null'
    assert shlex.split(line)[3:] == ["job=a b", 'note=say "hi"', "empty=", "rows=10", "x=null"]


def test_a_json_line_has_time_level_logger_message_and_the_fields() -> None:
    entry = json.loads(JsonFormatter().format(record("link %s", "up", fields={"peer": "main", "rows": 3})))

    assert entry.pop("ts").endswith("+00:00")
    assert entry == {
        "level": "INFO",
        "logger": "factstream.replication.tcp",
        "msg": "link up",
        "peer": "main",
        "rows": 3,
    }


def test_a_json_field_named_like_a_key_never_replaces_it() -> None:
    entry = json.loads(JsonFormatter().format(record("the message", fields={"msg": "a field", "level": 1})))

    assert (entry["msg"], entry["msg_"], entry["level"], entry["level_"]) == ("the message", "a field", "INFO", 1)


def test_a_json_line_carries_the_traceback_on_the_same_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", (), sys.exc_info())

    line = JsonFormatter().format(rec)

    assert "\n" not in line
    assert json.loads(line)["exc"].endswith("ValueError: boom")


def test_a_plain_formatter_shows_a_record_with_fields_without_failing() -> None:
    assert logging.Formatter("%(message)s").format(record("link up", fields={"peer": "main"})) == "link up"


@pytest.fixture
def single(process_cluster: ProcessCluster) -> ProcessCluster:
    return process_cluster.configure(instances=["main"])


@pytest.mark.slow
def test_run_logs_json_lines_as_configured_from_starting_to_stopped(single: ProcessCluster) -> None:
    proc = single.start("main", single.config(logging={"format": "json"}))
    assert proc.stop(signal.SIGTERM) == 0

    lines = [line for line in proc.log().splitlines() if line and not line.startswith("=====")]
    entries = [json.loads(line) for line in lines]  # every line is one JSON object
    by_msg = {entry["msg"]: entry for entry in entries if entry["logger"] == "factstream.host.app"}
    assert list(by_msg) == [
        "instance main starting",
        "instance main started",
        "instance main stopping",
        "instance main stopped",
    ]
    started = by_msg["instance main started"]
    assert started["http"] == "none" and started["transport"] == "tcp", started
    assert by_msg["instance main stopped"]["uptime_seconds"] > 0


@pytest.mark.slow
def test_the_log_format_option_wins_over_the_configuration(single: ProcessCluster) -> None:
    proc = single.start("main", single.config(logging={"format": "json"}), args=["--log-format", "text"])
    assert proc.stop(signal.SIGTERM) == 0

    [line] = [line for line in proc.log().splitlines() if "instance main started" in line]
    assert " INFO factstream.host.app: instance main started http=none " in line, line
    assert "transport=tcp" in line
