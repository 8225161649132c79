"""A stream as replication sees it: its ID generator, update function, row codec and send cursor.

Wire tokens are always positive: a backwards stream (IDs -1, -2, ...) is replicated with the IDs
negated, as the reference does for ``backfill``. Everything in this module speaks wire tokens; the
conversion to stream IDs happens at the ID generator's door.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import msgspec

from factstream.db.database import Database
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.kept import KeptPositions
from factstream.plugin.streams import StreamSpec, Update
from factstream.replication.kept import KeptSource
from factstream.replication.wire import decode_json

#: How many rows one update-function call aims for (a target, never splitting a token).
UPDATE_TARGET_ROWS = 100
#: Rows the streamer reads back per call when sending what this process wrote: larger pages keep a
#: writer's replication from falling behind its own write rate (measured: 100-row pages capped a
#: Redis writer's publishing at about 12,000 rows/s).
STREAMER_PAGE_ROWS = 1_000
#: Captured rows a writer keeps for its streamer at most; past that it reads them back instead.
CAPTURE_LIMIT_ROWS = 100_000


class RowError(ValueError):
    """A replicated row does not match the stream's row type."""


class ReplicatedStream:
    """One stream's replication state in this process."""

    def __init__(
        self,
        spec: StreamSpec[Any],
        id_gen: MultiWriterIdGenerator | KeptPositions,
        db: Database,
        *,
        kept: KeptSource | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.id_gen = id_gen
        self.db = db
        self.local = id_gen.instance_name
        self.factor = 1 if spec.positive else -1
        #: A kept stream's source of updates (its keeper here, its writer elsewhere); None for tables.
        self.kept = kept
        if spec.kept != (kept is not None):
            raise ValueError(f"stream {spec.name!r}: a kept stream needs its KeptSource, and only it")
        self.update = kept.updates if kept is not None else spec.updates()
        self.fields = spec.row_fields
        hints = msgspec.structs.fields(spec.row_type)
        # An array-like twin of the row type validates a wire array in one msgspec call.
        self._wire_type = msgspec.defstruct(
            f"{spec.row_type.__name__}Wire",
            [(f.name, f.type) for f in hints],
            array_like=True,
            frozen=True,
        )
        self._decode_wires = msgspec.json.Decoder(list[self._wire_type]).decode  # type: ignore[name-defined]
        # Faster still when every field is required: each row as a tuple of the field types, passed
        # straight to the row type (no wire struct to unpack). The wire type reads the rest.
        self._decode_tuples = (
            msgspec.json.Decoder(list[tuple[tuple(f.type for f in hints)]]).decode  # type: ignore[misc]
            if hints and all(f.required for f in hints)
            else None
        )
        #: The last token this process has sent (streamer side); starts at the current position, so
        #: history is not replayed on start-up.
        self.last_token = self.current_token(self.local) if id_gen.is_writer else 0
        # Rows appended here are captured as they commit (see RowCapture), so that the streamer
        # sends them without reading them back: only for streams read by the table update function,
        # whose rows are exactly the backing tables' columns.
        self.capturing = False
        self._captured_tokens: list[int] = []
        self._captured_rows: list[Any] = []
        #: Wire tokens at or below this one must be read from the database: some committed ID there
        #: was not captured (committed by an earlier process under this instance name, reserved with
        #: get_next*, appended while nobody listened, or dropped).
        self._read_upto = max(self.last_token, id_gen.reserved_before_start)
        self._tables = {t.table for t in spec.tables}
        #: Who may write this stream (empty: anyone), from the configuration.
        self._writers = frozenset(id_gen.writers)
        #: An ID the sequence is known to have handed out (normalised: positive): no writer's
        #: position can be beyond the sequence, so a POSITION past this is checked against it.
        self._allocated = id_gen.reserved_before_start
        #: Only rows of a stream read by the table update function are exactly what the generator
        #: captures; a stream with its own update function is always read back through it.
        self._can_capture = id_gen.is_writer and spec.update_function is None and kept is None
        if self._can_capture:
            assert isinstance(id_gen, MultiWriterIdGenerator)
            id_gen.capture = self
        if kept is not None:
            kept.parse_row = self.parse_row

    # -- positions, in wire tokens -----------------------------------------------------------------

    def current_token(self, instance: str) -> int:
        return self.id_gen.get_current_token_for_writer(instance) * self.factor

    def minimal_local_current_token(self) -> int:
        return self.id_gen.get_minimal_local_current_token() * self.factor

    def advance(self, instance: str, token: int) -> None:
        self.id_gen.advance(instance, token * self.factor)

    def can_discard_position(self, instance: str, new_token: int) -> bool:
        return new_token <= self.current_token(instance)

    def may_write(self, instance: str) -> bool:
        """Whether ``instance`` is configured to write this stream (anyone, for a stream without writers)."""
        return not self._writers or instance in self._writers

    def position_allowed(self, token: int) -> bool:
        """Whether ``token`` is at most an ID the sequence is known to have handed out (no query needed);
        a kept stream has no sequence: its writer's count is what it says."""
        return self.kept is not None or token * self.factor <= self._allocated

    async def refresh_allocated(self) -> int:
        """Read the sequence's last handed-out ID again; returns it (a wire token)."""
        value = await self.id_gen.get_max_allocated_token() * self.factor
        self._allocated = max(self._allocated, value)
        return self._allocated * self.factor

    # -- rows --------------------------------------------------------------------------------------

    def parse_row(self, raw: Any) -> Any:
        """The stream's row type from a wire value (a JSON array in field order)."""
        try:
            wire = msgspec.convert(raw, self._wire_type)
        except msgspec.ValidationError as exc:
            raise RowError(f"stream {self.name!r}: bad row {raw!r}: {exc}") from None
        return self.spec.row_type(*msgspec.structs.astuple(wire))

    def decode_rows(self, texts: Sequence[bytes], array: bytes) -> list[Any]:
        """The row type from many JSON texts (exactly one value each), ``None`` in place of each bad one;
        ``array`` is the texts joined into one JSON array.

        All at once when every row fits: one msgspec call decodes the array into tuples of the field
        types (or, for a row type with defaults, into the wire type), and the rows are built in a
        C-level pass (this runs for every replicated row). Otherwise row by row, each read exactly as
        a single RDATA line's row is. The tuples accept exactly the arrays of every field's value in
        order; the wire type also accepts arrays without trailing defaulted fields, or with extra
        trailing values (ignored), so it reads what the tuples refuse.
        """
        if self._decode_tuples is not None:
            try:
                values = self._decode_tuples(array)
            except (msgspec.DecodeError, RecursionError):  # msgspec.ValidationError is a DecodeError
                pass
            else:
                return list(itertools.starmap(self.spec.row_type, values))
        try:
            wires = self._decode_wires(array)
        except (msgspec.DecodeError, RecursionError):
            return [self._row_from_text(text) for text in texts]
        return list(itertools.starmap(self.spec.row_type, map(msgspec.structs.astuple, wires)))

    def _row_from_text(self, text: bytes) -> Any:
        try:
            return self.parse_row(decode_json(text.decode("utf-8")))
        except (RowError, ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return None

    def encode_row(self, row: Any) -> list[Any]:
        """The wire array of a row (field order), JSON-encodable by the command codec."""
        return [msgspec.to_builtins(getattr(row, f)) for f in self.fields]

    # -- capture (writer side, see factstream.idgen.generator.RowCapture) -------------------------

    def fields_for(self, table: str) -> tuple[str, ...] | None:
        return self.fields if self.capturing and table in self._tables else None

    def captured(self, rows: list[tuple[Any, ...]]) -> None:
        factor = self.factor
        tokens = [int(r[0]) * factor for r in rows] if factor != 1 else [r[0] for r in rows]
        if not self.capturing or len(self._captured_tokens) + len(rows) > CAPTURE_LIMIT_ROWS:
            # Nobody listens, or the streamer is far behind (or stalled): read these back later.
            self._read_upto = max(self._read_upto, max(tokens), max(self._captured_tokens, default=0))
            self._captured_tokens.clear()
            self._captured_rows.clear()
            return
        # Stored values through to_builtins, exactly as encode_row treats a row read back.
        self._captured_tokens += tokens
        self._captured_rows += msgspec.to_builtins([r[1:] for r in rows])

    def uncaptured(self, ids: list[int]) -> None:
        self._read_upto = max(self._read_upto, max(ids))

    # -- updates -----------------------------------------------------------------------------------

    async def get_updates_since(
        self, instance: str, from_token: int, upto_token: int, limit: int = UPDATE_TARGET_ROWS
    ) -> tuple[list[Update], int, bool]:
        if from_token >= upto_token:
            return [], upto_token, False
        return await self.update(self.db, instance, from_token, upto_token, limit)

    async def get_wire_updates(self) -> tuple[list[int], list[Any], int, bool]:
        """What this process wrote since :attr:`last_token`: ``(tokens, wire rows, upto, limited)``.

        Streamer side; moves the cursor. Rows come from the capture when it holds every committed
        ID of the range, and are read back through the update function otherwise.
        """
        current = self.current_token(self.local)
        if not self.id_gen.wrote_after(self.last_token * self.factor):
            # Nothing was written here since the last send: the position moved because others wrote.
            # (Not judged by this process's own position: that lags behind an ID completed while an
            # earlier reservation waits for the sequence, which ``current`` may pass; see
            # PositionTracker.wrote_above.)
            self.last_token = max(self.last_token, current)
            self._drop_captured(self.last_token)
            return [], [], current, False
        if self.capturing and self.last_token >= self._read_upto:
            tokens, rows = self._captured_tokens, self._captured_rows
            if tokens and max(tokens) > current:
                # Some rows wait for an earlier ID that is still in flight: keep them for later.
                keep = [i for i, t in enumerate(tokens) if t > current]
                self._captured_tokens = [tokens[i] for i in keep]
                self._captured_rows = [rows[i] for i in keep]
                send = [i for i, t in enumerate(tokens) if t <= current]
                tokens, rows = [tokens[i] for i in send], [rows[i] for i in send]
            else:
                self._captured_tokens, self._captured_rows = [], []
            if tokens != sorted(tokens):  # commits can finish out of order (linear when sorted)
                order = sorted(range(len(tokens)), key=tokens.__getitem__)
                tokens, rows = [tokens[i] for i in order], [rows[i] for i in order]
            self.last_token = current
            return tokens, rows, current, False
        updates, upto, limited = await self.get_updates_since(
            self.local, self.last_token, current, limit=STREAMER_PAGE_ROWS
        )
        self.last_token = upto
        self._drop_captured(upto)
        encode = self.encode_row
        return [t for t, _ in updates], [encode(r) for _, r in updates], upto, limited

    def discard_updates_and_advance(self) -> None:
        """Nobody is listening: skip to the current position."""
        self.last_token = self.current_token(self.local)
        self._drop_captured(self.last_token)

    def set_capturing(self, on: bool) -> None:
        """Capture rows from now on (someone listens) or not; IDs before a switch on are read back."""
        on = on and self._can_capture
        if on and not self.capturing:
            self._read_upto = max(self._read_upto, self.minimal_local_current_token(), self.last_token)
        self.capturing = on
        if not on:
            self._captured_tokens.clear()
            self._captured_rows.clear()

    def _drop_captured(self, upto: int) -> None:
        tokens = self._captured_tokens
        if tokens and min(tokens) <= upto:
            keep = [i for i, t in enumerate(tokens) if t > upto]
            self._captured_tokens = [tokens[i] for i in keep]
            self._captured_rows = [self._captured_rows[i] for i in keep]
