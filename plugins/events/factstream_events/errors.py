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
