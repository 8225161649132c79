"""A stream as replication sees it: its ID generator, update function, row codec and send cursor.

Wire tokens are always positive: a backwards stream (IDs -1, -2, ...) is replicated with the IDs
negated, as the reference does for ``backfill``. Everything in this module speaks wire tokens; the
conversion to stream IDs happens at the ID generator's door.
"""

from __future__ import annotations

from typing import Any

import msgspec

from factstream.db.database import Database
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.streams import StreamSpec, Update

#: How many rows one update-function call aims for (a target, never splitting a token).
UPDATE_TARGET_ROWS = 100
#: Rows the streamer reads back per call when sending what this process wrote: larger pages keep a
#: writer's replication from falling behind its own write rate (measured: 100-row pages capped a
#: Redis writer's publishing at about 12,000 rows/s).
STREAMER_PAGE_ROWS = 1_000


class RowError(ValueError):
    """A replicated row does not match the stream's row type."""


class ReplicatedStream:
    """One stream's replication state in this process."""

    def __init__(self, spec: StreamSpec, id_gen: MultiWriterIdGenerator, db: Database) -> None:
        self.spec = spec
        self.name = spec.name
        self.id_gen = id_gen
        self.db = db
        self.local = id_gen.instance_name
        self.factor = 1 if spec.positive else -1
        self.update = spec.updates()
        self.fields = spec.row_fields
        hints = msgspec.structs.fields(spec.row_type)
        # An array-like twin of the row type validates a wire array in one msgspec call.
        self._wire_type = msgspec.defstruct(
            f"{spec.row_type.__name__}Wire",
            [(f.name, f.type) for f in hints],
            array_like=True,
            frozen=True,
        )
        #: The last token this process has sent (streamer side); starts at the current position, so
        #: history is not replayed on start-up.
        self.last_token = self.current_token(self.local) if id_gen.is_writer else 0

    # -- positions, in wire tokens -----------------------------------------------------------------

    def current_token(self, instance: str) -> int:
        return self.id_gen.get_current_token_for_writer(instance) * self.factor

    def minimal_local_current_token(self) -> int:
        return self.id_gen.get_minimal_local_current_token() * self.factor

    def advance(self, instance: str, token: int) -> None:
        self.id_gen.advance(instance, token * self.factor)

    def can_discard_position(self, instance: str, new_token: int) -> bool:
        return new_token <= self.current_token(instance)

    # -- rows --------------------------------------------------------------------------------------

    def parse_row(self, raw: Any) -> Any:
        """The stream's row type from a wire value (a JSON array in field order)."""
        try:
            wire = msgspec.convert(raw, self._wire_type)
        except msgspec.ValidationError as exc:
            raise RowError(f"stream {self.name!r}: bad row {raw!r}: {exc}") from None
        return self.spec.row_type(*msgspec.structs.astuple(wire))

    def parse_rows(self, raws: list[Any]) -> list[Any]:
        """:meth:`parse_row` for many wire values at once; ``None`` in place of each bad one."""
        try:
            wires = msgspec.convert(raws, list[self._wire_type])  # type: ignore[name-defined]
        except msgspec.ValidationError:
            out = []
            for raw in raws:
                try:
                    out.append(self.parse_row(raw))
                except RowError:
                    out.append(None)
            return out
        row_type, astuple = self.spec.row_type, msgspec.structs.astuple
        return [row_type(*astuple(w)) for w in wires]

    def encode_row(self, row: Any) -> list[Any]:
        """The wire array of a row (field order), JSON-encodable by the command codec."""
        return [msgspec.to_builtins(getattr(row, f)) for f in self.fields]

    # -- updates -----------------------------------------------------------------------------------

    async def get_updates_since(
        self, instance: str, from_token: int, upto_token: int, limit: int = UPDATE_TARGET_ROWS
    ) -> tuple[list[Update], int, bool]:
        if from_token >= upto_token:
            return [], upto_token, False
        return await self.update(self.db, instance, from_token, upto_token, limit)

    async def get_updates(self) -> tuple[list[Update], int, bool]:
        """What this process wrote since :attr:`last_token` (streamer side); moves the cursor."""
        current = self.current_token(self.local)
        if self.last_token >= self.minimal_local_current_token():
            # Nothing new was written here: the position moved because others wrote.
            self.last_token = max(self.last_token, current)
            return [], current, False
        updates, upto, limited = await self.get_updates_since(
            self.local, self.last_token, current, limit=STREAMER_PAGE_ROWS
        )
        self.last_token = upto
        return updates, upto, limited

    def discard_updates_and_advance(self) -> None:
        """Nobody is listening: skip to the current position."""
        self.last_token = self.current_token(self.local)
