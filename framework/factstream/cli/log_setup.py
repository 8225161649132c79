"""Where the ``factstream`` command's log lines go: one handler on the root logger, on stderr."""

from __future__ import annotations

import logging
import os
import sys

from rich.logging import RichHandler

from factstream import logs
from factstream.cli.session import err

#: The name of the handler this module installs on the root logger (so it is installed once).
LOG_HANDLER_NAME = "factstream.cli"
#: A log record on stderr when stderr is not a terminal (a file, a pipe, journald). One line per
#: record, never wrapped, and a traceback follows as Python prints it, so that a log file can be
#: searched line by line and a traceback pasted back intact. The record's fields follow the message.
PLAIN_LOG_FORMAT = logs.TEXT_FORMAT
#: Libraries whose INFO lines are set-up chatter, not what the instance does ("Context impl
#: PostgresqlImpl.", uvicorn's "Started server process"): shown from WARNING up unless ``-v``.
CHATTY_LOGGERS = ("alembic", "uvicorn")


def log_handler(*, show_level: bool = True, log_format: logs.LogFormat = "text") -> logging.Handler:
    """A stderr handler: rich on a terminal, plain unwrapped lines otherwise, JSON lines when asked.

    Rich lays a record out in columns and wraps it to the console's width, which is 80 (or
    ``$COLUMNS``) when stderr is not a terminal: in a log file that split long lines and tracebacks.
    So rich is used only when a person is looking at the output, and never for JSON.
    """
    if err.is_terminal and log_format == "text":
        handler: logging.Handler = RichHandler(console=err, show_time=False, show_path=False, show_level=show_level)
        handler.setFormatter(logs.TextFormatter("%(message)s"))
        return handler
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logs.formatter(log_format, PLAIN_LOG_FORMAT if show_level else "%(message)s"))
    return handler


def setup_logging(level: int, log_format: logs.LogFormat = "text") -> None:
    """Install (or replace) the root logger's stderr handler for ``log_format`` at ``level``."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.name == LOG_HANDLER_NAME]:
        if getattr(old, "log_format", None) == log_format:
            break
        root.removeHandler(old)
    else:
        handler = log_handler(log_format=log_format)
        handler.name = LOG_HANDLER_NAME
        handler.log_format = log_format  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(level)
    if os.environ.get("FACTSTREAM_TRACE_HOOKS"):
        logging.getLogger("factstream.hooks").setLevel(logging.INFO)
