"""The row capture: how replication receives the rows a writer commits (:class:`RowCapture`).

:class:`~factstream.idgen.generator.MultiWriterIdGenerator` calls it from its appends and
completions; the replication stream (:mod:`factstream.replication.stream`) implements it.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["RowCapture"]


class RowCapture(Protocol):
    """Receives the rows this process commits, so that replication need not read them back.

    :meth:`MultiWriterIdGenerator.append_many_txn` asks :meth:`fields_for` which columns to return
    with each new row (``INSERT ... RETURNING``: the values as stored, after defaults and
    triggers) and hands them over once the transaction has committed, before the IDs complete.
    Every other completed ID (reserved with ``get_next*``, appended when nothing was captured, rolled
    back, or of a COMMIT with an unknown outcome) is reported through :meth:`uncaptured`, so the
    capture always knows which IDs it may lack.
    """

    def fields_for(self, table: str) -> tuple[str, ...] | None:
        """Columns to return with the stream ID of rows appended to ``table`` (``None``: capture nothing)."""

    def captured(self, rows: list[tuple[Any, ...]]) -> None:
        """``(stored stream ID, *field values)`` of committed appended rows."""

    def uncaptured(self, ids: list[int]) -> None:
        """IDs (positive, as the tracker counts them) that may have rows which were not captured."""
