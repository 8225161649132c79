"""events: rooms, events and their JSON, the event graph, state groups, current state, memberships, redactions

Revision ID: events_0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision = "events_0001"
down_revision = None
branch_labels = ("events",)
depends_on = "fs_core_0001"

_TEXT = sa.Text
_BIG = sa.BigInteger


# Long by nature: one create_table per table of the plugin, in one revision (a list, not logic).
def upgrade() -> None:
    # One row per room this server holds events of: its version (which rules apply to its events);
    # ``writes`` counts the batches persisted into it (a writer's cached view of the room is valid
    # while the count is the one it last wrote); the last event a member may be shown (ranks a
    # user's rooms by recency).
    op.create_table(
        "rooms",
        sa.Column("room_id", _TEXT, primary_key=True),
        sa.Column("room_version", _TEXT, nullable=False),
        sa.Column("creator", _TEXT),
        sa.Column("is_local", sa.Boolean, nullable=False),
        sa.Column("created_ts", _BIG, nullable=False),
        sa.Column("writes", _BIG, nullable=False, server_default="0"),
        sa.Column("current_state_group", _BIG),
        sa.Column("last_stream_ordering", _BIG),
        sa.Column("last_event_id", _TEXT),
    )
    op.create_index("rooms_last_stream_ordering", "rooms", ["last_stream_ordering"])
    # One row per event: an index of event_json, not a copy of it. stream_ordering is the events
    # stream's ID (positive), or the backfill stream's (negative) for backfilled events; every event,
    # outliers included, has one. topological_ordering is the depth. state_group is the state after
    # the event (NULL for outliers); visibility the history visibility computed once, when stored.
    op.create_table(
        "events",
        sa.Column("event_id", _TEXT, primary_key=True),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("stream_ordering", _BIG, nullable=False),
        sa.Column("instance_name", _TEXT, nullable=False),
        sa.Column("topological_ordering", _BIG, nullable=False),
        sa.Column("type", _TEXT, nullable=False),
        sa.Column("state_key", _TEXT),
        sa.Column("sender", _TEXT, nullable=False),
        sa.Column("origin_server_ts", _BIG, nullable=False),
        sa.Column("received_ts", _BIG, nullable=False),
        sa.Column("outlier", sa.Boolean, nullable=False),
        sa.Column("backfilled", sa.Boolean, nullable=False),
        sa.Column("state_group", _BIG),
        sa.Column("visibility", _TEXT, nullable=False),
        sa.Column("membership", _TEXT),
        sa.Column("prev_membership", _TEXT),
        sa.Column("redacts", _TEXT),
        sa.Column("relates_to", _TEXT),
        sa.Column("redacted_by", _TEXT),
    )
    op.create_index("events_stream_ordering", "events", ["stream_ordering"], unique=True)
    op.create_index("events_instance", "events", ["instance_name", "stream_ordering"])
    op.create_index("events_room_topological", "events", ["room_id", "topological_ordering", "stream_ordering"])
    op.create_index("events_room_stream", "events", ["room_id", "stream_ordering"])
    # The bytes of each event exactly as received (or, for a local event, as this server wrote it).
    op.create_table(
        "event_json",
        sa.Column("event_id", _TEXT, primary_key=True),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("json", sa.LargeBinary, nullable=False),
    )
    # The event graph: one row per (event, prev_event); and the room's ends.
    op.create_table(
        "event_edges",
        sa.Column("event_id", _TEXT, nullable=False),
        sa.Column("prev_event_id", _TEXT, nullable=False),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.PrimaryKeyConstraint("event_id", "prev_event_id"),
    )
    op.create_index("event_edges_prev", "event_edges", ["prev_event_id"])
    for table in ("event_forward_extremities", "event_backward_extremities"):
        op.create_table(
            table,
            sa.Column("room_id", _TEXT, nullable=False),
            sa.Column("event_id", _TEXT, nullable=False),
            sa.PrimaryKeyConstraint("room_id", "event_id"),
        )
    # State groups: immutable states, one row each, stored as a delta against an ancestor (base),
    # see factstream_events.rules.statemath. parent is the state it was derived from (its lineage);
    # position the number of changes from the empty state along it; hash the multiset hash of the
    # whole state, unique per room (identical states are stored once).
    op.create_table(
        "state_groups",
        sa.Column("id", _BIG, primary_key=True),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("parent", _BIG),
        sa.Column("base", _BIG),
        sa.Column("position", _BIG, nullable=False),
        sa.Column("size", _BIG, nullable=False),
        sa.Column("hash", sa.LargeBinary, nullable=False),
        sa.Column("delta", sa.LargeBinary, nullable=False),
    )
    op.create_index("state_groups_room_hash", "state_groups", ["room_id", "hash"], unique=True)
    op.execute("CREATE SEQUENCE state_group_id_seq")
    # The room's current state, with the membership of member events; and one row per change of it,
    # at the events stream ID of the event that caused it (event_id NULL: the key was removed).
    op.create_table(
        "current_state_events",
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("type", _TEXT, nullable=False),
        sa.Column("state_key", _TEXT, nullable=False),
        sa.Column("event_id", _TEXT, nullable=False),
        sa.Column("membership", _TEXT),
        sa.PrimaryKeyConstraint("room_id", "type", "state_key"),
    )
    op.create_index(
        "current_state_members",
        "current_state_events",
        ["state_key", "room_id"],
        postgresql_where=sa.text("type = 'm.room.member'"),
    )
    op.create_table(
        "current_state_delta_stream",
        sa.Column("stream_id", _BIG, nullable=False),
        sa.Column("instance_name", _TEXT, nullable=False),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("type", _TEXT, nullable=False),
        sa.Column("state_key", _TEXT, nullable=False),
        sa.Column("event_id", _TEXT),
        sa.Column("prev_event_id", _TEXT),
    )
    op.create_index("current_state_delta_instance", "current_state_delta_stream", ["instance_name", "stream_id"])
    # Every membership event (not outliers' out-of-band ones only): whose, in which room, when.
    op.create_table(
        "room_memberships",
        sa.Column("event_id", _TEXT, primary_key=True),
        sa.Column("user_id", _TEXT, nullable=False),
        sa.Column("sender", _TEXT, nullable=False),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("membership", _TEXT, nullable=False),
        sa.Column("stream_ordering", _BIG, nullable=False),
        sa.Column("topological_ordering", _BIG, nullable=False),
        sa.Column("outlier", sa.Boolean, nullable=False),
    )
    op.create_index("room_memberships_user", "room_memberships", ["user_id", "stream_ordering"])
    op.create_index("room_memberships_room_user", "room_memberships", ["room_id", "user_id"])
    # Redaction events and their targets (a target may arrive later, or never).
    op.create_table(
        "redactions",
        sa.Column("event_id", _TEXT, primary_key=True),
        sa.Column("redacts", _TEXT, nullable=False),
        sa.Column("room_id", _TEXT, nullable=False),
        sa.Column("received_ts", _BIG, nullable=False),
        sa.Column("censored", sa.Boolean, nullable=False, server_default=sa.false()),
    )
    op.create_index("redactions_redacts", "redactions", ["redacts"])
    op.create_index("redactions_uncensored", "redactions", ["received_ts"], postgresql_where=sa.text("NOT censored"))
    # An outlier persisted again as a normal event enters the events stream at a new ID here (its
    # events.stream_ordering keeps the old one).
    op.create_table(
        "ex_outlier_stream",
        sa.Column("stream_id", _BIG, primary_key=True),
        sa.Column("instance_name", _TEXT, nullable=False),
        sa.Column("event_id", _TEXT, nullable=False),
    )
    op.create_index("ex_outlier_stream_instance", "ex_outlier_stream", ["instance_name", "stream_id"])
    # Idempotent local sends: one row per (user, endpoint and transaction ID: "send/<txn>", "redact/<txn>").
    op.create_table(
        "event_txn_ids",
        sa.Column("user_id", _TEXT, nullable=False),
        sa.Column("txn_id", _TEXT, nullable=False),
        sa.Column("request_hash", _TEXT, nullable=False),
        sa.Column("event_id", _TEXT, nullable=False),
        sa.Column("inserted_ts", _BIG, nullable=False),
        sa.PrimaryKeyConstraint("user_id", "txn_id"),
    )
    create_stream_sequence("events_stream_seq")
    create_stream_sequence("events_backfill_seq")


def downgrade() -> None:
    drop_stream_sequence("events_backfill_seq")
    drop_stream_sequence("events_stream_seq")
    op.execute("DROP SEQUENCE state_group_id_seq")
    for table in (
        "event_txn_ids",
        "ex_outlier_stream",
        "redactions",
        "room_memberships",
        "current_state_delta_stream",
        "current_state_events",
        "state_groups",
        "event_backward_extremities",
        "event_forward_extremities",
        "event_edges",
        "event_json",
        "events",
        "rooms",
    ):
        op.drop_table(table)
