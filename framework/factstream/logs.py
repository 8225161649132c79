"""Structured log lines: a message and ``key=value`` fields, as text or as one JSON object per line.

A record carries its fields in ``extra={"fields": {...}}`` (:func:`kv` builds that)::

    log.info("replication link up", extra=kv(peer="main", positions="events:12,caches:3"))

:class:`TextFormatter` writes the message then the fields, ``key=value`` separated by spaces
(``2026-11-27 12:00:00,123 INFO factstream.replication.tcp: replication link up peer=main
positions=events:12,caches:3``); a value that holds a space, a quote or an ``=``, or is empty, is
written as a JSON string, so that a line splits back into its fields unambiguously.
:class:`JsonFormatter` writes ``{"ts": ..., "level": ..., "logger": ..., "msg": ..., <fields>}`` on
one line, a traceback in ``exc``. A field named like one of those keys is written with a ``_``
suffix (``msg_``), never over it.

Any formatter copes with a record that has fields: Python's own ignores them, so a library's
handler, or a test's ``caplog``, shows the message alone.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any, Literal

#: The record attribute holding a record's structured fields.
FIELDS = "fields"
#: The line of a text record: time, level, logger, then the message and its fields.
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: The keys of a JSON record that are not fields.
JSON_KEYS = frozenset({"ts", "level", "logger", "msg", "exc", "stack"})

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")


def kv(**fields: Any) -> dict[str, Any]:
    """``extra=`` for a log call with these fields: ``log.info("msg", extra=kv(peer="main"))``."""
    return {FIELDS: fields}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The structured fields of ``record`` (empty when it has none, or they are not a mapping)."""
    fields = getattr(record, FIELDS, None)
    return dict(fields) if isinstance(fields, dict) else {}


def _text_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str) if value is not None else "null"
    if text == "" or any(c.isspace() or c in '"=' for c in text):
        return json.dumps(text, ensure_ascii=False)
    return text


def format_fields(fields: dict[str, Any]) -> str:
    """``key=value`` pairs separated by spaces, in the fields' order (values quoted where needed)."""
    return " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())


class TextFormatter(logging.Formatter):
    """A plain line: ``fmt`` (default :data:`TEXT_FORMAT`) with the record's fields after the message."""

    def __init__(self, fmt: str = TEXT_FORMAT) -> None:
        super().__init__(fmt)

    def formatMessage(self, record: logging.LogRecord) -> str:
        fields = record_fields(record)
        if fields:
            record.message = f"{record.message} {format_fields(fields)}"
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``ts`` (ISO 8601, UTC), ``level``, ``logger``, ``msg``, the fields,
    and ``exc`` (the traceback as Python prints it) when the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            entry[f"{key}_" if key in JSON_KEYS else key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def formatter(log_format: LogFormat, fmt: str = TEXT_FORMAT) -> logging.Formatter:
    """The formatter of ``log_format`` (``text`` lines use ``fmt``)."""
    return JsonFormatter() if log_format == "json" else TextFormatter(fmt)
