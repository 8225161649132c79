"""The events plugin's errors: each maps to one HTTP answer (status, errcode) in the routes."""

from __future__ import annotations


class EventsError(Exception):
    """Base of the errors below; ``status`` and ``errcode`` say how the HTTP API answers it."""

    status = 400
    errcode = "M_INVALID_PARAM"


class InvalidEvent(EventsError):
    """An event or request that cannot be stored as given (the message names the field)."""

    status = 400
    errcode = "M_BAD_JSON"


class InvalidParam(InvalidEvent):
    """A query parameter of a read that is out of range or malformed (the message names it)."""

    errcode = "M_INVALID_PARAM"


class EventConflict(EventsError):
    """An event ID already stored with other bytes (the first is kept), or a transaction ID reused."""

    status = 409
    errcode = "M_CONFLICT"


class UnknownRoom(EventsError):
    """A room this server holds no events of."""

    status = 404
    errcode = "M_NOT_FOUND"


class UnknownEvent(EventsError):
    """An event this server does not hold (or the caller may not see)."""

    status = 404
    errcode = "M_NOT_FOUND"


class Forbidden(EventsError):
    """The local policy refuses the event, or a read the caller may not make."""

    status = 403
    errcode = "M_FORBIDDEN"


class MisdirectedWrite(EventsError):
    """A write of a room sent to an instance that is not the room's writer (``sharding.writer_for``).

    Refused before anything is read or stored. ``writer`` is the instance that writes the room and
    ``url`` its HTTP base URL when the configuration's ``instance_map`` gives one: the HTTP answer is
    421 ``M_MISDIRECTED`` with both in its body, so a client or a reverse proxy sends the write there.
    """

    status = 421
    errcode = "M_MISDIRECTED"

    def __init__(self, message: str, *, writer: str, url: str | None = None) -> None:
        super().__init__(message)
        self.writer = writer
        self.url = url
