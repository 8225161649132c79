"""The recent problems of this process: the last warnings and errors logged, for the dashboard.

:class:`RecentProblems` is a ``logging`` handler on the root logger that keeps the newest
:data:`KEEP` records at ``WARNING`` or above, whoever logged them (the core, a plugin, the HTTP
server). The host installs it when it starts and removes it when it stops; ``/dashboard/state``
shows what it holds. Several hosts in one process (tests) each install their own, and each sees the
whole process's records: logging is per process, not per host.

It keeps what an operator reads, never the record itself (a record holds its arguments and
traceback alive): the time, level, logger and the message, cut to :data:`MAX_MESSAGE` characters,
with the exception's last line when there is one.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

#: How many records are kept.
KEEP = 100
#: The longest message kept, in characters (a longer one is cut and ends with an ellipsis).
MAX_MESSAGE = 2_000


@dataclass(frozen=True)
class Problem:
    """One warning or error as the dashboard shows it."""

    time: float
    level: str
    logger: str
    message: str

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class RecentProblems(logging.Handler):
    """Keeps the newest :data:`KEEP` records at ``WARNING`` or above (see the module docstring)."""

    def __init__(self, keep: int = KEEP) -> None:
        super().__init__(level=logging.WARNING)
        self._problems: deque[Problem] = deque(maxlen=keep)
        self._installed_on: logging.Logger | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a bad format string in someone's log call must not break logging
            message = f"{record.msg!r} (could not format its arguments)"
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            message = f"{message}: {type(exc).__name__}: {exc}"
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 1] + "…"
        self._problems.append(Problem(record.created, record.levelname, record.name, message))

    def problems(self) -> list[Problem]:
        """What is kept, oldest first."""
        self.acquire()  # emit runs under the same lock: no append while the deque is copied
        try:
            return list(self._problems)
        finally:
            self.release()

    def install(self, logger: logging.Logger | None = None) -> None:
        """Start keeping the records of ``logger`` (the root logger by default); idempotent."""
        if self._installed_on is None:
            self._installed_on = logger or logging.getLogger()
            self._installed_on.addHandler(self)

    def remove(self) -> None:
        """Stop keeping records (what was kept stays readable); idempotent."""
        if self._installed_on is not None:
            self._installed_on.removeHandler(self)
            self._installed_on = None
