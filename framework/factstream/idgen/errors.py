"""The ID generator's error type, shared by :mod:`factstream.idgen.generator` and :mod:`factstream.idgen.durable`."""

from __future__ import annotations

from factstream.errors import FactstreamError

__all__ = ["IdGeneratorError"]


class IdGeneratorError(FactstreamError):
    """Misuse of a stream's ID generator (reserving on a non-writer, using it before start())."""
